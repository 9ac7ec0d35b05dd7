"""The template works with plain cookiecutter and gives the very same files as npu-wizard."""

from __future__ import annotations

import filecmp
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.matrix import ALL, case_answers
from wizard.answers.model import to_context
from wizard.render.render import render
from wizard.render.templates import cookiecutter_json, project_template


def plain_cookiecutter(context: dict[str, str], out: Path, scratch: Path) -> subprocess.CompletedProcess[str]:
    """Run the cookiecutter command line with --no-input and these variables, its TMPDIR the folder `scratch`.

    cookiecutter writes each hook it runs to a temporary file it never removes: in `scratch`, a folder of the test's,
    they go with the test's folder instead of piling up in /tmp.
    """
    pairs = [f"{key}={value}" for key, value in context.items()]
    scratch.mkdir(parents=True, exist_ok=True)
    return subprocess.run(
        [sys.executable, "-m", "cookiecutter", str(project_template()), "--no-input", "-o", str(out), *pairs],
        env={**os.environ, "TMPDIR": str(scratch)},
        capture_output=True,
        text=True,
        timeout=120,
    )


def same_tree(left: Path, right: Path) -> list[str]:
    """Differences between two folders (names and bytes), empty when identical."""
    diffs: list[str] = []

    def walk(compare: filecmp.dircmp) -> None:
        diffs.extend(compare.left_only + compare.right_only + compare.funny_files)
        _, mismatch, errors = filecmp.cmpfiles(compare.left, compare.right, compare.common_files, shallow=False)
        diffs.extend(mismatch + errors)
        for sub in compare.subdirs.values():
            walk(sub)

    walk(filecmp.dircmp(left, right, ignore=["__pycache__"]))
    return diffs


@pytest.mark.parametrize("case", [c for c in ALL if "torch-launch" in c or "example" in c or "mp-spawn" in c])
def test_plain_cookiecutter_gives_the_same_files(case: str, tmp_path: Path) -> None:
    answers = case_answers(case)
    ours = render(answers, tmp_path / "ours").project_dir
    result = plain_cookiecutter(to_context(answers), tmp_path / "plain", tmp_path / "tmp")
    assert result.returncode == 0, result.stderr
    assert same_tree(ours, tmp_path / "plain" / answers["project_name"]) == []


def test_plain_cookiecutter_hook_rejects_bad_values_and_writes_nothing(tmp_path: Path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    result = plain_cookiecutter({"hardware": "atlas-training", "amp": "bf16", "nodes": "0"}, out, tmp_path / "tmp")
    assert result.returncode != 0
    assert "amp: 'bf16': refused" in result.stderr + result.stdout
    assert "nodes: '0': must be at least 1" in result.stderr + result.stdout
    assert list(out.iterdir()) == []
    # the copy cookiecutter made of the hook it ran (and never removes) is in the test's folder, not in /tmp
    assert [path.name for path in (tmp_path / "tmp").iterdir() if path.suffix == ".py"], "TMPDIR was not followed"


def test_plain_cookiecutter_defaults_render(tmp_path: Path) -> None:
    result = plain_cookiecutter({}, tmp_path / "out", tmp_path / "tmp")
    assert result.returncode == 0, result.stderr
    assert (tmp_path / "out" / "ddp-npu" / "launch" / "node0.sh").is_file()


def test_cookiecutter_json_follows_the_question_spec() -> None:
    import json

    recorded = json.loads((project_template() / "cookiecutter.json").read_text())
    assert recorded == cookiecutter_json(), "regenerate: python -m wizard.templates"


def test_the_tree_renderer_names_each_path_as_cookiecutter_does_with_or_without_jinja_in_it(tmp_path: Path) -> None:
    from cookiecutter.generate import generate_files

    from wizard.render.template_tree import render_tree
    from wizard.render.templates import TEMPLATE_SETTINGS

    template = tmp_path / "template"
    top = template / "{{cookiecutter.name}}"
    # a plain name is written as it is; a carriage return, which Jinja's lexer makes a newline, is not plain
    names = ["plain.txt", "line\rbreak.txt", "{{ cookiecutter.name }}.txt", "{# a note #}kept.txt"]
    names.append("sub/{% if 1 %}on{% endif %}")
    for name in names:
        (top / name).parent.mkdir(parents=True, exist_ok=True)
        (top / name).write_text("{{ cookiecutter.name }}\n")
    (tmp_path / "ours").mkdir()
    ours = render_tree(template, {"name": "demo"}, tmp_path / "ours", cache=None)
    context = {"cookiecutter": {"name": "demo", **TEMPLATE_SETTINGS}}
    theirs = Path(generate_files(repo_dir=str(template), context=context, output_dir=str(tmp_path / "theirs")))

    assert same_tree(ours, theirs) == []
    written = sorted(path.relative_to(ours).as_posix() for path in ours.rglob("*") if path.is_file())
    assert written == ["demo.txt", "kept.txt", "line\nbreak.txt", "plain.txt", "sub/on"]
