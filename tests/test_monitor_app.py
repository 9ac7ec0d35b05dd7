"""The live view under Textual's pilot: what it shows, its keys, and a fixed-size snapshot."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import pytest
from textual.widgets import DataTable, Log, Sparkline, Static

from tests.lm_runs import gpt_run, image_run
from tests.tui_driver import until
from wizard.monitor.app import MonitorApp
from wizard.monitor.attach import RunFolder
from wizard.monitor.state import JobState
from wizard.monitor.summary_text import summarize

NOW = 1_000.0
pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    """Textual runs on asyncio."""
    return "asyncio"


def event(rank: int, kind: str, at: float, **fields: object) -> dict:
    """One runtime event as a rank writes it."""
    return {"schema": 1, "event": kind, "time": at, "rank": rank, **fields}


def busy_job_state() -> JobState:
    """Four ranks on two nodes at a fixed time: three training, rank 3 silent since 960 s (40 s)."""
    state = JobState(4, hang_after=30, clock=lambda: NOW)
    for rank in range(4):
        state.ingest(
            event(
                rank,
                "started",
                900.0,
                node=rank // 2,
                host=f"host{rank // 2}",
                pid=100 + rank,
                world_size=4,
                total_steps=400,
                resumed_step=0,
            )
        )
        for index, step in enumerate(range(10, 110, 10)):
            at = 950.0 + 5 * index
            if rank == 3 and at > 960.0:
                break
            state.ingest(
                event(
                    rank,
                    "step",
                    at,
                    step=step,
                    epoch=0,
                    loss=2.0 / (1 + index) + rank / 100,
                    samples_per_s=4000.0 + 40 * index,
                    lr=0.1,
                )
            )
    for rank in range(3):
        state.ingest(event(rank, "heartbeat", 999.0, step=100, epoch=0))
    return state


@dataclass
class FakeJob:
    """A job source with no processes behind it (stands in for wizard.run.job.Job)."""

    state: JobState
    run_dir: Path
    started_at: float = 890.0
    outcome: str | None = None
    summary: dict | None = None
    stops: list[str] = field(default_factory=list)

    def clock(self) -> float:
        """The fixed time of the picture."""
        return NOW

    def tick(self) -> str | None:
        """Nothing new happens."""
        return self.outcome

    def stop(self, outcome: str = "interrupted", signum: int = 2) -> str:
        """Record the stop and end the job."""
        self.stops.append(outcome)
        self.outcome = outcome
        return outcome


def fake_job(tmp_path: Path) -> FakeJob:
    """A fake job whose rank 0 log has a few lines."""
    (tmp_path / "logs").mkdir()
    (tmp_path / "logs" / "rank-0.log").write_text("".join(f"epoch 1 step {s}: loss ok\n" for s in range(10, 60, 10)))
    return FakeJob(busy_job_state(), tmp_path)


def app_for(job: FakeJob, *, owns_job: bool = True) -> MonitorApp:
    """The app as `npu-wizard run` builds it, without a timer (the picture must not move)."""
    return MonitorApp(job, title="cpu-demo  |  torchrun  |  nodes [0, 1]", owns_job=owns_job, tick_s=0)


async def test_the_table_shows_every_rank_with_its_state_step_and_loss(tmp_path: Path) -> None:
    app = app_for(fake_job(tmp_path))
    async with app.run_test(size=(110, 32)):
        table = app.query_one(DataTable)
        assert table.row_count == 4
        assert [str(cell) for cell in table.get_row("0")][:5] == ["0", "0", "running", "100", "0.2000"]
        assert "hung" in str(table.get_row("3")[2])
        assert str(table.get_row("3")[6]) == "-"  # peak mem: these steps carry none
        assert str(table.get_row("3")[7]) == "40s"


async def test_a_hung_rank_is_named_in_the_alert_line(tmp_path: Path) -> None:
    app = app_for(fake_job(tmp_path))
    async with app.run_test(size=(110, 32)):
        alert = str(app.query_one("#alert", Static).render())
        assert "rank 3 (node 1) is hung: no heartbeat or step for 40s" in alert


def straggling_job_state() -> JobState:
    """Four ranks on two nodes, all alive; rank 2's forward 50% longer than the others' for 9 windows.

    The first is each rank's warm-up, the next four only teach the detector the job's jitter, the last four are
    judged: 20 s of them, past the 15 s a straggler must last.
    """
    state = JobState(4, hang_after=30, clock=lambda: NOW)
    for rank in range(4):
        state.ingest(event(rank, "started", 900.0, node=rank // 2, pid=100 + rank, world_size=4, resumed_step=0))
    for index, step in enumerate(range(10, 100, 10)):
        for rank in range(4):
            forward = 0.012 if rank == 2 else 0.008
            fields = {"step": step, "epoch": 0, "loss": 1.0, "samples_per_s": 4000.0, "lr": 0.1}
            state.ingest(event(rank, "step", 950.0 + 5 * index, data_s=0.002, forward_s=forward, **fields))
    return state


async def test_a_straggler_is_marked_in_its_row_and_named_in_the_alert_line(tmp_path: Path) -> None:
    app = app_for(FakeJob(straggling_job_state(), tmp_path))
    async with app.run_test(size=(110, 32)):
        table = app.query_one(DataTable)
        assert str(table.get_row("2")[2]) == "slow +40%"
        assert [str(table.get_row(rank)[2]) for rank in ("0", "1", "3")] == ["running"] * 3
        alert = str(app.query_one("#alert", Static).render())
        assert "straggler: rank 2 (node 1) is 40% slower in forward than the other ranks" in alert


async def test_the_job_line_has_throughput_and_eta(tmp_path: Path) -> None:
    app = app_for(fake_job(tmp_path))
    async with app.run_test(size=(110, 32)):
        line = str(app.query_one("#job", Static).render())
        assert "step 100/400" in line
        assert "samples/s" in line and "ETA" in line


async def test_the_job_line_of_steps_without_their_total_says_how_to_get_an_eta(tmp_path: Path) -> None:
    state = JobState(2, hang_after=30, clock=lambda: NOW)
    for rank in range(2):  # a user's script: report.step(step, loss=..., samples=...), no total_steps
        state.ingest(event(rank, "started", 900.0, node=0, pid=100 + rank, world_size=2))
        for index, step in enumerate(range(10, 60, 10)):
            state.ingest(event(rank, "step", 950.0 + 5 * index, step=step, loss=1.0, samples_per_s=4000.0))
    app = app_for(FakeJob(state, tmp_path))
    async with app.run_test(size=(110, 32)):
        line = str(app.query_one("#job", Static).render())
        assert "step 50  |" in line
        assert line.endswith("samples/s  |  ETA: pass total_steps= to report.step"), line


def own_script_state() -> JobState:
    """Two ranks of a user's script that sends no steps: rank 0 printed 2 s ago, rank 1 last printed at 960 s (40 s)."""
    state = JobState(2, hang_after=30, clock=lambda: NOW)
    for rank in range(2):
        state.ingest(event(rank, "started", 900.0, node=0, host="host0", pid=100 + rank, world_size=2))
        silent = 1.0 if rank == 0 else 39.0  # measured at the heartbeat, 1 s before now
        state.ingest(event(rank, "heartbeat", 999.0, step=0, epoch=0, silent_s=silent))
    return state


async def test_a_script_without_steps_shows_when_each_rank_last_printed(tmp_path: Path) -> None:
    app = app_for(FakeJob(own_script_state(), tmp_path))
    async with app.run_test(size=(110, 32)):
        table = app.query_one(DataTable)
        assert [str(cell) for cell in table.get_row("0")][2:4] == ["running", "printed 2s ago"]
        assert [str(cell) for cell in table.get_row("1")][2:4] == ["stalled", "printed 40s ago"]
        line = str(app.query_one("#job", Static).render())
        assert "no steps reported; quietest: rank 1, printed 40s ago" in line
        alert = str(app.query_one("#alert", Static).render())
        assert "ranks 1 are alive but printed nothing for 30s" in alert


async def test_switching_rank_moves_the_plot_and_the_log(tmp_path: Path) -> None:
    app = app_for(fake_job(tmp_path))
    async with app.run_test(size=(110, 32)) as pilot:
        assert "epoch 1 step 50" in "\n".join(app.query_one(Log).lines)
        await pilot.press("n")
        assert app.selected == 1
        assert "rank 1" in str(app.query_one("#loss-label", Static).render())
        assert "waiting for rank 1's log (on node 0 (host0))" in "\n".join(app.query_one(Log).lines)
        await pilot.press("p", "p")
        assert app.selected == 3
        assert len(app.query_one(Sparkline).data) == 3


async def test_the_stop_key_stops_the_job_and_the_view_stays(tmp_path: Path) -> None:
    job = fake_job(tmp_path)
    app = app_for(job)
    async with app.run_test(size=(110, 32)) as pilot:
        await pilot.press("s")
        await app.workers.wait_for_complete()
        await pilot.pause()
        assert job.stops == ["interrupted"]
        assert app.is_running
        assert "INTERRUPTED" in str(app.query_one("#job", Static).render())


async def test_quit_stops_a_running_job_it_owns(tmp_path: Path) -> None:
    job = fake_job(tmp_path)
    app = app_for(job)
    async with app.run_test(size=(110, 32)) as pilot:
        await pilot.press("q")
        await app.workers.wait_for_complete()
        await pilot.pause()
    assert job.stops == ["interrupted"]
    assert app.return_value == "interrupted"


class LaunchersExiting(FakeJob):
    """Every rank has finished; the launchers exit on the second tick."""

    ticks: int = 0

    def tick(self) -> str | None:
        """The job ends as finished once the launchers are gone."""
        self.ticks += 1
        if self.ticks >= 2:
            self.outcome = "finished"
        return self.outcome


async def test_quit_after_every_rank_finished_waits_for_the_launchers_and_is_no_interrupt(tmp_path: Path) -> None:
    state = JobState(2, hang_after=30, clock=lambda: NOW)
    for rank in range(2):
        state.ingest(event(rank, "started", 900.0, node=0, host="host0", pid=100 + rank, world_size=2))
        state.ingest(event(rank, "finished", 950.0, step=10, epoch=1))
    job = LaunchersExiting(state, tmp_path)
    app = MonitorApp(job, title="job", owns_job=True, tick_s=0)
    async with app.run_test(size=(110, 32)) as pilot:
        await pilot.press("q")
        # the quit worker ends the app itself; waiting on the worker would race that
        await until(pilot, lambda: app.return_value is not None, "the view to exit by itself")
    assert job.stops == []
    assert app.return_value == "finished"


async def test_quit_only_detaches_from_a_watched_run(tmp_path: Path) -> None:
    job = fake_job(tmp_path)
    app = app_for(job, owns_job=False)
    async with app.run_test(size=(110, 32)) as pilot:
        await pilot.press("q")
    assert job.stops == []


def test_the_live_view_runs_with_animations_off_in_tests(tmp_path: Path) -> None:
    assert app_for(fake_job(tmp_path)).animation_level == "none"


def test_the_live_view_looks_the_same(tmp_path: Path, snap_compare: object) -> None:
    # the log lines and the time are fixed, so the picture is stable
    assert snap_compare(app_for(fake_job(tmp_path)), terminal_size=(110, 32))  # type: ignore[operator]


async def test_a_run_ended_without_any_window_compared_says_its_stragglers_were_not_judged(tmp_path: Path) -> None:
    job = FakeJob(own_script_state(), tmp_path, outcome="finished")
    job.summary = summarize(job.state, started_at=890.0, ended_at=NOW, outcome="finished")
    app = app_for(job)
    async with app.run_test(size=(110, 32)):
        alert = str(app.query_one("#alert", Static).render())
        assert "the job finished: press q for the summary\nstragglers not judged: no rank reported a step" in alert


async def test_the_columns_widen_for_what_comes_after_the_first_picture(tmp_path: Path) -> None:
    state = JobState(2, hang_after=30, clock=lambda: NOW)
    for rank in range(2):
        state.ingest(event(rank, "started", 900.0, node=0, host="host0", pid=100 + rank, world_size=2))
    app = app_for(FakeJob(state, tmp_path))
    async with app.run_test(size=(110, 32)) as pilot:
        table = app.query_one(DataTable)
        assert [str(cell) for cell in table.get_row("0")][3:5] == ["0", "-"]  # drawn before the ranks said more
        state.ingest(event(0, "heartbeat", 999.0, step=0, epoch=0, silent_s=3.0))
        state.ingest(event(1, "step", 999.0, step=12, epoch=0, loss=1.23456, samples_per_s=123456.0))
        app.redraw()
        await pilot.pause()
        assert str(table.get_row("0")[3]) == "printed 4s ago"
        for row in table.rows:
            for column, cell in zip(table.columns, table.get_row(row), strict=True):
                # "printed 3s ago" was cut to "prin": a column kept the width of its first picture
                assert table.columns[column].content_width >= len(str(cell)), (column, cell)


async def test_a_language_model_run_has_a_line_of_its_tokens_per_s_mfu_and_validation_loss(tmp_path: Path) -> None:
    folder = RunFolder(gpt_run(tmp_path / "run", finished=False))
    app = MonitorApp(folder, title="gpt", owns_job=False, tick_s=0)
    async with app.run_test(size=(110, 32)):
        line = app.query_one("#lm", Static)
        assert line.display
        assert str(line.render()) == "language model  |  25,800 tokens/s  |  MFU 43.0%  |  val loss 2.6000 at step 30"


async def test_once_the_run_ended_its_language_model_line_keeps_only_the_validation_loss(tmp_path: Path) -> None:
    folder = RunFolder(gpt_run(tmp_path / "run"))
    assert folder.tick() == "finished"  # every rank said it finished
    app = MonitorApp(folder, title="gpt", owns_job=False, tick_s=0)
    async with app.run_test(size=(110, 32)):
        assert str(app.query_one("#lm", Static).render()) == "language model  |  val loss 2.6000 at step 30"


async def test_an_image_model_run_has_no_language_model_line(tmp_path: Path) -> None:
    for source in (RunFolder(image_run(tmp_path / "run")), fake_job(tmp_path)):
        app = MonitorApp(source, title="images", owns_job=False, tick_s=0)
        async with app.run_test(size=(110, 32)):
            assert not app.query_one("#lm", Static).display
