"""`npu-wizard run --profile A:B --profile-ranks ...`: what is refused, and what the ranks are given."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.runs import render_cpu
from wizard.cli import main
from wizard.monitor.state import JobState
from wizard.monitor.stragglers import Straggler
from wizard.run.intake import Intake
from wizard.run.profile_asks import pair_for, straggler_profiles


@pytest.fixture(scope="module")
def project(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A 2 x 2 CPU project (never run here)."""
    return render_cpu(tmp_path_factory.mktemp("profile-options"), "torchrun", nodes=2)


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (["--profile", "30:20"], "'30:20': A must be 1 or more"),
        (["--profile", "20"], "'20': give two step numbers A:B"),
        (["--profile", "20:30", "--profile-ranks", "some"], "'some': give all, straggler[:N], or rank numbers"),
        (["--profile-ranks", "0,3"], "--profile-ranks 0,3 needs --profile A:B"),
        (["--profile", "20:30", "--smoke"], "--profile and --profile-ranks go with training, not with --smoke"),
    ],
)
def test_bad_profile_options_are_usage_errors(
    project: Path, capsys: pytest.CaptureFixture[str], args: list[str], said: str
) -> None:
    with pytest.raises(SystemExit) as stop:
        main(["run", str(project), "--dry-run", *args])
    assert stop.value.code == 2
    assert said in capsys.readouterr().err
    assert not (project / "runs").exists()


def test_a_rank_the_project_lacks_is_refused_and_nothing_starts(
    project: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["run", str(project), "--plain", "--profile", "20:30", "--profile-ranks", "0,7"]) == 1
    error = capsys.readouterr().err
    assert error.strip().splitlines() == [
        f"npu-wizard: --profile-ranks 0,7: {project} has 4 rank(s), 0 to 3, so rank 7 cannot be profiled; "
        "nothing was started"
    ]
    assert not (project / "runs").exists()


def test_the_window_and_the_ranks_reach_every_rank_through_the_environment(
    project: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["run", str(project), "--dry-run", "--profile", "20:30", "--profile-ranks", "0,3"]) == 0
    shown = capsys.readouterr().out
    assert shown.count("NPU_WIZARD_PROFILE=20:30") == 2  # both nodes' commands
    assert shown.count("NPU_WIZARD_PROFILE_RANKS=0,3") == 2


def test_straggler_mode_needs_no_window_and_passes_none(project: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["run", str(project), "--dry-run", "--profile-ranks", "straggler:2"]) == 0
    shown = capsys.readouterr().out
    assert "NPU_WIZARD_PROFILE_RANKS=straggler:2" in shown and "NPU_WIZARD_PROFILE=" not in shown


def state_with_compute(times: dict[int, float]) -> JobState:
    """A 2 x 2 job's state whose ranks' newest windows took `times` (data + forward seconds)."""
    state = JobState(4, nodes=2)
    for rank, seconds in times.items():
        state.view(rank).compute_s = seconds
    return state


def test_a_flagged_rank_is_paired_with_the_median_of_the_others() -> None:
    state = state_with_compute({0: 0.010, 1: 0.030, 2: 0.020, 3: 0.090})
    assert pair_for(state, Straggler(rank=3, node=1, phase="forward", start=1.0)) == (3, 2)


def test_a_flagged_node_gives_its_slowest_rank_and_the_median_of_the_other_node() -> None:
    state = state_with_compute({0: 0.010, 1: 0.012, 2: 0.050, 3: 0.070})
    assert pair_for(state, Straggler(rank=None, node=1, phase="data", start=1.0)) == (3, 1)


def test_each_flag_is_asked_for_once_and_no_more_than_straggler_n_windows() -> None:
    """Without a status stream nothing can be asked: said once, and the window is not spent."""
    state = state_with_compute({0: 0.010, 1: 0.030, 2: 0.020, 3: 0.090})
    state.stragglers.findings.append(Straggler(rank=3, node=1, phase="forward", start=1.0))
    asker = straggler_profiles("20:30", "straggler:2")
    assert asker is not None and (asker.steps, asker.left) == (10, 2)
    intake = Intake(state, Path("/nonexistent"))
    assert asker.look(state, intake, 5.0) == ["PROFILE: no status stream here to ask the straggler's rank for a window"]
    assert asker.look(state, intake, 6.0) == []
    assert straggler_profiles("20:30", "all") is None and straggler_profiles(None, None) is None
