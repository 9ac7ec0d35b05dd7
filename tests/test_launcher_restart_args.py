"""A rank that torchrun or torch_npu_run started again itself (--max-restarts) gets training.resume_args.

The launcher runs the same command line again, so launch/run-node.sh leaves the resume arguments in
NPU_WIZARD_RESUME_ARGS (quoted for the shell at render time) and runtime/userscript.py adds them where
TORCHELASTIC_RESTART_COUNT, which the launcher sets, is above 0. A real 1 x 2 torchrun run with a killed
rank is not used here: on the CPU, gloo's connect in a restarted round can meet the address a killed peer
left in torchrun's store and time out (a torch race a loaded machine shows), so such a run proves nothing
reliably about these arguments.
"""

from __future__ import annotations

import shlex
import subprocess
from pathlib import Path

import pytest

from runtime.userscript import launcher_restart_args
from tests.runs import free_port
from wizard.answers.model import resolve
from wizard.render.render import render

RESUME = "--init_from=resume --note 'two words' $(touch /tmp/never)"


def test_a_launcher_restart_adds_the_resume_arguments_and_says_it_resumes() -> None:
    env = {"TORCHELASTIC_RESTART_COUNT": "1", "NPU_WIZARD_RESUMING": "0", "NPU_WIZARD_RESUME_ARGS": RESUME}
    assert launcher_restart_args(env) == ["--init_from=resume", "--note", "two words", "$(touch", "/tmp/never)"]
    assert env["NPU_WIZARD_RESUMING"] == "1"


def test_a_first_start_or_a_start_that_already_resumes_gets_nothing_added() -> None:
    first = {"TORCHELASTIC_RESTART_COUNT": "0", "NPU_WIZARD_RESUMING": "0", "NPU_WIZARD_RESUME_ARGS": RESUME}
    assert launcher_restart_args(first) == [] and first["NPU_WIZARD_RESUMING"] == "0"
    # a whole-job resume: run-node.sh put the arguments on the command line already
    resuming = {"TORCHELASTIC_RESTART_COUNT": "2", "NPU_WIZARD_RESUMING": "1", "NPU_WIZARD_RESUME_ARGS": RESUME}
    assert launcher_restart_args(resuming) == []
    assert launcher_restart_args({"TORCHELASTIC_RESTART_COUNT": "x"}) == []


def test_run_node_sh_leaves_the_resume_arguments_quoted_for_a_launcher_restart(tmp_path: Path) -> None:
    answers = {
        "project_name": "own-restarts", "device": "cpu", "nodes": 1, "devices_per_node": 2, "launcher": "torchrun",
        "amp": "off", "network.host_ips": ["127.0.0.1"], "network.master_port": free_port(),
        "training.script": "train_gpt.py", "training.resume_args": RESUME,
    }  # fmt: skip
    script = (render(resolve(answers), tmp_path).project_dir / "launch" / "run-node.sh").read_text()
    (line,) = [line.strip() for line in script.splitlines() if "NPU_WIZARD_RESUME_ARGS=" in line]
    assert line.startswith("export NPU_WIZARD_RESUME_ARGS=")
    said = subprocess.run(
        ["bash", "-c", f'{line}; printf %s "$NPU_WIZARD_RESUME_ARGS"'], capture_output=True, text=True, check=True
    )
    # the answer's words, as the runtime will split them, and nothing of them ran
    assert shlex.split(said.stdout) == shlex.split(RESUME) and not Path("/tmp/never").exists()


def test_resume_arguments_that_do_not_split_are_named_on_the_ranks_log_not_dropped_silently(
    capsys: pytest.CaptureFixture[str],
) -> None:
    env = {"TORCHELASTIC_RESTART_COUNT": "1", "NPU_WIZARD_RESUMING": "0", "NPU_WIZARD_RESUME_ARGS": "--note 'open"}
    assert launcher_restart_args(env) == []
    said = capsys.readouterr().err
    assert 'NPU_WIZARD_RESUME_ARGS="--note \'open" does not split into arguments' in said
    assert "runs without training.resume_args" in said
