"""Doctor's software and device checks: Python, torch, torch_npu, CANN, visible NPUs."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from runtime import cann
from runtime.checks import FAIL, PASS, SKIP, WARN, Result
from runtime.preflight import parse_visible_devices
from wizard.answers import hardware
from wizard.answers.model import Answers
from wizard.doctor.probe import Software

MIN_PYTHON = (3, 10)  # train.py's annotations (`int | None`) are evaluated at import
MIN_CPU_TORCH = (2, 1)  # requirements.txt of a CPU project
DETAIL_CHARS = 160


def check_python(software: Software) -> Result:
    """The launch scripts' interpreter exists and is new enough for train.py."""
    if software.python is None:
        return Result(
            "python",
            FAIL,
            software.probe_error or "not found",
            "install Python 3.10+, or set PYTHON to the interpreter the launch scripts should use",
        )
    version = tuple(int(part) for part in software.python.split(".")[:2])
    where = f"{software.python} ({software.executable})"
    if version < MIN_PYTHON:
        return Result("python", FAIL, f"{where}: train.py needs 3.10+", "use Python 3.10+ (set PYTHON to it)")
    return Result("python", PASS, where)


def check_torch(software: Software, answers: Answers, requirements: str = "requirements.txt") -> Result:
    """torch imports, and is the release the project pins (any 2.1+ for CPU simulation); `requirements` pins it."""
    if software.python is None:
        return Result("torch", SKIP, "no interpreter to ask")
    if software.torch is None:
        error = _short(software.torch_error or software.probe_error or "not importable")
        return Result(
            "torch",
            FAIL,
            f"import torch: {error}",
            f"{software.executable} -m pip install -r {requirements}, or set PYTHON to the Python that has torch",
        )
    installed = software.torch.split("+")[0]
    note = " (import torch alone fails: see torch_npu)" if software.autoload_error else ""
    if answers["device"] == "cpu":
        parsed = hardware.parse_version(installed)
        if parsed is not None and parsed[:2] < MIN_CPU_TORCH:
            return Result("torch", WARN, f"{installed}: older than 2.1", f"pip install -r {requirements}")
        return Result("torch", PASS, f"{software.torch} (CPU simulation runs on any torch 2.1+){note}")
    pinned = answers["environment.torch_version"]
    if hardware.base_version(installed) != hardware.base_version(pinned):
        return Result(
            "torch",
            WARN,
            f"{installed} installed, the project pins {pinned}{note}",
            f"pip install torch=={pinned} (the CPU build on x86_64), or render again with this node's versions",
        )
    return Result("torch", PASS, f"{software.torch}, as pinned{note}")


def check_torch_npu(software: Software, answers: Answers) -> Result:
    """torch_npu imports (in the probe), pairs with torch, and is the release the project pins."""
    device, pinned = answers["device"], answers["environment.torch_npu_version"]
    if software.torch is None:
        return Result("torch_npu", SKIP, "torch does not import")
    if device == "cpu":
        if software.torch_npu_missing:
            return Result("torch_npu", SKIP, "not installed; not needed for device cpu")
        if software.torch_npu:
            return Result("torch_npu", PASS, f"{software.torch_npu} (unused on device cpu)")
    # on cpu and auto a broken torch_npu is worth knowing, not fatal: the launch scripts
    # set TORCH_DEVICE_BACKEND_AUTOLOAD=0 for cpu, and auto falls back
    failed = FAIL if device == "npu" else WARN
    if software.autoload_error:
        return Result(
            "torch_npu",
            failed,
            f"`import torch` fails: {_short(software.autoload_error)}",
            f"{software.torch_npu_fix or 'fix the torch_npu install'}; "
            "or set TORCH_DEVICE_BACKEND_AUTOLOAD=0 where torch_npu is not wanted",
        )
    if software.torch_npu_missing:
        torch = answers["environment.torch_version"]
        return Result(
            "torch_npu",
            failed,
            "not installed",
            f"pip install torch=={torch} torch-npu=={pinned} pyyaml setuptools (torch first)",
        )
    if software.torch_npu is None:
        return Result(
            "torch_npu",
            failed,
            f"import torch_npu: {_short(software.torch_npu_error or 'failed')}",
            software.torch_npu_fix or "check the CANN and torch_npu install",
        )
    return _pairing(software.torch_npu, software.torch, pinned)


def _pairing(installed: str, torch: str, pinned: str) -> Result:
    """torch_npu X.Y.Z[.postN] needs torch X.Y.Z; it should be the release the project pins."""
    need = hardware.base_version(installed)
    if hardware.base_version(torch.split("+")[0]) != need:
        return Result(
            "torch_npu",
            FAIL,
            f"{installed} needs torch {need}, but torch is {torch}",
            f"pip install torch=={need} (the CPU build on x86_64), then reinstall torch-npu=={installed}",
        )
    cann = hardware.cann_for(installed)
    built_for = f", built for CANN {cann}" if cann else ""
    if installed != pinned:
        pinned_cann = hardware.cann_for(pinned)
        return Result(
            "torch_npu",
            WARN,
            f"{installed} installed{built_for}; the project pins {pinned}"
            + (f" (CANN {pinned_cann})" if pinned_cann else ""),
            "use one torch_npu and CANN on every node: install the pinned one, or render again with this one",
        )
    return Result("torch_npu", PASS, f"{installed}, pairs with torch {torch}{built_for}")


def check_cann_files(answers: Answers, env: Mapping[str, str], install_info: Path = cann.INSTALL_INFO) -> Result:
    """The CANN set_env.sh the launch scripts would source: CANN_SET_ENV or the answer, then the known places."""
    found, tried = cann.find_set_env(answers["environment.cann_set_env"], env, install_info)
    return cann.check_cann(answers["device"], found, env, tried)


def check_devices(software: Software, answers: Answers, env: Mapping[str, str]) -> Result:
    """Enough NPUs visible for one process per device (ASCEND_RT_VISIBLE_DEVICES as the runtime reads it)."""
    device, needed = answers["device"], answers["devices_per_node"]
    if device == "cpu":
        return Result("devices", SKIP, f"device cpu: {needed} process(es) share the CPU")
    failed = FAIL if device == "npu" else WARN
    visible = env.get("ASCEND_RT_VISIBLE_DEVICES")
    ids: tuple[int, ...] | None = None
    if visible:
        try:
            ids = parse_visible_devices(visible)
        except ValueError as error:
            return Result("devices", FAIL, str(error), "e.g. export ASCEND_RT_VISIBLE_DEVICES=0,1,2,3")
    count = software.npu_count
    shown = f"ASCEND_RT_VISIBLE_DEVICES={visible}" if visible else "all devices visible"
    if count is None and ids is None:
        return Result("devices", SKIP, "cannot count NPUs until torch_npu loads")
    if count is None:
        count = len(ids or ())
        shown += " (not confirmed: torch_npu does not load)"
    if count < needed:
        return Result(
            "devices",
            failed,
            f"{count} NPU(s) visible ({shown}), the node runs {needed} processes, one per device",
            "widen ASCEND_RT_VISIBLE_DEVICES, free the devices (npu-smi info), or lower devices_per_node",
        )
    if answers["hardware"] == "atlas-training" and needed in (2, 4) and ids is not None:
        used = ids[:needed]
        if min(used) < 4 <= max(used):
            return Result(
                "devices",
                FAIL,
                f"devices {', '.join(map(str, used))} span the card groups 0-3 and 4-7 ({shown})",
                "pick devices within one group, e.g. ASCEND_RT_VISIBLE_DEVICES=0,1,2,3 or 4,5,6,7",
            )
    return Result("devices", PASS, f"{count} NPU(s) visible ({shown}), {needed} used")


def _short(text: str) -> str:
    line = text.strip().splitlines()[0] if text.strip() else text
    return line if len(line) <= DETAIL_CHARS else line[: DETAIL_CHARS - 3] + "..."
