"""What the project's Python sees: its version, torch, torch_npu and NPUs, probed in a subprocess.

Doctor never imports torch itself: importing it can fail (torch_npu auto-loads
since 2.5.1 and needs CANN) or take seconds, and the interpreter that matters
is the one the launch scripts run (`$PYTHON`, else `python3` on `PATH`). The
probe asks that interpreter, in a child process that may fail on its own.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import runtime

MARKER = "NPU_WIZARD_PROBE "
AUTOLOAD_FAILURE = "Failed to load the backend extension"
PROBE_TIMEOUT_S = 120

# Runs in the project's interpreter; argv[1] is where `runtime` can be imported from,
# so that a torch_npu failure is explained by the same words the ranks would print.
# It runs in / (PROBE_CWD): `python -c` puts its working folder first on sys.path, and an empty
# PYTHONPATH entry (CANN's set_env.sh leaves one) adds it again, so in the folder doctor runs in a
# module of the user's named like one the probe imports (platform.py) would be run: doctor reads
# the project's files, never runs them.
PROBE_CWD = "/"
PROBE = r"""
import sys
import importlib.util, json, platform
out = {"python": platform.python_version(), "executable": sys.executable}
try:
    import torch
except BaseException as error:
    out["torch_error"] = f"{type(error).__name__}: {error}"
else:
    out["torch"] = torch.__version__
    out["torch_cuda"] = torch.version.cuda
    if torch.version.cuda and torch.cuda.is_available():
        out["cuda_memory"] = torch.cuda.get_device_properties(0).total_memory
    if importlib.util.find_spec("torch_npu") is None:
        out["torch_npu_missing"] = True
    else:
        try:
            import torch_npu
        except BaseException as error:
            raw = f"{type(error).__name__}: {error}"
            out["torch_npu_error"] = raw
            sys.path.insert(0, sys.argv[1])
            from runtime.device import explain_torch_npu_error
            why = explain_torch_npu_error(error)
            suffix = f" ({raw})"
            out["torch_npu_fix"] = why[: -len(suffix)] if why.endswith(suffix) else why
        else:
            out["torch_npu"] = getattr(torch_npu, "__version__", "unknown")
            npu = getattr(torch, "npu", None) or torch_npu.npu
            out["npu_count"] = npu.device_count() if npu.is_available() else 0
print("NPU_WIZARD_PROBE " + json.dumps(out), flush=True)
"""


@dataclass(frozen=True)
class Software:
    """The interpreter the launch scripts use and what it can import; None where unknown."""

    python: str | None = None
    executable: str | None = None
    torch: str | None = None
    torch_error: str | None = None
    torch_cuda: str | None = None
    torch_npu: str | None = None
    torch_npu_missing: bool = False
    torch_npu_error: str | None = None
    torch_npu_fix: str | None = None
    npu_count: int | None = None
    cuda_memory: int | None = None  # bytes of CUDA device 0, where torch sees one
    autoload_error: str | None = None  # `import torch` failed while auto-loading torch_npu
    probe_error: str | None = None  # the probe itself could not run


def project_python(env: Mapping[str, str]) -> str | None:
    """The interpreter the launch scripts run: $PYTHON, else python3 on PATH."""
    chosen = env.get("PYTHON") or "python3"
    return shutil.which(chosen, path=env.get("PATH")) if "/" not in chosen else os.path.abspath(chosen)


def probe_software(env: Mapping[str, str]) -> Software:
    """Probe the project's interpreter; where `import torch` fails on torch_npu, probe again without it."""
    python = project_python(env)
    if python is None:
        return Software(probe_error=f"no {env.get('PYTHON') or 'python3'} on PATH")
    found = _probe(python, env)
    if found.torch_error and AUTOLOAD_FAILURE in found.torch_error:
        again = _probe(python, {**env, "TORCH_DEVICE_BACKEND_AUTOLOAD": "0"})
        fields = {**again.__dict__, "autoload_error": found.torch_error}
        return Software(**fields)
    return found


def _probe(python: str, env: Mapping[str, str]) -> Software:
    runtime_parent = str(Path(runtime.__file__).resolve().parent.parent)
    try:
        done = subprocess.run(
            [python, "-c", PROBE, runtime_parent],
            cwd=PROBE_CWD,
            env=dict(env),
            capture_output=True,
            text=True,
            timeout=PROBE_TIMEOUT_S,
        )
    except (OSError, subprocess.TimeoutExpired) as error:
        return Software(probe_error=f"{python} could not be run: {error}")
    for line in reversed(done.stdout.splitlines()):
        if line.startswith(MARKER):
            return Software(**json.loads(line[len(MARKER) :]))
    tail = (done.stderr.strip().splitlines() or [f"exit code {done.returncode}"])[-1]
    return Software(probe_error=f"{python} crashed while importing torch: {tail}")
