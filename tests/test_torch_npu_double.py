"""The torch_npu test double itself: each release's torch_npu_run flags, what it records.

The double stands in for torch_npu where no NPU exists (tests/doubles). These
tests pin that it refuses what the real release refuses, so that tests using
it to run launch scripts cannot pass on a flag the release would reject.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.doubles.torch_npu_double import (
    RELEASES,
    TorchNpuDouble,
    install_torch_npu_double,
    load_package,
    torchrun_flags,
)
from wizard.answers import hardware

BASE_FLAGS = [
    "--nnodes", "2", "--node-rank", "1", "--nproc-per-node", "2",
    "--master-addr", "127.0.0.1", "--master-port", "29500", "--max-restarts", "0",
]  # fmt: skip
TIERED = "--enable_tiered_parallel_tcpstore=true"


def torch_npu_run(
    tmp_path: Path, version: str, *args: str, **env: str
) -> tuple[subprocess.CompletedProcess[str], TorchNpuDouble]:
    """Run the double's torch_npu_run of `version` with `args` before train.py."""
    double = install_torch_npu_double(tmp_path, version)
    argv = ["torch_npu_run", *args, "train.py", "--launcher", "torch-npu-run"]
    result = subprocess.run(argv, env=double.env(**env), capture_output=True, text=True, timeout=120)
    return result, double


@pytest.mark.parametrize("version", ["2.1.0.post10", "2.4.0.post2", "2.5.1", "2.9.0.post6"])
def test_every_release_accepts_the_torchrun_flags_and_records_the_call(tmp_path: Path, version: str) -> None:
    result, double = torch_npu_run(tmp_path, version, *BASE_FLAGS)
    assert result.returncode == 0, result.stderr
    [run] = double.runs()
    assert run["argv"] == [*BASE_FLAGS, "train.py", "--launcher", "torch-npu-run"]
    assert run["version"] == version
    assert run["worker_env"]["TORCH_NPU_ELASTIC_USE_AGENT_STORE"] == "True"


@pytest.mark.parametrize(
    ("version", "known"),
    [("2.1.0.post10", False), ("2.4.0.post2", False), ("2.1.0.post12", True), ("2.5.1", True), ("2.9.0.post6", True)],
)
def test_the_tiered_store_flag_exists_only_from_the_7_0_0_branches(tmp_path: Path, version: str, known: bool) -> None:
    result, double = torch_npu_run(tmp_path, version, *BASE_FLAGS, TIERED)
    if known:
        assert result.returncode == 0, result.stderr
        assert double.rejected() == []
    else:
        assert result.returncode == 2
        assert "torch_npu_run: error: unrecognized arguments: --enable_tiered_parallel_tcpstore=true" in result.stderr
        assert [entry["code"] for entry in double.rejected()] == [2]
        assert double.runs() == []


def test_a_release_for_torch_2_1_refuses_options_later_torchrun_added(tmp_path: Path) -> None:
    result, _double = torch_npu_run(tmp_path, "2.1.0.post10", *BASE_FLAGS, "--local-ranks-filter", "0")
    assert result.returncode == 2
    assert "unrecognized arguments: --local-ranks-filter" in result.stderr


@pytest.mark.parametrize(("version", "parallel"), [("2.5.1", False), ("2.6.0", True), ("2.9.0.post6", True)])
def test_workers_see_the_parallel_store_from_7_1_0(tmp_path: Path, version: str, parallel: bool) -> None:
    _result, double = torch_npu_run(tmp_path, version, *BASE_FLAGS)
    assert ("TORCH_NPU_USE_PARALLEL_TCPSTORE" in double.runs()[0]["worker_env"]) is parallel


# argv that torch's parser takes, refuses for an unknown flag, a value of the wrong type or a missing
# script, or reads from PET_* variables; each is parsed by both parsers below
ARGVS = [
    [*BASE_FLAGS, "train.py", "--lr", "0.1"],
    ["--standalone", "--nproc_per_node=4", "train.py"],
    ["--nnodes=1:2", "--rdzv-backend", "c10d", "--rdzv-endpoint", "h:1", "--rdzv-conf", "a=1", "-m", "pkg.train"],
    ["--max-restarts", "three", "train.py"],
    ["--no-such-flag", "train.py"],
    ["--local-ranks-filter", "0,1", "--log-dir", "logs", "-r", "3", "-t", "3", "train.py"],
    ["--duplicate-stdout-filters", "a,,b,c", "train.py"],
    [*BASE_FLAGS, TIERED, "train.py"],
    ["--nproc-per", "2", "train.py"],
    [*BASE_FLAGS],
    ["-h"],
    ["--print-completion", "bash", "train.py"],
    ["--print-completion", "tcsh", "train.py"],
]


def parse(parser: Any, argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[str, Any]:
    """What a parser makes of `argv`: ("parsed", its values) or ("exit", its code, its output and errors)."""
    try:
        return "parsed", vars(parser.parse_args(argv))
    except SystemExit as leaving:
        printed = capsys.readouterr()
        return "exit", (leaving.code, printed.out, printed.err)


def replay(program: Any, flags: dict[str, Any], release: dict[str, Any], argv: list[str], capsys: Any) -> Any:
    """What the double's torch_npu_run makes of `argv`: the recorded copy, or torch's parser where it hands over."""
    try:
        return parse(program.recorded_parser(flags, release), argv, capsys)
    except program.UseTorchsParser:
        return parse(program.torch_parser(release), argv, capsys)


@pytest.mark.parametrize("version", ["2.1.0.post10", "2.9.0.post6"])
def test_the_recorded_flags_parse_every_argv_as_torchs_own_parser_does(
    tmp_path: Path, version: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    pytest.importorskip("torch")
    program = load_program(tmp_path, version)
    release = json.loads((tmp_path / f"torch_npu_double-{version}" / "site" / "torch_npu" / "release.json").read_text())
    flags = json.loads(torchrun_flags())
    kinds = {action["kind"] for action in flags["actions"]}
    assert {"env", "check_env", "help", "store"} <= kinds <= {"env", "check_env", "help", "store", "other"}
    monkeypatch.setenv("COLUMNS", "100")  # the usage and help text are wrapped to the terminal
    for pet in ({}, {"PET_NNODES": "3", "PET_STANDALONE": "1", "PET_MAX_RESTARTS": "2"}):
        for name, value in pet.items():
            monkeypatch.setenv(name, value)
        for argv in ARGVS:
            theirs = parse(program.torch_parser(release), argv, capsys)
            assert replay(program, flags, release, argv, capsys) == theirs, (argv, pet)
    assert parse(program.recorded_parser(flags, release), ["train.py"], capsys)[1]["nnodes"] == "3"


def load_program(tmp_path: Path, version: str) -> Any:
    """The double's torch_npu_run program as installed for `version`, imported in this process."""
    install_torch_npu_double(tmp_path, version)
    path = tmp_path / f"torch_npu_double-{version}" / "torch_npu_run_program.py"
    spec = importlib.util.spec_from_file_location(f"torch_npu_run_program_{version.replace('.', '_')}", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_a_call_that_only_records_imports_no_torch(tmp_path: Path) -> None:
    # a recording call runs in every launch-matrix test: importing torch there cost about 2 CPU s each
    double = install_torch_npu_double(tmp_path, "2.9.0.post6")
    program = double.root / "torch_npu_run_program.py"
    code = (
        "import runpy, sys; sys.argv = ['torch_npu_run', *sys.argv[1:]]; "
        f"sys.path.insert(0, {str(double.root)!r}); import torch_npu_run_program as p; "
        f"code = p.main({str(double.root)!r}); print(code, 'torch' in sys.modules)"
    )
    result = subprocess.run(
        [sys.executable, "-c", code, *BASE_FLAGS, "train.py"], env=double.env(), capture_output=True, text=True
    )
    assert result.stdout.split() == ["0", "False"], result.stderr
    assert program.exists() and len(double.runs()) == 1


def test_import_torch_npu_gets_the_double_of_the_installed_release(tmp_path: Path) -> None:
    double = install_torch_npu_double(tmp_path, "2.4.0.post2")
    code = "import torch_npu; print(torch_npu.__version__, torch_npu.npu.device_count()); torch_npu.npu.set_device(3)"
    result = subprocess.run(
        ["python3", "-c", code], env=double.env(TORCH_NPU_DOUBLE_DEVICES="4"), capture_output=True, text=True
    )
    assert result.stdout.split() == ["2.4.0.post2", "4"], result.stderr
    assert double.npu_calls() == [{"call": "set_device", "index": 3}]


def test_the_grad_scaler_records_what_it_is_asked_and_keeps_dynamic_in_its_state(tmp_path: Path) -> None:
    torch = pytest.importorskip("torch")
    torch_npu = load_package(tmp_path, "2.9.0.post6")
    scaler = torch_npu.npu.amp.GradScaler(init_scale=8.0, dynamic=False)
    model = torch.nn.Linear(2, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    scaler.scale(model(torch.ones(1, 2)).sum()).backward()
    scaler.step(optimizer)
    scaler.update()
    assert [call["call"] for call in scaler.calls] == ["__init__", "scale", "step", "unscale_", "update"]
    assert scaler.calls[0]["dynamic"] is False
    state = scaler.state_dict()
    assert state["dynamic"] is False and state["scale"] == 8.0
    restored = torch_npu.npu.amp.GradScaler()
    with pytest.raises(KeyError):
        restored.load_state_dict({k: v for k, v in state.items() if k != "dynamic"})
    restored.load_state_dict(state)
    assert restored.state_dict() == state


def test_the_release_table_agrees_with_the_wizards_facts() -> None:
    assert {"2.1.0.post10", "2.4.0.post2", "2.5.1", "2.9.0.post6"} <= set(RELEASES)
    for version, release in RELEASES.items():
        assert release.cann == hardware.cann_for(version), version
        assert release.has_torch_npu_run == hardware.has_torch_npu_run(version), version
        assert release.tiered_store_flag == hardware.has_tiered_store_flag(version), version
        assert release.torchair_reduce_overhead == hardware.has_torchair_reduce_overhead(version), version
        assert release.profiler_async_parse == hardware.has_profiler_async_parse(version), version
        assert hardware.base_version(version) == release.torch, version


def test_loading_the_double_in_this_process_leaves_its_environment_alone(tmp_path: Path) -> None:
    # test_runtime_amp loads the double here: a TORCH_FR_BUFFER_SIZE=0 it set at import reached every process
    # the xdist worker started after it (a Slurm job's ranks then recorded no collectives)
    before = dict(os.environ)
    load_package(tmp_path, "2.9.0.post6")
    assert dict(os.environ) == before
