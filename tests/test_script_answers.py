"""training.script and training.script_args: checked like every answer, and a foreign script replaces train.py."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.factories import answers, answers_yaml
from tests.runs import free_port
from tests.test_doctor_command import stand_in_torch_npu
from wizard.answers.model import dump, from_context, load_text, resolve, to_context
from wizard.errors import AnswersError
from wizard.monitor.summary_text import ETA_NEEDS_TOTAL
from wizard.render.render import render

BASE = {"project_name": "mine", "device": "cpu", "nodes": 1, "devices_per_node": 2, "amp": "off"}


def problems_of(raw: dict) -> list[str]:
    """The error lines resolve() reports for BASE updated with `raw`."""
    with pytest.raises(AnswersError) as caught:
        resolve({**BASE, **raw})
    return [str(p) for p in caught.value.problems]


@pytest.mark.parametrize(
    ("script", "words"),
    [
        ("/home/me/train_mine.py", "is absolute: give the path relative to the project folder"),
        ("~/train_mine.py", "is absolute"),
        ("../elsewhere/train.py", "leaves the project folder ('..')"),
        ("src/../../train.py", "leaves the project folder ('..')"),
        ("src/main.txt", "not a Python file: the script's name must end in .py"),
        ("src/", "not a Python file"),
        ("launch/mine.py", "lies in launch/, which npu-wizard writes and replaces"),
        ("runtime/mine.py", "lies in runtime/"),
        ("-mine.py", "starts with '-'"),
        ("src\\main.py", "separate folders with '/'"),
        ("src/main\n.py", "control character"),
        (7, "must be a path relative to the project folder"),
    ],
)
def test_a_script_outside_the_project_or_not_python_is_refused(script: object, words: str) -> None:
    (line,) = problems_of({"training.script": script})
    assert line.startswith("training.script: ") and words in line


@pytest.mark.parametrize(
    ("args", "words"),
    [
        ([1, "--x"], "argument 1 (1) is not a string: quote it"),
        (["--x", None], "argument 2 (None) is not a string"),
        ("--name 'unclosed", "cannot split the line into arguments: No closing quotation"),
        ({"a": 1}, "must be a list of strings"),
        (["--x", "a\nb"], "argument 2 holds a control character"),
    ],
)
def test_script_arguments_must_be_strings(args: object, words: str) -> None:
    (line,) = problems_of({"training.script": "src/main.py", "training.script_args": args})
    assert line.startswith("training.script_args: ") and words in line


def test_a_script_path_is_normalised_and_train_py_is_the_users_like_any_name() -> None:
    assert resolve({**BASE, "training.script": "./src//main.py"})["training.script"] == "src/main.py"
    own = resolve({**BASE, "training.script": "./train.py"})
    assert own["training.script"] == "train.py"
    assert own.get("training.model") is None and own.get("training.script_args") == ()


def test_no_script_or_an_empty_one_is_the_generated_train_py() -> None:
    for raw in ({}, {"training.script": ""}, {"training.script": None}):
        generated = resolve({**BASE, **raw})
        assert generated["training.script"] is None
        assert generated.get("training.model") == "mlp" and generated.get("training.script_args") is None


def test_a_foreign_script_drops_the_model_and_dataset_questions() -> None:
    own = resolve({**BASE, "training.script": "src/main.py"})
    assert own["training.script_args"] == ()
    assert own.get("training.model") is None and own.get("training.dataset") is None
    with_model = resolve({**BASE, "training.script": "src/main.py", "training.model": "mlp"})
    assert [str(w) for w in with_model.warnings] == [
        "training.model: 'mlp': ignored: it does not apply to these answers"
    ]


def test_mp_spawn_cannot_start_a_foreign_script_and_says_which_launcher_to_pick() -> None:
    lines = problems_of({"launcher": "mp-spawn", "training.script": "src/main.py"})
    assert lines == [
        "launcher: 'mp-spawn': mp-spawn needs the script to start its own ranks with torch.multiprocessing, "
        "which the generated train.py does and src/main.py cannot be made to; pick torchrun "
        "(or torch-npu-run on NPU)"
    ]
    assert resolve({**BASE, "launcher": "mp-spawn"})["launcher"] == "mp-spawn"


def test_arguments_with_spaces_commas_and_quotes_survive_the_file_and_the_template_context() -> None:
    args = ["--data", "/data/my set", "--tags", "a,b", "--name", "it's", ""]
    own = answers(training__script="src/main.py", training__script_args=args)
    assert load_text(dump(own))["training.script_args"] == tuple(args)
    assert from_context(to_context(own))["training.script_args"] == tuple(args)
    typed = resolve({**BASE, "training.script": "src/main.py", "training.script_args": "--data '/data/my set' -v"})
    assert typed["training.script_args"] == ("--data", "/data/my set", "-v")


def test_an_answers_file_with_a_script_and_arguments_loads() -> None:
    text = answers_yaml(
        {
            "project_name": "mine",
            "device": "cpu",
            "amp": "off",
            "devices_per_node": 2,
            "training": {"script": "src/main.py", "script_args": ["--epochs", "2"]},
        }
    )
    loaded = load_text(text)
    assert (loaded["training.script"], loaded["training.script_args"]) == ("src/main.py", ("--epochs", "2"))


def test_a_foreign_script_project_has_no_generated_train_py(tmp_path: Path) -> None:
    own = render(answers(training__script="src/main.py"), tmp_path / "own")
    assert "train.py" not in own.files and not (own.project_dir / "train.py").exists()
    generated = render(answers(), tmp_path / "generated")
    assert "train.py" in generated.files


def test_the_readme_of_a_foreign_project_shows_the_backend_lines_and_the_report_calls(tmp_path: Path) -> None:
    own = render(answers(training__script="src/my main.py", training__script_args=["--name", "it's"]), tmp_path / "a")
    readme = (own.project_dir / "README.md").read_text()
    blocks = re.findall(r"```python\n(.*?)```", readme, flags=re.DOTALL)
    assert len(blocks) == 3  # the backend lines, the report calls, saving before being stopped
    for block in blocks:
        compile(block, "README.md", "exec")  # each snippet is Python a user can paste
    assert "import torch_npu" in blocks[0] and 'backend = "hccl" if device == "npu" else "gloo"' in blocks[0]
    assert "from runtime import report" in blocks[1]
    assert "data_s=data_s, forward_s=forward_s," in blocks[1] and "total_steps=epochs * len(loader)," in blocks[1]
    words = " ".join(readme.split())
    assert "`total_steps` (the steps of the whole run) gives the ETA" in words
    assert f"without it the monitor shows `{ETA_NEEDS_TOTAL}` where the time left would be" in words
    assert "report.checkpoint(step, path)" in blocks[1]
    assert "report.should_stop_together()" in blocks[2] and "report.PREEMPTED_EXIT" in blocks[2]
    assert "python -m runtime.userscript 'src/my main.py' --name 'it'\"'\"'s'" in readme
    assert "the summary names the first rank that failed and quotes the end of its log" in readme
    generated = (render(answers(), tmp_path / "b").project_dir / "README.md").read_text()
    assert "## Your script" not in generated and "runtime.userscript" not in generated


@pytest.mark.parametrize("device", ["cpu", "npu", "auto"])
def test_the_readme_says_where_the_script_learns_its_device_and_what_auto_means(tmp_path: Path, device: str) -> None:
    own = render(answers(training__script="src/main.py", device=device), tmp_path / "a")
    words = " ".join((own.project_dir / "README.md").read_text().split())
    assert 'export as `NPU_WIZARD_DEVICE` (`device = os.environ.get("NPU_WIZARD_DEVICE", "npu")`)' in words
    auto = 'This project asks for `auto`: there, take `"npu"` where `torch.npu.is_available()` after the import'
    assert (auto in words) == (device == "auto")


def test_the_readmes_backend_lines_run_and_give_gloo_on_a_cpu_project(tmp_path: Path) -> None:
    own = answers(training__script="src/main.py")
    readme = (render(own, tmp_path / "a").project_dir / "README.md").read_text()
    backend_lines = re.findall(r"```python\n(.*?)```", readme, flags=re.DOTALL)[0]
    # What the user's script has around them: torch imported, the project's device; then the backend it got.
    script = f"import torch\ndevice = {own['device']!r}\n{backend_lines}print(torch.distributed.get_backend())\n"
    # torch_npu cannot be installed here: an empty package stands in for its import
    stand_in = stand_in_torch_npu(tmp_path, "")
    rank = {"RANK": "0", "WORLD_SIZE": "1", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port())}
    result = subprocess.run(
        [sys.executable, "-c", script],
        env={**os.environ, "PYTHONPATH": str(stand_in), **rank},
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == ["gloo"]
