"""Test double that makes one rank run out of memory for real: on PYTHONPATH with OOM_AT_STEP set, the rank
named by OOM_RANK (default 0), at its first logged step from OOM_AT_STEP on, caps its address space at
OOM_LIMIT_BYTES (default 64 MiB) above what it maps then and allocates until the allocation fails with a real
MemoryError.

tests/test_memory_runs.py puts this folder on the PYTHONPATH of a runner and its ranks (the variables are
named NPU_WIZARD_TEST_OOM_*); it wraps runtime.memory.window, which the generated train.py calls once per
logged step, as that module is imported. Nothing of it ships in a project.
"""

import importlib.abc
import importlib.machinery
import os
import re
import resource
import sys

PREFIX = "NPU_WIZARD_TEST_OOM_"
CHUNK = 16 * 2**20


def run_out_if_asked(rank: int, step: int) -> None:
    """Allocate past the limit for real at the asked step, on the asked rank."""
    at_step = os.environ.get(PREFIX + "AT_STEP")
    if not at_step or step < int(at_step) or rank != int(os.environ.get(PREFIX + "RANK", "0")):
        return
    limit = int(os.environ.get(PREFIX + "LIMIT_BYTES", 64 * 2**20))
    with open("/proc/self/status") as status:
        mapped = int(re.search(r"^VmSize:\s+(\d+) kB", status.read(), re.MULTILINE).group(1)) * 1024
    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    resource.setrlimit(resource.RLIMIT_AS, (mapped + limit, hard))
    held = []
    try:
        while True:
            held.append(bytearray(CHUNK))  # MemoryError once past the limit
    finally:
        held.clear()
        resource.setrlimit(resource.RLIMIT_AS, (soft, hard))


class _WrapWindow(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Finds runtime.memory as usual, then wraps its window() to run out of memory when asked."""

    def find_spec(self, name, path, target=None):  # noqa: ANN001, ANN201
        if name != "runtime.memory":
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is None:
            return None
        self._loader = spec.loader
        spec.loader = self
        return spec

    def create_module(self, spec):  # noqa: ANN001, ANN201
        return None

    def exec_module(self, module):  # noqa: ANN001, ANN201
        self._loader.exec_module(module)
        window = module.window

        def asked(device, model, optimizer, rank=0, step=0):  # noqa: ANN001, ANN202
            run_out_if_asked(rank, step)
            return window(device, model, optimizer, rank, step)

        module.window = asked


if os.environ.get(PREFIX + "AT_STEP"):
    sys.meta_path.insert(0, _WrapWindow())
