"""`npu-wizard run --profile A:B --profile-ranks ...`: what is refused, and what the ranks are given."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.runs import render_cpu
from wizard.cli import main


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
