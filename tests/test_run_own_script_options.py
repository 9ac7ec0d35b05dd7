"""`run --epochs` and `run --fresh` on a project that runs the user's own script (training.script).

Real processes: a small script of the user's (argparse, its own checkpoint file)
runs through `npu-wizard run` with the shell launcher, one rank on the CPU.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

from tests.runs import npu_wizard_run_plain, render_own_one_rank, run_dirs
from wizard.cli import build_run_parser

OWN_SCRIPT = """\
import argparse
from pathlib import Path

parser = argparse.ArgumentParser()
parser.add_argument("--lr", type=float, default=0.1)
parser.parse_args()
folder = Path("own-checkpoints")
folder.mkdir(exist_ok=True)
(folder / "latest.pt").write_text("step 3")
print("saved own-checkpoints/latest.pt")
"""


def render_own_script(tmp_path: Path) -> Path:
    """One rank on the CPU running the user's `mine.py` (tests/runs.py's render_own_one_rank)."""
    return render_own_one_rank(tmp_path, "own", "mine.py", OWN_SCRIPT)


def npu_wizard_run(project: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """`npu-wizard run PROJECT --plain ARGS` to its end."""
    return npu_wizard_run_plain(project, *args, timeout=300)


def test_epochs_is_refused_for_a_users_script_before_anything_starts(tmp_path: Path) -> None:
    project = render_own_script(tmp_path)
    for args in (("--epochs", "3"), ("--epochs", "3", "--dry-run")):
        result = npu_wizard_run(project, *args)
        assert result.returncode == 1, result.stdout + result.stderr
        assert result.stderr == (
            f"npu-wizard: --epochs 3: {project} runs your own script mine.py (training.script), which npu-wizard "
            "cannot tell how many epochs to train (only the generated train.py takes --epochs); nothing was started. "
            f"Give your script its own option in training.script_args in {project / 'answers.yaml'}, "
            f"run npu-wizard update {project}, then run without --epochs\n"
        )
        assert "unrecognized arguments" not in result.stdout + result.stderr
    assert run_dirs(project) == []  # no run folder, no rank started
    assert not (project / "own-checkpoints").exists()


def test_epochs_help_says_it_is_for_the_generated_train_py_only() -> None:
    text = " ".join(build_run_parser().format_help().split())
    assert "the generated train.py only: refused for a script of your own" in text


def test_fresh_on_a_users_script_says_it_moves_only_step_files_and_not_the_scripts_own(tmp_path: Path) -> None:
    project = render_own_script(tmp_path)
    checkpoints = project / "checkpoints"
    checkpoints.mkdir()
    (checkpoints / "step-4.pt").write_bytes(b"not a torch file")
    first = npu_wizard_run(project, "--fresh")
    assert first.returncode == 0, first.stdout + first.stderr
    (aside,) = checkpoints.glob("set-aside-*")
    assert [p.name for p in aside.iterdir()] == ["step-4.pt"]
    assert (
        f"--fresh: moved the step-N.pt files into {aside}; that is all --fresh moves: your script mine.py "
        "(training.script) keeps its own checkpoints where it saves them, and resumes from them if it loads them: "
        "move those away yourself to start from step 0"
    ) in first.stdout
    again = npu_wizard_run(project, "--fresh")
    assert again.returncode == 0, again.stdout + again.stderr
    assert f"--fresh: no step-N.pt files in {checkpoints} to move; that is all --fresh moves" in again.stdout
    assert "no checkpoints in" not in again.stdout
    assert (project / "own-checkpoints" / "latest.pt").read_text() == "step 3"  # the script's own: never moved


def test_fresh_help_says_a_users_script_keeps_its_own_checkpoints() -> None:
    text = " ".join(build_run_parser().format_help().split())
    assert "a script of your own keeps its own checkpoints where it saves them: move those yourself" in text
