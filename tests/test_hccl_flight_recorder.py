"""torch_npu's flight recorder for ProcessGroupHCCL: which releases have it, how the launch script turns it on,
and how a rank reads it into its hang snapshot (runtime/stacks.py).

No NPU exists here: the rank runs on the torch_npu test double (tests/doubles), whose "hccl" backend is gloo
and whose dump calls answer in the format read in Ascend/pytorch's TraceUtils.h of each release branch.
"""

from __future__ import annotations

import json
import os
import pickle
import subprocess
import sys
from pathlib import Path

import pytest

from runtime import stacks
from tests.doubles.torch_npu_double import RELEASES, install_torch_npu_double, load_package
from tests.test_launch_scripts import fake_bin, recorded_env, render_project, run_node, script_env
from wizard.answers import hardware

ROOT = Path(__file__).resolve().parents[1]
SKIP_CHECKS = {"NPU_WIZARD_SKIP_PREFLIGHT": "1", "ASCEND_HOME_PATH": "/opt/cann-set-up-already"}
HCCL_VARIABLES = (
    "TORCH_HCCL_TRACE_BUFFER_SIZE",
    "TORCH_HCCL_ENABLE_MONITORING",
    "TORCH_HCCL_DUMP_ON_TIMEOUT",
    "TORCH_HCCL_HEARTBEAT_TIMEOUT_SEC",
    "TORCH_HCCL_DEBUG_INFO_TEMP_FILE",
    "TORCH_HCCL_DEBUG_INFO_PIPE_FILE",
)
# Read per tag in Ascend/pytorch (ProcessGroupHCCL.hpp, Init.cpp): the offered releases with the recorder.
WITH_RECORDER = {
    "2.12.0", "2.11.0", "2.10.0.post4", "2.9.0.post6", "2.7.1.post8", "2.9.0.post2", "2.8.0.post4",
    "2.7.1.post4", "2.9.0", "2.8.0.post2", "2.7.1.post2", "2.6.0.post5", "2.8.0", "2.7.1", "2.6.0.post3",
    "2.1.0.post17", "2.6.0", "2.5.1.post1", "2.1.0.post13", "2.1.0.post12",
}  # fmt: skip

# A rank of a one-rank "hccl" group: three all_reduce of 1000 float32 and a barrier, then its snapshot.
RANK = """
import json, os, sys, tempfile, time
import torch
import torch.distributed as dist
import torch_npu
from runtime import stacks
store = dist.FileStore(os.path.join(tempfile.mkdtemp(), "store"), 1)
dist.init_process_group("hccl", store=store, rank=0, world_size=1)
tensor = torch.zeros(1000)
for _ in range(3):
    dist.all_reduce(tensor)
dist.barrier()
# gloo retires a collective's entry just after the call returns: wait for the barrier's, in torch's own record
deadline = time.monotonic() + 60
while time.monotonic() < deadline:
    entries = json.loads(torch._C._distributed_c10d._dump_fr_trace_json(True, False)).get("entries", [])
    if len(entries) == 4 and all(entry.get("retired") for entry in entries):
        break
    time.sleep(0.05)
print(json.dumps(stacks.snapshot(0)))
"""


def test_the_offered_releases_with_the_hccl_flight_recorder() -> None:
    found = {version for version in hardware.TORCH_NPU_CANN if hardware.has_hccl_flight_recorder(version)}
    assert found == WITH_RECORDER


def test_the_double_offers_the_dump_calls_of_each_release() -> None:
    for version, release in RELEASES.items():
        assert bool(release.hccl_recorder) is hardware.has_hccl_flight_recorder(version), version


def rank_snapshot(tmp_path: Path, version: str, **env: str) -> tuple[dict, list[dict]]:
    """Run RANK on the torch_npu double of `version`: its snapshot, and the double's dump calls."""
    double = install_torch_npu_double(tmp_path, version)
    run_env = double.env(**env)
    run_env.pop("TORCH_FR_BUFFER_SIZE", None)
    run_env["PYTHONPATH"] = os.pathsep.join([run_env["PYTHONPATH"], str(ROOT)])
    run_env["TMPDIR"] = str(tmp_path)  # the rank's FileStore folder (mkdtemp) goes with the test's folder
    result = subprocess.run(
        [sys.executable, "-c", RANK], env=run_env, capture_output=True, text=True, timeout=120, cwd=tmp_path
    )
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout), double.hccl_trace_calls()


@pytest.mark.parametrize(
    ("version", "call"),
    [("2.9.0.post6", "_dump_hccl_trace_json"), ("2.1.0.post12", "_dump_hccl_trace")],
)
def test_a_hccl_rank_reads_torch_npu_s_recorder_into_its_snapshot(tmp_path: Path, version: str, call: str) -> None:
    record, calls = rank_snapshot(tmp_path, version, TORCH_HCCL_TRACE_BUFFER_SIZE="100")
    collectives = record["collectives"]
    assert (collectives["source"], collectives["backend"]) == ("torch_npu", "hccl")
    assert [entry["seq"] for entry in collectives["entries"]] == [1, 2, 3, 4]
    first = collectives["entries"][0]
    # torch_npu's recorder names no operation for a collective
    assert first == {
        "seq": 1, "op": stacks.UNKNOWN_OP, "group": "0", "sizes": [[1000]], "dtypes": ["Float"],
        "bytes": 4000, "state": "completed",
    }  # fmt: skip
    assert (collectives["last_entered"], collectives["last_completed"]) == (4, 4)
    assert json.loads(record["recorder_dump"])["entries"][0]["profiling_name"] == ""
    assert [entry["call"] for entry in calls] == [call]


def test_a_release_without_the_recorder_says_so(tmp_path: Path) -> None:
    torch_npu = load_package(tmp_path, "2.5.1")
    collectives, dump = stacks.hccl_recorder_entries(torch_npu, env={"TORCH_HCCL_TRACE_BUFFER_SIZE": "100"})
    assert collectives == {"source": None, "why": "torch_npu 2.5.1 has no HCCL flight recorder"}
    assert dump is None


def test_without_a_buffer_size_the_recorder_is_not_asked(tmp_path: Path) -> None:
    torch_npu = load_package(tmp_path, "2.9.0.post6")
    collectives, dump = stacks.hccl_recorder_entries(torch_npu, env={})
    assert collectives == {
        "source": None,
        "why": "TORCH_HCCL_TRACE_BUFFER_SIZE is 0 or unset (the launch script sets it)",
    }
    assert dump is None


def test_a_dump_in_torch_npu_s_json_format_reads_as_collectives() -> None:
    # the keys and values of TraceUtils.h's dump_json (version 2.4): pg_status values are strings
    entry = {
        "record_id": 6, "pg_id": 0, "process_group": ["0", "default_pg"], "collective_seq_id": 7,
        "p2p_seq_id": 0, "op_id": 7, "profiling_name": "", "time_created_ns": 1, "input_sizes": [[4, 256]],
        "input_dtypes": ["Half"], "output_sizes": [[4, 256]], "output_dtypes": ["Half"], "state": "scheduled",
        "time_discovered_started_ns": 0, "time_discovered_completed_ns": 0, "retired": False,
        "timeout_ms": 1836000, "is_p2p": False,
    }  # fmt: skip
    done = {**entry, "collective_seq_id": 6, "state": "completed", "retired": True}
    coalesced = {**done, "collective_seq_id": 5, "profiling_name": "hccl:all_reduce_coalesced"}
    dump = {"version": "2.4", "pg_config": {}, "pg_status": {}, "entries": [coalesced, done, entry]}
    collectives = stacks.read_dump(json.loads(json.dumps(dump)), backend="hccl", source="torch_npu")
    assert [(e["seq"], e["op"], e["state"], e["bytes"]) for e in collectives["entries"]] == [
        (5, "all_reduce_coalesced", "completed", 2048),
        (6, stacks.UNKNOWN_OP, "completed", 2048),
        (7, stacks.UNKNOWN_OP, "scheduled", 2048),
    ]
    assert (collectives["last_entered"], collectives["last_completed"]) == (7, 6)


class Rigged:
    """A pickle that would call a function when loaded."""

    def __reduce__(self) -> tuple:
        return (os.getcwd, ())


def test_a_pickled_dump_naming_code_is_refused_not_run() -> None:
    class Module:
        __version__ = "2.1.0.post12"

        class _C:
            class _distributed_c10d:
                @staticmethod
                def _dump_hccl_trace(*args: object) -> bytes:
                    return pickle.dumps({"entries": [Rigged()]}, protocol=2)

    collectives, dump = stacks.hccl_recorder_entries(Module, env={"TORCH_HCCL_TRACE_BUFFER_SIZE": "10"})
    assert collectives["source"] is None and "unexpected posix.getcwd" in collectives["why"]
    assert dump is None


def launch_env(
    tmp_path: Path, torch_npu: str, device: str = "npu", exec_timeout: int | None = None, **env: str
) -> tuple[dict[str, str], str, Path]:
    """The environment torchrun gets from node 0's script, its output, and the run folder."""
    versions = {"environment.torch_npu_version": torch_npu, "environment.torch_version": torch_npu.split(".post")[0]}
    if exec_timeout is not None:
        versions["network.exec_timeout"] = exec_timeout
    project = render_project(tmp_path, device=device, **versions)
    record = tmp_path / "record"
    record.mkdir()
    run_dir = tmp_path / "run"
    script = script_env(record, fake_bin(tmp_path, "torchrun"), NPU_WIZARD_RUN_DIR=str(run_dir), **SKIP_CHECKS)
    for name in HCCL_VARIABLES:
        script.pop(name, None)
    result = run_node(project, 0, {**script, **env})
    assert result.returncode == 0, result.stdout + result.stderr
    return recorded_env(record, "torchrun"), result.stdout, run_dir


def test_the_launch_script_turns_the_recorder_on_inside_the_run_folder(tmp_path: Path) -> None:
    env, _output, run_dir = launch_env(tmp_path, "2.9.0.post6")
    prefix = f"{run_dir}/hccl/rank-"
    assert {name: env.get(name) for name in HCCL_VARIABLES} == {
        "TORCH_HCCL_TRACE_BUFFER_SIZE": "2000",
        "TORCH_HCCL_ENABLE_MONITORING": "1",
        "TORCH_HCCL_DUMP_ON_TIMEOUT": "1",
        "TORCH_HCCL_HEARTBEAT_TIMEOUT_SEC": "600",
        "TORCH_HCCL_DEBUG_INFO_TEMP_FILE": prefix,
        "TORCH_HCCL_DEBUG_INFO_PIPE_FILE": prefix,
    }
    assert (run_dir / "hccl").is_dir() and list((run_dir / "hccl").iterdir()) == []


def test_the_heartbeat_timeout_is_set_below_a_small_exec_timeout(tmp_path: Path) -> None:
    env, _output, _run_dir = launch_env(tmp_path, "2.9.0.post6", exec_timeout=150)
    assert env["HCCL_EXEC_TIMEOUT"] == "150"
    assert env["TORCH_HCCL_HEARTBEAT_TIMEOUT_SEC"] == "135"


def test_the_heartbeat_timeout_stays_torch_npu_s_600_below_a_long_exec_timeout(tmp_path: Path) -> None:
    env, _output, _run_dir = launch_env(tmp_path, "2.9.0.post6", exec_timeout=1836)
    assert env["TORCH_HCCL_HEARTBEAT_TIMEOUT_SEC"] == "600"


def test_a_buffer_size_out_of_bounds_is_replaced_and_named(tmp_path: Path) -> None:
    env, output, _run_dir = launch_env(tmp_path, "2.6.0", TORCH_HCCL_TRACE_BUFFER_SIZE="50000000")
    assert env["TORCH_HCCL_TRACE_BUFFER_SIZE"] == "2000"
    assert "NOTE: TORCH_HCCL_TRACE_BUFFER_SIZE=50000000 is not a whole number up to 100000: using 2000" in output


def test_a_buffer_size_from_the_environment_is_kept(tmp_path: Path) -> None:
    env, _output, _run_dir = launch_env(tmp_path, "2.1.0.post12", TORCH_HCCL_TRACE_BUFFER_SIZE="500")
    assert env["TORCH_HCCL_TRACE_BUFFER_SIZE"] == "500"


@pytest.mark.parametrize(("torch_npu", "device"), [("2.5.1", "npu"), ("2.9.0.post6", "cpu")])
def test_no_recorder_variables_without_the_recorder_or_on_the_cpu(tmp_path: Path, torch_npu: str, device: str) -> None:
    env, _output, run_dir = launch_env(tmp_path, torch_npu, device)
    assert [name for name in HCCL_VARIABLES if name in env] == []
    assert not (run_dir / "hccl").exists()


def test_a_dump_is_asked_for_through_torch_npu_s_pipe_without_blocking(tmp_path: Path) -> None:
    prefix = f"{tmp_path}/rank-"
    env = {"TORCH_HCCL_DEBUG_INFO_PIPE_FILE": prefix, "TORCH_HCCL_DEBUG_INFO_TEMP_FILE": prefix}
    assert stacks.ask_hccl_dump(3, env) == f"{prefix}3.pipe does not exist (torch_npu's monitor did not start)"
    os.mkfifo(f"{prefix}3.pipe")
    assert stacks.ask_hccl_dump(3, env) == f"{prefix}3.pipe cannot be written: No such device or address"
    # torch_npu's monitor holds the pipe open for reading, without blocking (DumpPipe: O_RDONLY | O_NONBLOCK)
    reader = os.open(f"{prefix}3.pipe", os.O_RDONLY | os.O_NONBLOCK)
    try:
        assert stacks.ask_hccl_dump(3, env) == f"asked through {prefix}3.pipe: torch_npu writes {prefix}3"
        assert os.read(reader, 128) == b"1\n"
    finally:
        os.close(reader)
    assert stacks.ask_hccl_dump(3, {}) == "TORCH_HCCL_DEBUG_INFO_PIPE_FILE is unset: torch_npu has no dump pipe"


def test_a_link_or_a_regular_file_in_place_of_the_pipe_is_never_written(tmp_path: Path) -> None:
    prefix = f"{tmp_path}/hccl/rank-"
    (tmp_path / "hccl").mkdir()
    env = {"TORCH_HCCL_DEBUG_INFO_PIPE_FILE": prefix}
    somefile = tmp_path / "somefile"
    somefile.write_bytes(b"private data\n")
    os.symlink(somefile, f"{prefix}3.pipe")
    assert stacks.ask_hccl_dump(3, env) == f"{prefix}3.pipe is a symbolic link, not a pipe: nothing written"
    Path(f"{prefix}4.pipe").write_bytes(b"plain\n")
    assert stacks.ask_hccl_dump(4, env) == f"{prefix}4.pipe is not a pipe: nothing written"
    assert somefile.read_bytes() == b"private data\n"
    assert Path(f"{prefix}4.pipe").read_bytes() == b"plain\n"


def test_a_size_that_is_no_number_leaves_the_bytes_unknown_not_the_snapshot_broken() -> None:
    entries = [
        {"collective_seq_id": 1, "pg_id": 0, "input_sizes": [[4, None]], "input_dtypes": ["Float"]},
        {"collective_seq_id": 2, "pg_id": 0, "input_sizes": [["four", 2]], "input_dtypes": ["Float"]},
        {"collective_seq_id": 3, "pg_id": 0, "input_sizes": [[4, 2]], "input_dtypes": ["Float"]},
    ]
    collectives = stacks.read_dump({"entries": entries}, backend="hccl", source="torch_npu")
    assert [(e["seq"], e["bytes"]) for e in collectives["entries"]] == [(1, None), (2, None), (3, 32)]
