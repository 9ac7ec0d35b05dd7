"""Why is it stuck: at a real hang, every rank's stack and collective land in RUN/hang/ (issue 28, section 3).

One 2 x 2 CPU run through `npu-wizard run` per kind of script, the generated
train.py and a user's own env:// script, hangs four times on purpose
(tests/hang_runs.py); every test only reads the folders it left. The ranks are
started by the shell launcher: the hangs are the ranks', and a torchrun agent
would only add a process that imports torch on each node:

(a) one rank sleeps before the backward of step K: its last collective is
    #N-1, the three others wait in #N, each at the right file and line;
(b) one rank calls a barrier where the others all_reduce: both operations at
    the same sequence number;
(c) one rank SIGSTOPped: named as not answering, with its state T;
(d) every rank stuck in the same data-loading line, outside any collective.
"""

from __future__ import annotations

import html
import json
import shutil
import signal
from pathlib import Path

import pytest

from tests.hang_runs import BARRIER_RANK, LATE_RANK, STOPPED_RANK, HangRun, own_script_project, run_hangs
from tests.runs import render_cpu
from wizard.cli import main
from wizard.monitor.hang_records import Frame
from wizard.monitor.hang_verdict import users_frame

pytestmark = pytest.mark.slow
RANKS = range(4)


def hang_run_of(tmp: Path, kind: str) -> HangRun:
    """The four hangs of one 2 x 2 run (shell launcher) of the generated train.py, or of a user's own script."""
    if kind == "generated":
        project = render_cpu(tmp, "shell", nodes=2, samples=4096, epochs=1, log_every=2)
    else:
        project = own_script_project(tmp, render_cpu, "shell")
    return run_hangs(project, tmp / "release", "--all-nodes")


@pytest.fixture(scope="session")
def generated_hang_run(tmp_path_factory: pytest.TempPathFactory) -> HangRun:
    """The generated train.py's run. Its readers carry the xdist_group mark "hang-run-generated"."""
    return hang_run_of(tmp_path_factory.mktemp("hang-generated"), "generated")


@pytest.fixture(scope="session")
def own_hang_run(tmp_path_factory: pytest.TempPathFactory) -> HangRun:
    """The user's own script's run. Its readers carry the xdist_group mark "hang-run-own"."""
    return hang_run_of(tmp_path_factory.mktemp("hang-own"), "own")


@pytest.fixture(
    params=[
        pytest.param("generated", marks=pytest.mark.xdist_group("hang-run-generated")),
        pytest.param("own", marks=pytest.mark.xdist_group("hang-run-own")),
    ]
)
def hang_run(request: pytest.FixtureRequest) -> HangRun:
    """Each kind of script's run, made once per session."""
    return request.getfixturevalue(f"{request.param}_hang_run")


def script_of(run: HangRun) -> Path:
    """The script the ranks ran."""
    own = run.project / "own_train.py"
    return own if own.exists() else run.project / "train.py"


def line_of(path: Path, code: str) -> int:
    """The number of the one line of `path` that holds `code`."""
    (number,) = [n for n, line in enumerate(path.read_text().splitlines(), 1) if code in line]
    return number


def main_frames(record: dict) -> list[dict]:
    """The main thread's frames, outermost first."""
    (main,) = [thread for thread in record["threads"] if thread["main"]]
    return main["frames"]


def script_frame(record: dict, script: Path) -> tuple[str, int, str]:
    """(file, line, function) of the innermost frame of the main thread in the script itself."""
    frame = [f for f in main_frames(record) if f["file"] == str(script)][-1]
    return frame["file"], frame["line"], frame["function"]


def pending(record: dict) -> list[dict]:
    """The collectives the rank entered and has not completed."""
    return [entry for entry in record["collectives"]["entries"] if entry["state"] != "completed"]


def test_a_late_rank_last_completed_the_collective_the_others_wait_in(hang_run: HangRun) -> None:
    records = {rank: hang_run.record("late", rank) for rank in RANKS}
    assert all(record["answered"] for record in records.values())
    waiting = [rank for rank in RANKS if rank != LATE_RANK]
    (seq,) = {records[rank]["collectives"]["last_entered"] for rank in waiting}
    for rank in waiting:
        assert [(e["seq"], e["op"]) for e in pending(records[rank])] == [(seq, "all_reduce")]
    late = records[LATE_RANK]["collectives"]
    assert (late["last_entered"], late["last_completed"], pending(records[LATE_RANK])) == (seq - 1, seq - 1, [])


def loop_frames(script: Path) -> tuple[str, ...]:
    """The functions of the script that run the forward and the backward: the user's main; the generated
    Trainer's _run_step (each micro-batch's forward, then self._backward) and _backward (loss.backward())."""
    return ("main",) if script.name == "own_train.py" else ("_run_step", "_backward")


def test_a_late_rank_and_the_waiting_ones_are_at_the_right_file_and_line(hang_run: HangRun) -> None:
    script = script_of(hang_run)
    own = script.name == "own_train.py"
    backward = line_of(script, "loss.backward()")
    # before the backward: the generated script's forward block, or the user's own wait
    before = '        if PLAN.get(step) == "sleep":' if own else "with self.timer.forward()"
    late = [(line_of(script, before) + (1 if own else 0), "main" if own else "_run_step")]
    waiting = (
        [(backward, "main")]
        if own
        else [(line_of(script, "self._backward(loss"), "_run_step"), (backward, "_backward")]
    )
    at = {}
    for rank in RANKS:
        frames = [f for f in main_frames(hang_run.record("late", rank)) if f["file"] == str(script)]
        at[rank] = [(f["line"], f["function"]) for f in frames if f["function"] in loop_frames(script)]
    assert at == {rank: late if rank == LATE_RANK else waiting for rank in RANKS}
    assert f'File "{script}", line {backward}' in hang_run.text("late", 0)


def test_a_barrier_against_all_reduce_shows_both_operations_at_one_sequence_number(hang_run: HangRun) -> None:
    records = {rank: hang_run.record("barrier", rank) for rank in RANKS}
    ops = {rank: [(e["seq"], e["op"]) for e in pending(record)] for rank, record in records.items()}
    ((seq, op),) = ops[BARRIER_RANK]
    assert op == "barrier"
    assert {rank: ops[rank] for rank in RANKS if rank != BARRIER_RANK} == {
        rank: [(seq, "all_reduce")] for rank in RANKS if rank != BARRIER_RANK
    }


def test_a_stopped_rank_is_named_as_not_answering_with_its_state(hang_run: HangRun) -> None:
    collected = hang_run.collected("stopped")
    assert (collected["reason"], collected["not_answered"]) == ("asked", [STOPPED_RANK])
    record = hang_run.record("stopped", STOPPED_RANK)
    assert (record["answered"], record["state"]) == (False, "T (stopped)")
    assert isinstance(record["pid"], int) and record["host"]
    assert "SIGCONT" in record["note"] and "not resumed" in record["note"]
    assert not (hang_run.folders["stopped"] / f"rank-{STOPPED_RANK}.txt").exists()


def test_every_rank_stuck_loading_data_is_outside_any_collective_at_one_line(hang_run: HangRun) -> None:
    records = [hang_run.record("data", rank) for rank in RANKS]
    assert hang_run.collected("data")["reason"] == "hang"
    assert all(record["answered"] and not pending(record) for record in records)
    script = script_of(hang_run)
    own = script.name == "own_train.py"
    loader = line_of(script, "= load_batch(step)" if own else "for micro_batches in optimizer_steps(batches")
    function = "main" if own else "_run_epoch"
    # one line for every rank, the one a hang names: the innermost frame of the user's own code. The innermost frame
    # of all lies in the rehearsed loader's wait loop, and a rank asked while it looked for its release file (at the
    # loop's next line, or inside pathlib, as one was beside stress-ng) is at another line there.
    places = {users_frame([Frame(f["file"], f["line"], f["function"]) for f in main_frames(r)]) for r in records}
    assert len(places) == 1 and None not in places, places
    for record in records:  # the loop over the batches, in the script, is on every rank's stack
        at = {(f["line"], f["function"]) for f in main_frames(record) if f["file"] == str(script)}
        assert (loader, function) in at


def test_each_answer_comes_with_its_text_and_its_recorder_dump_bounded(hang_run: HangRun) -> None:
    for case in ("data", "late", "barrier"):
        for rank in RANKS:
            for name in (f"rank-{rank}.json", f"rank-{rank}.txt", f"rank-{rank}.fr.json"):
                size = (hang_run.folders[case] / name).stat().st_size
                assert 0 < size <= 2 << 20, (case, name, size)
            # the recorder's own dump, as JSON a reader of torch's flight recorder takes
            dump = json.loads((hang_run.folders[case] / f"rank-{rank}.fr.json").read_text())
            assert dump["entries"] and "pg_status" in dump, (case, rank)
    assert "recorder_dump" not in hang_run.record("late", 0)


def test_the_run_is_interrupted_after_the_last_hang_and_says_so(hang_run: HangRun) -> None:
    assert hang_run.code == 128 + signal.SIGINT, hang_run.output[-2000:]


def test_the_plain_view_gives_the_verdict_of_each_hang_in_words(hang_run: HangRun) -> None:
    script = script_of(hang_run).name
    verdicts = [line for line in hang_run.output.splitlines() if line.startswith("WHERE EACH RANK IS: ")]
    # a user's script is silent while it imports torch: a loaded machine may flag that first, more than once. The
    # ranks answer such a collection when they can, steps later (beside stress-ng, all four answered from the sleep
    # after step 3), so what its verdict says tells nothing: what tells it from a hang during training is when the
    # runner asked, before every rank's first step (its collected.json, read as the run went). Every other verdict
    # is one of the four planned: no hang is flagged during the training but the three planned ones.
    assert len(verdicts) == 4 + len(hang_run.start_up), (verdicts, sorted(hang_run.start_up), hang_run.training_at)
    data, stopped, late, barrier = verdicts[-4:]
    assert f"no rank is in a collective: ranks 0-3 are at {script}:" in data
    assert f"rank {STOPPED_RANK} did not answer (pid " in stopped and "state T (stopped))" in stopped
    assert "never entered #" in late and f"rank {LATE_RANK} never entered" in late
    assert f"called from {script}:{line_of(script_of(hang_run), 'loss.backward()')} (loss.backward())" in late
    assert f"rank {BARRIER_RANK} waits in barrier #" in barrier and "the collectives differ at #" in barrier


def test_monitor_stacks_asks_the_running_runner_and_prints_where_each_rank_is(hang_run: HangRun) -> None:
    asked = hang_run.stacks_asked
    assert asked is not None and asked.returncode == 0, asked
    lines = asked.stdout.splitlines()
    assert lines[0].startswith("asked the runner (pid ") and lines[0].endswith("waiting at most 60s")
    (verdict,) = [line for line in lines if line.startswith("WHERE EACH RANK IS: ")]
    assert f"rank {STOPPED_RANK} did not answer (pid " in verdict and "state T (stopped))" in verdict
    assert lines[-1] == f"stacks and collectives of every rank in {hang_run.run_dir / 'hang'}"


# ---- the verdict where a user reads it, on this run (the rest: tests/test_hang_report.py) ----------------------


@pytest.mark.xdist_group("hang-run-generated")
def test_a_real_hung_runs_summary_output_and_report_carry_its_last_verdict(
    generated_hang_run: HangRun, tmp_path: Path
) -> None:
    run = generated_hang_run  # its last hang: a barrier where the others all_reduce (tests/hang_runs.py)
    hang = json.loads((run.run_dir / "summary.json").read_text())["hang"]
    assert f"rank {BARRIER_RANK} waits in barrier #" in hang["text"], hang["text"]
    assert hang["odd_ones_out"] == [BARRIER_RANK]
    assert hang["files"] == [f"hang/rank-{rank}.json" for rank in range(4)]
    printed = [line for line in run.output.splitlines() if line.startswith("WHERE EACH RANK IS: ")]
    assert printed[-1].partition(" UTC: ")[2] == hang["text"].partition(" UTC: ")[2]  # judged when collected
    assert f"\n{hang['text']}\n" in run.output  # under the summary
    copy = tmp_path / "run"  # the run's folders are only read: the report is written into a copy
    shutil.copytree(run.run_dir, copy, symlinks=True)
    assert main(["report", str(copy)]) == 0
    page = html.unescape((copy / "report.html").read_text())
    assert hang["text"] in page and 'id="plot-hang-timeline"' in page


def test_the_hccl_dump_probe_is_not_described_as_working_without_the_gil() -> None:
    from runtime.stacks import ask_hccl_dump
    from wizard.run.hang_stacks import hccl_dump_asked

    for described in (hccl_dump_asked.__doc__, ask_hccl_dump.__doc__):
        text = " ".join(str(described).split())
        assert "needs no GIL" not in text
        assert "symbolizing the stacks takes the GIL" in text
