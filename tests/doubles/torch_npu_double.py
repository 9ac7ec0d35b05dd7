"""A test double of torch_npu (no NPU exists here), version-aware, installed into a folder.

How to use it:

    from tests.doubles.torch_npu_double import install_torch_npu_double

    double = install_torch_npu_double(tmp_path, "2.4.0.post2")
    env = double.env(base_env)          # PATH gets its torch_npu_run, PYTHONPATH its torch_npu
    subprocess.run(["bash", "launch/node0.sh"], env=env, ...)
    double.runs()                       # each torch_npu_run call: {"argv", "env", "version"}
    double.scaler_calls()               # what torch_npu.npu.amp.GradScaler was asked

`torch_npu_run` parses its argv the way that release's
`torch_npu/distributed/run.py` does: the installed torch's torchrun flags
(`get_args_parser()`), plus `--enable_tiered_parallel_tcpstore` only on the
releases that define it; an unknown flag exits 2 with argparse's
"unrecognized arguments", as the release would. Then it records the call and
exits 0, or, with `TORCH_NPU_DOUBLE_RUN=torchrun` in its environment, runs the
workers through the real torchrun with the environment that release's agent
gives its workers (its parallel store itself is not modelled). The flags come
from a copy of torch's parser recorded once per test process from the Python
the double runs on (`torchrun_flags`), so a call that only records imports no
torch (tests/doubles/torch_npu_run_program.py).

`import torch_npu` in a process with `double.env()` gets the double's package
(`tests/doubles/torch_npu_package.py`): `__version__`, `npu.is_available`,
`npu.device_count` (`TORCH_NPU_DOUBLE_DEVICES`, default 8), `npu.set_device`,
`npu.set_compile_mode`, `npu.synchronize`, `npu.Event` (timing from the host clock) and
`npu.amp.GradScaler`, each recording its call, and `profiler` (`profile`,
`schedule`, `tensorboard_trace_handler`, `_ExperimentalConfig` with the
arguments every offered release takes; `async_mode` only where the release
has it), recording each call under profiler.jsonl; `import torchair` gets the
double of TorchAir, torch_npu's graph backend (`tests/doubles/torchair_package.py`).
In-process tests can `load_package(version)` instead.

Where torch is importable, importing the double registers an "hccl" process
group backend that runs on gloo (the CPU), so `init_process_group("hccl")`
works here. On the releases with ProcessGroupHCCL's flight recorder
(`Release.hccl_recorder`), `torch_npu._C._distributed_c10d` has that
release's dump calls; they answer in torch_npu's format (Ascend/pytorch,
TraceUtils.h: version "2.4", pg_config, pg_status, entries with an empty
profiling_name), built from torch's own recorder of the gloo collectives,
which records only when TORCH_HCCL_TRACE_BUFFER_SIZE > 0, as the real one.
"""

from __future__ import annotations

import functools
import importlib.util
import json
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

PACKAGE_SOURCE = Path(__file__).with_name("torch_npu_package.py")
TORCHAIR_SOURCE = Path(__file__).with_name("torchair_package.py")
RUN_SOURCE = Path(__file__).with_name("torch_npu_run_program.py")
RECORD_ENV = "TORCH_NPU_DOUBLE_RECORD"
RUN_ENV = "TORCH_NPU_DOUBLE_RUN"


@dataclass(frozen=True)
class Release:
    """What one torch_npu release offers that the generated projects depend on."""

    version: str
    torch: str  # the torch it requires (torch==X.Y.Z)
    cann: str  # the CANN it pairs with (ASCEND.md)
    branch: str  # its Ascend/pytorch release branch
    has_torch_npu_run: bool  # the console script (2.1.0.post8 / 2.3.1.post2 / 2.4.0 on)
    tiered_store_flag: bool  # torch_npu_run --enable_tiered_parallel_tcpstore (the 7.0.0 branches on)
    parallel_store_env: bool  # workers get TORCH_NPU_USE_PARALLEL_TCPSTORE=True (the 7.1.0 branches on)
    torchair_reduce_overhead: bool  # TorchAir's CompilerConfig has mode, reduce-overhead too (the 7.0.0 branches on)
    # torch_npu.profiler.tensorboard_trace_handler(async_mode=...): parses in a child process (the 7.0.0 branches on)
    profiler_async_parse: bool
    # ProcessGroupHCCL's flight recorder dump: "" none (6.0.0 branches, and 2.3.1 / 2.4.0 / 2.5.1 of 7.0.0),
    # "pickle" only _dump_hccl_trace (v2.1.0-7.0.0), "json" also _dump_hccl_trace_json (7.1.0 branches on)
    hccl_recorder: str = ""


# Checked per branch in Ascend/pytorch: torch_npu/distributed/run.py (flags) and
# torch_npu/distributed/rendezvous.py (the environment the agent sets); the pinned
# third_party/torchair's python/torchair/configs/compiler_config.py (TorchAir's modes).
RELEASES: dict[str, Release] = {
    release.version: release
    for release in (
        Release("2.1.0.post10", "2.1.0", "8.0.0", "v2.1.0-6.0.0", True, False, False, False, False),
        Release("2.1.0.post12", "2.1.0", "8.1.RC1", "v2.1.0-7.0.0", True, True, False, True, True, "pickle"),
        Release("2.4.0.post2", "2.4.0", "8.0.0", "v2.4.0-6.0.0", True, False, False, False, False),
        Release("2.5.1", "2.5.1", "8.1.RC1", "v2.5.1-7.0.0", True, True, False, True, True),
        Release("2.6.0", "2.6.0", "8.2.RC1", "v2.6.0-7.1.0", True, True, True, True, True, "json"),
        Release("2.9.0.post6", "2.9.0", "9.1.0", "v2.9.0-26.1.0", True, True, True, True, True, "json"),
    )
}


@dataclass(frozen=True)
class TorchNpuDouble:
    """An installed double: `bin/torch_npu_run`, `site/torch_npu/`, and its record folder."""

    release: Release
    root: Path

    @property
    def bin_dir(self) -> Path:
        """The folder to put first on PATH (holds torch_npu_run)."""
        return self.root / "bin"

    @property
    def site_dir(self) -> Path:
        """The folder to put first on PYTHONPATH (holds the torch_npu package double)."""
        return self.root / "site"

    @property
    def record_dir(self) -> Path:
        """Where every call is recorded, one JSON line per call."""
        return self.root / "record"

    def env(self, base: dict[str, str] | None = None, **extra: str) -> dict[str, str]:
        """`base` (default os.environ) with the double first on PATH and PYTHONPATH."""
        env = dict(os.environ if base is None else base)
        env["PATH"] = os.pathsep.join(filter(None, [str(self.bin_dir), env.get("PATH")]))
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(self.site_dir), env.get("PYTHONPATH")]))
        env[RECORD_ENV] = str(self.record_dir)
        env.update(extra)
        return env

    def runs(self) -> list[dict[str, Any]]:
        """Each accepted torch_npu_run call: its argv, environment and release."""
        return _read_jsonl(self.record_dir / "torch_npu_run.jsonl")

    def rejected(self) -> list[dict[str, Any]]:
        """Each torch_npu_run call the release refused (argv and argparse's message)."""
        return _read_jsonl(self.record_dir / "torch_npu_run.rejected.jsonl")

    def scaler_calls(self) -> list[dict[str, Any]]:
        """What each torch_npu.npu.amp.GradScaler was asked, in order."""
        return _read_jsonl(self.record_dir / "grad_scaler.jsonl")

    def npu_calls(self) -> list[dict[str, Any]]:
        """set_device / set_compile_mode calls on torch_npu.npu, in order."""
        return _read_jsonl(self.record_dir / "npu.jsonl")

    def profiler_calls(self) -> list[dict[str, Any]]:
        """torch_npu.profiler calls (profile, schedule, tensorboard_trace_handler, start, step, stop), in order."""
        return _read_jsonl(self.record_dir / "profiler.jsonl")

    def hccl_trace_calls(self) -> list[dict[str, Any]]:
        """Each call of the HCCL flight recorder's dump (_dump_hccl_trace_json / _dump_hccl_trace), in order."""
        return _read_jsonl(self.record_dir / "hccl_trace.jsonl")

    def torchair_calls(self) -> list[dict[str, Any]]:
        """TorchAir's get_npu_backend calls and each graph its backend compiled, in order."""
        return _read_jsonl(self.record_dir / "torchair.jsonl")

    def event_calls(self) -> list[dict[str, Any]]:
        """torch_npu.npu.Event calls (made, record, elapsed_time, synchronize, query), in order."""
        return _read_jsonl(self.record_dir / "npu_event.jsonl")


def install_torch_npu_double(root: Path, version: str, python: str = sys.executable) -> TorchNpuDouble:
    """Install the double of torch_npu `version` under `root`; torch_npu_run runs on `python`."""
    release = RELEASES[version]
    double = TorchNpuDouble(release, Path(root) / f"torch_npu_double-{version}")
    package = double.site_dir / "torch_npu"
    package.mkdir(parents=True, exist_ok=True)
    double.record_dir.mkdir(exist_ok=True)
    double.bin_dir.mkdir(exist_ok=True)
    shutil.copyfile(PACKAGE_SOURCE, package / "__init__.py")
    (package / "release.json").write_text(json.dumps(release.__dict__))
    # every release here ships TorchAir inside torch_npu; `import torchair` finds the double's
    torchair = double.site_dir / "torchair"
    torchair.mkdir(exist_ok=True)
    shutil.copyfile(TORCHAIR_SOURCE, torchair / "__init__.py")
    (torchair / "release.json").write_text(json.dumps(release.__dict__))
    if release.has_torch_npu_run:
        shutil.copyfile(RUN_SOURCE, double.root / "torch_npu_run_program.py")
        (double.root / "torchrun_flags.json").write_text(torchrun_flags(python))
        script = double.bin_dir / "torch_npu_run"
        script.write_text(
            f"#!{python}\n"
            f"# torch_npu_run of the torch_npu test double, release {version}\n"
            "import sys\n"
            f"sys.path.insert(0, {str(double.root)!r})\n"
            "from torch_npu_run_program import main\n"
            f"sys.exit(main({str(double.root)!r}))\n"
        )
        script.chmod(0o755)
    return double


# Prints torchrun's parser as JSON: its description, and each action's options, dest, kind, nargs, type by
# name, default, choices, help and metavar. The kinds the double rebuilds: torch's env and check_env actions,
# help, and a plain store, each with a type it knows; any other ("other") is handed to torch's own parser when
# a command line uses it.
# Run without the PET_* variables, so the defaults are the parser's own.
DUMP_TORCHRUN_FLAGS = """
import argparse, json
from torch.distributed.run import get_args_parser
parser = get_args_parser()
TYPES = {None, "str", "int", "float", "comma_separated_list"}
def kind(action):
    if isinstance(action, argparse._HelpAction):
        return "help"
    name = type(action).__name__
    typed = getattr(action.type, "__name__", action.type) in TYPES
    if name in ("env", "check_env") and typed:
        return name
    if type(action) is argparse._StoreAction and typed:
        return "store"
    return "other"
actions = [
    {
        "options": list(action.option_strings),
        "dest": action.dest,
        "kind": kind(action),
        "nargs": action.nargs,
        "type": getattr(action.type, "__name__", None),
        "default": action.default,
        "choices": list(action.choices) if action.choices is not None else None,
        "required": action.required,
        "help": action.help,
        "metavar": action.metavar,
    }
    for action in parser._actions
]
print(json.dumps({"allow_abbrev": parser.allow_abbrev, "description": parser.description, "actions": actions}))
"""


def torchrun_flags(python: str | None = None) -> str:
    """torchrun's flags as the torch of `python` (default: this one) defines them, as JSON."""
    return _torchrun_flags(python or sys.executable)


@functools.cache
def _torchrun_flags(python: str) -> str:
    """Recorded once per test process and Python; an error names what failed (no torch there)."""
    env = {name: value for name, value in os.environ.items() if not name.startswith("PET_")}
    result = subprocess.run(
        [python, "-c", DUMP_TORCHRUN_FLAGS], env=env, capture_output=True, text=True, timeout=300, check=False
    )
    if result.returncode != 0:
        return json.dumps({"error": f"could not read torchrun's flags from {python}: {result.stderr.strip()}"})
    return result.stdout


def load_package(root: Path, version: str) -> ModuleType:
    """The double's torch_npu package for `version`, imported in this process (not as torch_npu)."""
    double = install_torch_npu_double(root, version)
    path = double.site_dir / "torch_npu" / "__init__.py"
    spec = importlib.util.spec_from_file_location(f"torch_npu_double_{version.replace('.', '_')}", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _read_jsonl(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
