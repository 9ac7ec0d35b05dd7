"""Resume wired and the right interpreter, without training: the answers, `run -- ARGS`, the attempt environment,
which earlier run a new one resumes, the launch script's argument order, and a missing interpreter refused.

The launch script runs for real under bash (shell launcher, one rank) with a script that only records its
arguments and environment; nothing here imports torch.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.runs import free_port
from tests.test_k8s_engine import k8s_project
from wizard.answers.model import resolve
from wizard.cli import main
from wizard.errors import AnswersError
from wizard.render.render import render
from wizard.run.engines.interpreter import (
    LAUNCHER_MARK,
    interpreter,
    launcher_check,
    launcher_problem,
    remote_problems,
)
from wizard.run.job import Job
from wizard.run.launch import RunOptions
from wizard.run.resuming import UNFINISHED, unfinished_run

RECORDING_SCRIPT = """\
import json, os, sys
with open(os.environ["RECORD"], "w") as out:
    json.dump({"argv": sys.argv[1:], "attempt": os.environ.get("NPU_WIZARD_ATTEMPT"),
               "resuming": os.environ.get("NPU_WIZARD_RESUMING")}, out)
"""


def own_script_answers(**overrides: Any) -> dict[str, Any]:
    """One rank of a user's own script (record.py), shell launcher, on the CPU."""
    return {
        "project_name": "own",
        "device": "cpu",
        "nodes": 1,
        "devices_per_node": 1,
        "launcher": "shell",
        "amp": "off",
        "network.host_ips": ["127.0.0.1"],
        "network.master_port": free_port(),
        "training.script": "record.py",
        "training.script_args": ["--data", "a b"],
        **overrides,
    }


def render_own(tmp_path: Path, **overrides: Any) -> Path:
    """The rendered project, its script in place."""
    project = render(resolve(own_script_answers(**overrides)), tmp_path).project_dir
    (project / "record.py").write_text(RECORDING_SCRIPT)
    return project


def problems_of(raw: dict[str, Any]) -> dict[str, str]:
    """Each refused answer's message."""
    with pytest.raises(AnswersError) as caught:
        resolve(raw)
    return {problem.field: problem.message for problem in caught.value.problems}


# ---- the answers -------------------------------------------------------------------


def test_resume_args_take_a_list_or_a_line_split_as_a_shell_splits_it() -> None:
    assert resolve(own_script_answers(**{"training.resume_args": ["--init_from=resume"]}))["training.resume_args"] == (
        "--init_from=resume",
    )
    line = resolve(own_script_answers(**{"training.resume_args": "--init_from=resume --out 'my dir'"}))
    assert line["training.resume_args"] == ("--init_from=resume", "--out", "my dir")
    assert resolve(own_script_answers())["training.resume_args"] == ()


def test_resume_args_that_are_no_arguments_are_refused_with_what_is_allowed() -> None:
    assert (
        "must be a list of strings"
        in problems_of(own_script_answers(**{"training.resume_args": 3}))["training.resume_args"]
    )
    assert (
        "cannot split the line"
        in problems_of(own_script_answers(**{"training.resume_args": "--a 'open"}))["training.resume_args"]
    )
    assert (
        "is not a string"
        in problems_of(own_script_answers(**{"training.resume_args": ["--steps", 3]}))["training.resume_args"]
    )


def test_resume_args_for_the_generated_script_are_refused_it_resumes_by_itself() -> None:
    raw = own_script_answers(**{"training.script": None, "training.resume_args": ["--resume"]})  # generated
    raw.pop("training.script_args")
    said = problems_of(raw)["training.resume_args"]
    assert "the generated train.py resumes from its newest checkpoint by itself" in said


def test_run_python_is_an_absolute_path() -> None:
    assert (
        "must be an absolute path" in problems_of(own_script_answers(**{"run.python": "venv/bin/python"}))["run.python"]
    )
    assert resolve(own_script_answers(**{"run.python": "/opt/venv/bin/python"}))["run.python"] == (
        "/opt/venv/bin/python"
    )


# ---- run -- ARGS -------------------------------------------------------------------


def test_arguments_after_a_double_dash_reach_every_node_last_with_the_attempt_environment(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    project = render_own(tmp_path, **{"training.resume_args": ["--init_from=resume"]})
    assert main(["run", str(project), "--dry-run", "--", "--lr", "3e-4", "--name", "two words"]) == 0
    shown = capsys.readouterr().out
    assert "launch/node0.sh --lr 3e-4 --name 'two words'" in shown
    assert f"PYTHON={sys.executable}" in shown
    assert "NPU_WIZARD_ATTEMPT=1" in shown and "NPU_WIZARD_RESUMING=0" in shown


def test_arguments_after_a_double_dash_do_not_go_with_the_smoke_test(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    project = render_own(tmp_path)
    with pytest.raises(SystemExit) as exited:
        main(["run", str(project), "--smoke", "--", "--lr", "3"])
    assert exited.value.code == 2
    assert "arguments after -- go to your training script, which --smoke" in capsys.readouterr().err


# ---- which run resumes -----------------------------------------------------------------


def earlier_run(project: Path, name: str, outcome: str | None, *, smoke: bool = False, started: bool = True) -> Path:
    """A run folder as `npu-wizard run` leaves it: run.json, summary.json (unless None), a rank's events."""
    run_dir = project / "runs" / name
    (run_dir / "events").mkdir(parents=True)
    (run_dir / "run.json").write_text(json.dumps({"smoke": smoke}))
    (run_dir / "events" / "rank-0.jsonl").write_text('{"event": "started"}\n' if started else "")
    if outcome is not None:
        summary = {"outcome": outcome, "world_size": 1, "never_reported": [] if started else [0]}
        (run_dir / "summary.json").write_text(json.dumps(summary))
    return run_dir


def test_a_run_resumes_after_one_that_did_not_finish_and_never_after_one_that_did(tmp_path: Path) -> None:
    assert unfinished_run(tmp_path) is None
    interrupted = earlier_run(tmp_path, "20250101-100000", "interrupted")
    assert unfinished_run(tmp_path).run_dir == interrupted
    earlier_run(tmp_path, "20250101-100000-1", "finished")
    assert unfinished_run(tmp_path) is None


def test_smoke_runs_and_runs_whose_ranks_never_started_say_nothing_of_a_checkpoint(tmp_path: Path) -> None:
    failed = earlier_run(tmp_path, "20250101-100000", "failed")
    earlier_run(tmp_path, "20250101-100000-2", "finished", smoke=True)
    earlier_run(tmp_path, "20250101-100000-10", "failed", started=False)
    assert unfinished_run(tmp_path).run_dir == failed
    this_run = earlier_run(tmp_path, "20250101-110000", None, started=False)
    assert unfinished_run(tmp_path, this_run).run_dir == failed


def test_a_run_whose_runner_was_killed_left_no_summary_and_is_resumed(tmp_path: Path) -> None:
    earlier_run(tmp_path, "20250101-100000", "finished")
    killed = earlier_run(tmp_path, "20250102-090000", None)
    found = unfinished_run(tmp_path)
    assert found.run_dir == killed and found.outcome == UNFINISHED


@pytest.mark.parametrize("world_size", [[4], "4", {"n": 4}, True, 2.5])
def test_an_earlier_run_whose_summary_has_no_whole_world_size_is_passed_over(tmp_path: Path, world_size: Any) -> None:
    failed = earlier_run(tmp_path, "20250101-100000", "failed")
    malformed = earlier_run(tmp_path, "20250102-090000", "failed")
    summary = json.loads((malformed / "summary.json").read_text())
    (malformed / "summary.json").write_text(json.dumps({**summary, "world_size": world_size}))
    assert unfinished_run(tmp_path).run_dir == failed


def test_under_kubernetes_the_runner_does_not_claim_the_pods_get_the_resuming_environment(tmp_path: Path) -> None:
    project = k8s_project(tmp_path, "pytorchjob")
    earlier_run(project, "20250101-100000", "failed")
    notes = " ".join(Job(project, RunOptions()).notes)
    assert "NPU_WIZARD_RESUMING" not in notes and "resume_args" not in notes
    assert (
        "note: the last run (20250101-100000) failed; the pods start as k8s/pytorchjob.yaml says, so they resume "
        "only where your script finds its checkpoint by itself"
    ) in notes


# ---- the launch script ---------------------------------------------------------------


def run_node(project: Path, tmp_path: Path, *args: str, **env: str) -> dict[str, Any]:
    """launch/node0.sh ARGS run for real; what the script recorded."""
    record = tmp_path / "record.json"
    clean = {key: value for key, value in os.environ.items() if not key.startswith("NPU_WIZARD_")}
    result = subprocess.run(
        ["bash", str(project / "launch" / "node0.sh"), *args],
        env={
            **clean,
            "PYTHON": sys.executable,
            "RECORD": str(record),
            "NPU_WIZARD_RUN_DIR": str(tmp_path / "run"),
            **env,
        },
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    return json.loads(record.read_text())


def test_a_start_that_resumes_gets_resume_args_last_after_the_one_off_ones_as_a_launcher_restart_does(
    tmp_path: Path,
) -> None:
    project = render_own(tmp_path, **{"training.resume_args": "--init_from=resume --note 'x y'"})
    first = run_node(project, tmp_path, "--once")
    assert first == {"argv": ["--data", "a b", "--once"], "attempt": "1", "resuming": "0"}
    resumed = run_node(project, tmp_path, "--once", NPU_WIZARD_RESUMING="1")
    assert resumed["argv"] == ["--data", "a b", "--once", "--init_from=resume", "--note", "x y"]
    assert resumed["attempt"] == "1" and resumed["resuming"] == "1"
    second = run_node(project, tmp_path, NPU_WIZARD_ATTEMPT="2")
    assert second == {"argv": ["--data", "a b", "--init_from=resume", "--note", "x y"], "attempt": "2", "resuming": "1"}


# ---- the interpreter -----------------------------------------------------------------


def test_a_project_naming_a_missing_interpreter_fails_before_any_node_starts_naming_the_fix(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    missing = str(tmp_path / "gone" / "bin" / "python")
    project = render_own(tmp_path, **{"run.python": missing})
    env = {key: value for key, value in os.environ.items() if key != "PYTHON"}
    result = subprocess.run(
        [sys.executable, "-m", "wizard", "run", str(project), "--plain"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 1, result.stdout + result.stderr
    assert f"the Python {missing} for the ranks is not there" in result.stderr
    assert "set run.python in answers.yaml" in result.stderr and "nothing was started" in result.stderr
    assert not list(project.glob("runs/*/logs/node-*.log"))


def test_a_torchrun_neither_beside_the_interpreter_nor_on_path_is_named(tmp_path: Path) -> None:
    answers = resolve(own_script_answers(launcher="torchrun"))
    lone = tmp_path / "bin" / "python"
    lone.parent.mkdir()
    lone.symlink_to(sys.executable)
    said = launcher_problem(answers, str(lone), path="/nonexistent")
    assert said is not None and said.startswith(f"torchrun (the torchrun launcher) is neither beside {lone}")
    assert launcher_problem(answers, sys.executable, path="/nonexistent") is None  # the venv's torchrun
    assert launcher_problem(resolve(own_script_answers()), str(lone), path="/nonexistent") is None  # shell


def test_the_check_a_remote_host_runs_names_what_is_missing_there(tmp_path: Path) -> None:
    answers = resolve(own_script_answers(launcher="torchrun"))
    outputs = [
        subprocess.run(
            ["/bin/sh", "-c", launcher_check(answers, python)],
            env={"PATH": "/nonexistent"},
            capture_output=True,
            text=True,
        ).stdout
        for python in (sys.executable, str(tmp_path / "gone"))
    ]
    assert LAUNCHER_MARK not in outputs[0]
    assert remote_problems(outputs, ("h0", "h1")) == [f"node 1 (h1): no Python {tmp_path / 'gone'}"]


def test_a_relative_python_is_taken_from_where_npu_wizard_runs_not_from_the_project(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    project = render_own(tmp_path / "out")
    venv = tmp_path / "venvlink" / "bin"
    venv.mkdir(parents=True)
    (venv / "python").symlink_to(sys.executable)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("PYTHON", "venvlink/bin/python")
    assert main(["run", str(project), "--dry-run"]) == 0
    # launch/run-node.sh runs in the project's folder: it gets the absolute path, not one to resolve there
    assert f"PYTHON={venv / 'python'} " in capsys.readouterr().out
    assert interpreter(resolve(own_script_answers()), {}) == str(venv / "python")
    assert interpreter(resolve(own_script_answers()), {"PYTHON": "python3"}) == "python3"  # looked up on PATH


def test_a_dry_run_with_fresh_shows_the_ranks_starting_afresh(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    project = render_own(tmp_path)
    earlier_run(project, "20250101-100000", "failed")
    assert main(["run", str(project), "--dry-run"]) == 0
    assert "NPU_WIZARD_RESUMING=1" in capsys.readouterr().out
    assert main(["run", str(project), "--dry-run", "--fresh"]) == 0
    shown = capsys.readouterr().out
    assert "NPU_WIZARD_RESUMING=0" in shown and "NPU_WIZARD_RESUMING=1" not in shown
