"""A repository set up the older way (npu-wizard's files straight in its root, `.npu-wizard/into` without
`.npu-wizard/repository`): `npu-wizard update REPO` updates it and then tells exactly what to run to move it into
REPO/npu. The tests run those commands as printed, with bash, and the project then runs from its folder.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from tests.runs import node_env, run_dirs
from tests.test_one_folder import TRAIN_PY, answers_file, git, npu_wizard, run_plain

GITIGNORE = "out/\n__pycache__/\n"
RUN_NODE = "launch/run-node.sh"


def older_layout_repository(tmp_path: Path) -> Path:
    """A committed repository of someone else's (its .gitignore, its train.py) with npu-wizard's files straight in
    its root, as `--into REPO` wrote them before npu/ became the default (no .npu-wizard/repository)."""
    repo = tmp_path / "their-gpt"
    repo.mkdir()
    (repo / ".gitignore").write_text(GITIGNORE)
    # no package named runtime: the older layout's runtime/ would clash with it
    (repo / "train.py").write_text(
        TRAIN_PY.replace('import runtime\n\nassert runtime.OWNER == "the repository", runtime.__file__\n', "")
    )
    git(repo, "init", "-q")
    git(repo, "add", "-A")
    git(repo, "-c", "user.name=them", "-c", "user.email=them@example.com", "commit", "-qm", "theirs")
    rendered = npu_wizard("--answers", str(answers_file(tmp_path)), "--into", str(repo), "--folder", ".")
    assert rendered.returncode == 0, rendered.stderr
    (repo / ".npu-wizard" / "repository").unlink()  # what a render of the older layout left
    return repo


def told_commands(output: str) -> str:
    """The commands update printed to move the repository into npu/, as printed (continuation lines included)."""
    after = output.split("stop any run of it, then run:\n", 1)[1]
    lines = []
    for line in after.splitlines():
        if not line.startswith("  "):
            break
        lines.append(line)
    return "\n".join(lines) + "\n"


def run_told(commands: str, tmp_path: Path) -> None:
    """The commands in one bash, stopping at the first that fails, `npu-wizard` from this venv on PATH."""
    env = {key: value for key, value in node_env(tmp_path / "unused").items() if key != "NPU_WIZARD_RUN_DIR"}
    done = subprocess.run(["bash", "-e", "-c", commands], cwd=tmp_path, env=env, capture_output=True, text=True)
    assert done.returncode == 0, commands + done.stdout + done.stderr


def test_update_tells_how_to_move_the_older_layout_into_npu_and_the_commands_work(tmp_path: Path) -> None:
    repo = older_layout_repository(tmp_path)
    (repo / RUN_NODE).write_text((repo / RUN_NODE).read_text() + "# my change\n")
    for made in ("runs/20240101-000000", "checkpoints", "runtime/__pycache__"):  # what runs leave
        (repo / made).mkdir(parents=True)
    (repo / "runs" / ".gitignore").write_text("*\n")
    (repo / "checkpoints" / "step-1.pt").write_text("weights\n")
    (repo / "runtime" / "__pycache__" / "report.cpython-311.pyc").write_text("")

    told = npu_wizard("update", str(repo))

    assert told.returncode == 0, told.stdout + told.stderr
    commands = told_commands(told.stdout)
    one_per_line = commands.replace(" \\\n    ", " ")  # a long command is wrapped with a backslash
    assert one_per_line.startswith(f"  npu-wizard --answers {repo}/answers.yaml --into {repo} --folder npu\n")
    assert f"  mv -- {repo}/runs {repo}/npu/runs\n" in one_per_line
    assert f"  mv -- {repo}/checkpoints {repo}/npu/checkpoints\n" in one_per_line
    assert f"  rm -rf -- {repo}/runtime/__pycache__\n" in one_per_line
    assert f"  rm -r -- {repo}/.npu-wizard\n" in one_per_line
    assert RUN_NODE not in commands  # edited: never removed, named instead
    assert (
        f"you edited stay where they are: compare each with its new copy in npu/, move your changes by hand, "
        f"then delete it: {RUN_NODE}" in told.stdout
    )
    assert f"echo . > {repo}/.npu-wizard/repository" in told.stdout

    run_told(commands, tmp_path)
    assert (repo / RUN_NODE).read_text().endswith("# my change\n")
    (repo / RUN_NODE).unlink()  # moved by hand, as the note says
    (repo / "launch").rmdir()

    assert git(repo, "status", "--porcelain") == "?? npu/\n"
    assert sorted(path.name for path in repo.iterdir()) == [".git", ".gitignore", "npu", "train.py"]  # nothing left
    assert (repo / ".gitignore").read_text() == GITIGNORE
    assert (repo / "npu" / "checkpoints" / "step-1.pt").read_text() == "weights\n"
    assert (repo / "npu" / "runs" / "20240101-000000").is_dir()
    assert (repo / "npu" / ".npu-wizard" / "repository").read_text() == "npu\n"
    again = npu_wizard("update", str(repo / "npu"))
    assert again.returncode == 0 and "older layout" not in again.stdout, again.stdout + again.stderr


def test_the_older_layout_chosen_with_folder_dot_is_not_told_to_move(tmp_path: Path) -> None:
    repo = older_layout_repository(tmp_path)
    (repo / ".npu-wizard" / "repository").write_text(".\n")  # as --folder . writes it

    result = npu_wizard("update", str(repo))

    assert result.returncode == 0, result.stdout + result.stderr
    assert "older layout" not in result.stdout and "--folder npu" not in result.stdout


def test_a_render_into_npu_beside_the_older_layout_warns_that_update_says_how_to_remove_it(tmp_path: Path) -> None:
    repo = older_layout_repository(tmp_path)

    result = npu_wizard("--answers", str(repo / "answers.yaml"), "--into", str(repo))

    assert result.returncode == 0, result.stdout + result.stderr
    assert (
        f"also holds npu-wizard's files of the older layout, straight in its root: npu-wizard update {repo} "
        "says how to remove them" in result.stderr
    )


@pytest.mark.slow
def test_a_repository_run_in_the_older_layout_moves_into_npu_and_runs_there(tmp_path: Path) -> None:
    repo = older_layout_repository(tmp_path)
    first = run_plain(repo)
    assert first.returncode == 0 and "outcome: finished" in first.stdout, first.stdout[-4000:] + first.stderr[-4000:]
    (old_run,) = run_dirs(repo)

    told = npu_wizard("update", str(repo))
    assert told.returncode == 0, told.stdout + told.stderr
    run_told(told_commands(told.stdout), tmp_path)

    assert git(repo, "status", "--porcelain") == "?? npu/\n"
    assert sorted(path.name for path in repo.iterdir()) == [".git", ".gitignore", "npu", "out", "train.py"]
    assert (repo / ".gitignore").read_text() == GITIGNORE
    project = repo / "npu"
    assert (project / "runs" / old_run.name / "summary.json").is_file()
    ended = run_plain(project)
    assert ended.returncode == 0, ended.stdout[-4000:] + ended.stderr[-4000:]
    assert "outcome: finished" in ended.stdout
    newest = run_dirs(project)[-1]
    assert json.loads((newest / "summary.json").read_text())["outcome"] == "finished"
    assert "[rank 1] finished at step" in (newest / "logs" / "rank-1.log").read_text()
    assert git(repo, "status", "--porcelain") == "?? npu/\n"
