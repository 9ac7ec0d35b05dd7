"""`npu-wizard bundle RUN`: one archive of a real failed 2 x 2 CPU run, bounded, secret-free, opened with tar.

One real run (a user's env:// script whose rank 3 raises, through `npu-wizard run`) is shared by every test
here; the tests that need a changed run folder bundle a copy of it.
"""

from __future__ import annotations

import json
import os
import pickle
import secrets
import shutil
import subprocess
import sys
import tarfile
from importlib import metadata
from pathlib import Path
from typing import Any, NamedTuple

import pytest

from runtime.provenance import REDACTED
from tests.runs import node_env
from tests.test_cann_version import fake_toolkit
from tests.test_user_script import render_own, run_to_the_end

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("bundle-failed-run")]  # one worker makes failed_run once

PLANTED = "planted-secret-7f3a"  # a secret value the test plants; it must never reach a bundle


class FailedRun(NamedTuple):
    project: Path
    run_dir: Path
    output: str
    token: str
    pids: dict[int, int]


@pytest.fixture(scope="module")
def failed_run(tmp_path_factory: pytest.TempPathFactory) -> FailedRun:
    project = render_own(tmp_path_factory.mktemp("bundle"), args=("--fail-rank", "3"))
    token = f"tok{secrets.token_hex(16)}"
    toolkit = fake_toolkit(tmp_path_factory.mktemp("cann"), info="version=8.0.RC2\n")
    env = node_env(
        project / "runs" / "unused",
        ASCEND_HOME_PATH=str(toolkit),  # a CANN set up in the shell: its release goes into versions.json
        NPU_WIZARD_STATUS_TOKEN=token,  # the run's token, as node 0's runner hands it to every rank
        MY_API_KEY=PLANTED,
        NPU_WIZARD_TEST_API_KEY=PLANTED,  # recorded with the rank's NPU_WIZARD_ variables: only its name may be
    )
    code, output, run_dir, left = run_to_the_end(project, env)
    assert code == 3 and not left, output
    # lines that print secrets, as a user's script or a launcher might (planted by this test)
    with (run_dir / "logs" / "rank-1.log").open("a") as log:
        log.write(f"env: {{'MY_API_KEY': '{PLANTED}', 'NPU_WIZARD_STATUS_TOKEN': '{token}'}}\n")
        log.write(f"export NPU_WIZARD_STATUS_TOKEN={token}\n")
    # what the hang collector writes, bundled when there; on a loaded machine the runner may have collected stacks
    # itself before the failure ended the job, so the folder may exist already
    (run_dir / "hang").mkdir(exist_ok=True)
    (run_dir / "hang" / "rank-0.txt").write_text(f"Thread main\n  File train.py, line 9\nMY_API_KEY={PLANTED}\n")
    pids = {}
    for rank in range(4):
        for line in (run_dir / "events" / f"rank-{rank}.jsonl").read_text().splitlines():
            event = json.loads(line)
            if event["event"] == "started":
                pids[rank] = event["pid"]
    assert len(pids) == 4
    return FailedRun(project, run_dir, output, token, pids)


def cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """npu-wizard as a user runs it, in an environment without the run's secrets."""
    clean = {k: v for k, v in os.environ.items() if k not in ("NPU_WIZARD_STATUS_TOKEN", "MY_API_KEY")}
    return subprocess.run(
        [sys.executable, "-m", "wizard", *args],
        capture_output=True,
        text=True,
        timeout=300,
        env={**clean, **(env or {})},
    )


def bundle_of(run_dir: Path, out: Path, env: dict[str, str] | None = None) -> dict[str, bytes]:
    """Bundle `run_dir` into `out`, open it with tar, and return its members by name below the top folder."""
    done = cli("bundle", str(run_dir), "-o", str(out), env=env)
    assert done.returncode == 0, done.stderr
    assert done.stdout == f"bundle: {out}\n"
    listed = subprocess.run(["tar", "tzf", str(out)], capture_output=True, text=True, check=True).stdout.split()
    (top,) = {name.split("/")[0] for name in listed}
    assert top.startswith("bundle-")
    with tarfile.open(out) as tar:
        return {m.name.split("/", 1)[1]: tar.extractfile(m).read() for m in tar.getmembers() if m.isfile()}


def manifest_missing(members: dict[str, bytes]) -> dict[str, str]:
    text = members["MANIFEST.txt"].decode()
    missing = text.split("Missing, and why:\n", 1)[1].splitlines()
    return dict(line.strip().split(": ", 1) for line in missing if ": " in line)


def test_run_prints_the_bundle_command_after_the_failure(failed_run: FailedRun) -> None:
    assert f"for whoever must help: npu-wizard bundle {failed_run.run_dir}\n" in failed_run.output


def test_the_bundle_opens_with_tar_and_holds_what_a_helper_needs(failed_run: FailedRun, tmp_path: Path) -> None:
    members = bundle_of(failed_run.run_dir, tmp_path / "b.tar.gz")
    expected = {
        "MANIFEST.txt",
        "run.json",
        "summary.json",
        "answers.yaml",
        "versions.json",
        "environment.json",
        "doctor.json",
        "hang/rank-0.txt",
        *(f"events/rank-{r}.jsonl" for r in range(4)),
        *(f"logs/rank-{r}.log" for r in range(4)),
        "logs/node-0.log",
        "logs/node-1.log",
    }
    assert expected <= members.keys()
    assert json.loads(members["summary.json"])["failure"]["rank"] == 3
    assert "RuntimeError: rank 3: the loss went wrong" in members["logs/rank-3.log"].decode()
    assert members["answers.yaml"] == (failed_run.project / "answers.yaml").read_bytes()
    assert json.loads(members["doctor.json"])["project"] == "own-ddp"
    import torch

    versions = json.loads(members["versions.json"])
    assert set(versions) == {f"rank {r}" for r in range(4)}
    assert versions["rank 3"]["torch"] in (torch.__version__, metadata.version("torch"))
    assert versions["rank 3"]["python"] == ".".join(map(str, sys.version_info[:3]))
    assert versions["rank 3"]["torch_npu"] is None
    assert (Path(versions["rank 3"]["cann"]).name, versions["rank 3"]["cann_version"]) == ("latest", "8.0.RC2")
    environment = json.loads(members["environment.json"])
    assert environment["rank 2"]["NPU_WIZARD_RUN_DIR"] == str(failed_run.run_dir)
    assert environment["rank 2"]["NPU_WIZARD_STATUS_TOKEN"] == REDACTED
    assert environment["rank 2"]["NPU_WIZARD_TEST_API_KEY"] == REDACTED
    assert "MY_API_KEY" not in environment["rank 2"]  # not an HCCL_, ASCEND_ or NPU_WIZARD_ variable
    missing = manifest_missing(members)
    assert missing["bandwidth.json"] == "written only by npu-wizard run --bandwidth"
    assert missing["report.html"].startswith("not drawn yet")
    assert missing["host/npu-smi"] == "npu-smi is not on this host's PATH (not an NPU host)"
    assert missing["host/hccn_tool"] == "hccn_tool is not on this host's PATH (not an NPU host)"
    assert missing["plog/"].startswith("no plog file of this host's ranks' pids under ")
    included = members["MANIFEST.txt"].decode().split("In this bundle:\n", 1)[1].split("\n\n", 1)[0]
    assert {line.split(" (", 1)[0].strip() for line in included.splitlines()} == members.keys() - {"MANIFEST.txt"}


def test_no_secret_is_anywhere_in_the_archive(failed_run: FailedRun, tmp_path: Path) -> None:
    out = tmp_path / "b.tar.gz"
    members = bundle_of(failed_run.run_dir, out)
    import gzip

    whole = gzip.decompress(out.read_bytes())
    # the run folder holds them (the test's planted lines, at least): the bundle took them out
    assert failed_run.token.encode() in (failed_run.run_dir / "logs" / "rank-1.log").read_bytes()
    for secret in (failed_run.token.encode(), PLANTED.encode()):
        assert secret not in whole
    log = members["logs/rank-1.log"].decode()
    assert f"'MY_API_KEY': '{REDACTED}'" in log and f"NPU_WIZARD_STATUS_TOKEN={REDACTED}" in log
    assert f"MY_API_KEY={REDACTED}" in members["hang/rank-0.txt"].decode()
    assert "start left out" not in members["MANIFEST.txt"].decode()  # shorter for a secret taken out, not cut


def test_report_still_works_after_bundling_and_its_page_is_bundled(failed_run: FailedRun, tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    shutil.copytree(failed_run.run_dir, run_dir)
    done = cli("bundle", str(run_dir))
    assert done.returncode == 0, done.stderr
    (written,) = run_dir.glob("bundle-*.tar.gz")
    assert done.stdout == f"bundle: {written}\n"
    report = cli("report", str(run_dir))
    assert report.returncode == 0, report.stderr
    assert (run_dir / "report.html").is_file()
    members = bundle_of(run_dir, tmp_path / "again.tar.gz")
    assert members["report.html"] == (run_dir / "report.html").read_bytes()
    assert "report.html" not in manifest_missing(members)


def test_a_big_log_or_events_file_is_bundled_as_its_tail_with_a_note(failed_run: FailedRun, tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    shutil.copytree(failed_run.run_dir, run_dir)
    with (run_dir / "logs" / "rank-0.log").open("a") as log:
        for line in range(200_000):
            log.write(f"line {line} of a chatty rank\n")
    size = (run_dir / "logs" / "rank-0.log").stat().st_size
    with (run_dir / "events" / "rank-0.jsonl").open("a") as events:  # a long run: its started event far back
        for step in range(60_000):
            events.write(json.dumps({"schema": 1, "event": "heartbeat", "time": 1.0, "rank": 0, "step": step}) + "\n")
    members = bundle_of(run_dir, tmp_path / "b.tar.gz")
    assert json.loads(members["events/rank-0.jsonl"].splitlines()[-1])["step"] == 59_999
    assert json.loads(members["events/rank-0.jsonl"].splitlines()[0])["event"] == "heartbeat"  # its tail
    assert set(json.loads(members["versions.json"])) == {f"rank {r}" for r in range(4)}  # read from its head
    kept = members["logs/rank-0.log"]
    assert len(kept) <= 2 * 1024 * 1024 + 200 < size
    assert kept.startswith(b"[npu-wizard bundle: only the tail of this file")
    assert kept.endswith(b"line 199999 of a chatty rank\n")
    assert f"of {size} bytes (the start left out)" in members["MANIFEST.txt"].decode()


def test_torch_npu_s_recorder_dumps_are_bundled_as_json_and_its_pipe_is_named(
    failed_run: FailedRun, tmp_path: Path
) -> None:
    run_dir = tmp_path / "run"
    shutil.copytree(failed_run.run_dir, run_dir)
    (run_dir / "hccl").mkdir()
    # what torch_npu's monitor writes at a timeout (TraceUtils.h's pickled dump, ProcessGroupHCCL.cpp's stacks)
    entry = {"collective_seq_id": 12, "profiling_name": "", "input_sizes": ((1000,),), "state": "scheduled"}
    frames = [{"name": "train", "filename": f"/home/u/MY_API_KEY={PLANTED}/train.py", "line": 9}]
    dump = {"version": "2.4", "pg_config": {}, "entries": [{**entry, "frames": frames}]}
    (run_dir / "hccl" / "rank-3").write_bytes(pickle.dumps(dump, protocol=2))
    (run_dir / "hccl" / "rank-3_py_traceback").write_text("pid: 4242\nthread MainThread:\n  File train.py, line 9\n")
    os.mkfifo(run_dir / "hccl" / "rank-3.pipe")
    members = bundle_of(run_dir, tmp_path / "b.tar.gz")
    bundled = json.loads(members["hccl/rank-3.json"])
    assert bundled["entries"][0]["collective_seq_id"] == 12 and bundled["entries"][0]["input_sizes"] == [[1000]]
    assert PLANTED.encode() not in members["hccl/rank-3.json"]
    assert members["hccl/rank-3_py_traceback"].startswith(b"pid: 4242\n")
    assert manifest_missing(members)["hccl/rank-3.pipe"].startswith("torch_npu's pipe that asks a rank for a dump")


def recording_double(folder: Path, name: str, says: str) -> None:
    """A test double of an NPU host tool: records its arguments, prints `says`."""
    script = folder / name
    script.write_text(f'#!/bin/sh\necho "$*" >> "{folder}/{name}.calls"\necho "{says}"\n')
    script.chmod(0o755)


def test_on_an_npu_host_the_ranks_plogs_and_the_tools_outputs_are_bundled(
    failed_run: FailedRun, tmp_path: Path
) -> None:
    doubles = tmp_path / "doubles"
    doubles.mkdir()
    recording_double(doubles, "npu-smi", "npu-smi double: 910B healthy")
    recording_double(doubles, "hccn_tool", "hccn_tool double: link status: UP")
    plogs = tmp_path / "ascend-log" / "debug" / "plog"
    plogs.mkdir(parents=True)
    pid = failed_run.pids[1]
    for stamp in ("20261127100000001", "20261127100000002", "20261127100000003"):
        (plogs / f"plog-{pid}_{stamp}.log").write_text(f"[ERROR] HCCL {stamp} PASSWORD={PLANTED}\n")
        os.utime(plogs / f"plog-{pid}_{stamp}.log", (int(stamp[-1]), int(stamp[-1])))
    (plogs / "plog-1_20261127100000009.log").write_text("another process's plog\n")
    env = {"PATH": f"{doubles}:{os.environ['PATH']}", "ASCEND_PROCESS_LOG_PATH": str(tmp_path / "ascend-log")}
    members = bundle_of(failed_run.run_dir, tmp_path / "b.tar.gz", env=env)
    assert members["host/npu-smi-info.txt"] == b"npu-smi double: 910B healthy\n"
    for device in (0, 1):  # each local rank's device of this host
        assert members[f"host/hccn_tool-{device}-link.txt"] == b"hccn_tool double: link status: UP\n"
    assert sorted((doubles / "hccn_tool.calls").read_text().splitlines()) == [
        "-i 0 -ip -g",
        "-i 0 -link -g",
        "-i 1 -ip -g",
        "-i 1 -link -g",
    ]
    assert (doubles / "npu-smi.calls").read_text() == "info\n"
    bundled = sorted(name for name in members if name.startswith("plog/"))
    assert bundled == [f"plog/debug-plog-{pid}_20261127100000002.log", f"plog/debug-plog-{pid}_20261127100000003.log"]
    assert PLANTED.encode() not in b"".join(members.values())
    assert not {"host/npu-smi", "host/hccn_tool", "plog/"} & manifest_missing(members).keys()


def bad_inputs(failed_run: FailedRun, tmp_path: Path) -> dict[str, tuple[list[str], str, Path]]:
    copy = tmp_path / "copy"
    shutil.copytree(failed_run.run_dir, copy)
    fifo, linked, zero = (tmp_path / name for name in ("fifo", "linked", "zero"))
    for folder in (fifo, linked, zero):
        shutil.copytree(failed_run.run_dir, folder)
    os.mkfifo(fifo / "logs" / "rank-9.log")
    (linked / "logs" / "rank-9.log").symlink_to("/etc/passwd")
    (zero / "summary.json").unlink()
    (zero / "summary.json").symlink_to("/dev/zero")
    (tmp_path / "plain").mkdir()
    (tmp_path / "plain" / "notes.txt").write_text("not a run\n")
    taken = tmp_path / "taken.tar.gz"
    taken.write_text("the user's file\n")
    return {
        "no such folder": ([str(tmp_path / "nowhere")], f"{tmp_path / 'nowhere'}: no such run folder", tmp_path),
        "not a run": ([str(tmp_path / "plain")], "is not a run folder", tmp_path / "plain"),
        "-o there": ([str(copy), "-o", str(taken)], f"{taken} is there already", copy),
        "fifo": ([str(fifo)], f"{fifo / 'logs' / 'rank-9.log'} is a FIFO, not a regular file", fifo),
        "link": ([str(linked)], f"{linked / 'logs' / 'rank-9.log'} is a symbolic link, not a regular file", linked),
        "dev zero": ([str(zero)], f"{zero / 'summary.json'} is a symbolic link, not a regular file", zero),
    }


@pytest.mark.parametrize("case", ["no such folder", "not a run", "-o there", "fifo", "link", "dev zero"])
def test_bad_input_gets_one_line_exit_1_and_nothing_written(failed_run: FailedRun, tmp_path: Path, case: str) -> None:
    args, said, folder = bad_inputs(failed_run, tmp_path)[case]
    before = snapshot(tmp_path)
    done = cli("bundle", *args)
    assert (done.returncode, done.stdout) == (1, ""), done.stderr
    assert len(done.stderr.splitlines()) == 1 and said in done.stderr, done.stderr
    assert snapshot(tmp_path) == before
    assert not list(folder.glob("bundle-*")) if folder.is_dir() else True


def test_force_replaces_an_existing_file(failed_run: FailedRun, tmp_path: Path) -> None:
    taken = tmp_path / "taken.tar.gz"
    taken.write_text("the user's file\n")
    done = cli("bundle", str(failed_run.run_dir), "-o", str(taken), "--force")
    assert done.returncode == 0, done.stderr
    with tarfile.open(taken) as tar:
        assert any(name.endswith("/MANIFEST.txt") for name in tar.getnames())
    assert sorted(p.name for p in tmp_path.iterdir()) == ["taken.tar.gz"]


def snapshot(folder: Path) -> dict[str, Any]:
    """Every path below `folder` with its size (links and FIFOs as such), to tell that nothing was written."""
    found: dict[str, Any] = {}
    for path in sorted(folder.rglob("*")):
        found[str(path)] = "link" if path.is_symlink() else (path.stat().st_size if path.is_file() else "other")
    return found


def test_a_ranks_recorded_environment_is_bounded_and_keeps_no_secret() -> None:
    from runtime.provenance import MAX_VALUE, MAX_VARIABLES, environment

    env = {"PATH": "/bin", "HCCL_IF_IP": "10.0.0.1", "ASCEND_DB_PASSWORD": PLANTED, "ASCEND_HUGE": "x" * 10**6}
    env.update({f"HCCL_Z_{n:04d}": "v" for n in range(1000)})
    recorded = environment(env)
    assert len(recorded) == MAX_VARIABLES and "PATH" not in recorded
    assert recorded["ASCEND_DB_PASSWORD"] == REDACTED
    assert recorded["ASCEND_HUGE"] == "x" * MAX_VALUE
    assert recorded["HCCL_IF_IP"] == "10.0.0.1"
