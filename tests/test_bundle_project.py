"""`npu-wizard bundle` takes the answers of the project the run folder lies in, never of one run.json names.

run.json is anyone's to write (issue 36 item 39): a crafted `project` there must not make the bundle take
another project's answers.yaml (nor run its doctor, nor reach its ssh hosts).
"""

from __future__ import annotations

import json
from pathlib import Path

from wizard.bundle.collect import collect
from wizard.bundle.redact import Redactor


def project_with_answers(folder: Path, name: str) -> Path:
    """A folder holding an answers.yaml that names `name`."""
    folder.mkdir(parents=True)
    (folder / "answers.yaml").write_text(f"project_name: {name}\n")
    return folder


def run_folder(under: Path, named_project: Path) -> Path:
    """A run folder at `under` whose run.json names `named_project`."""
    (under / "events").mkdir(parents=True)
    (under / "events" / "rank-0.jsonl").write_text('{"event": "step", "rank": 0, "step": 3}\n')
    (under / "run.json").write_text(json.dumps({"project": str(named_project), "world_size": 1}))
    return under


def bundled(run_dir: Path) -> tuple[dict[str, bytes], list[str]]:
    """The members and the manifest's missing lines of a bundle of `run_dir`."""
    bundle = collect(run_dir, Redactor(), {"PATH": ""})
    return dict(bundle.members), bundle.missing


def test_a_run_json_naming_another_project_does_not_lend_the_bundle_its_answers(tmp_path: Path) -> None:
    mine = project_with_answers(tmp_path / "mine", "mine")
    other = project_with_answers(tmp_path / "other", "other-secret-project")
    members, _ = bundled(run_folder(mine / "runs" / "20260101-000000", named_project=other))
    assert members["answers.yaml"] == b"project_name: mine\n"


def test_a_run_folder_in_no_project_takes_no_answers_whatever_run_json_names(tmp_path: Path) -> None:
    other = project_with_answers(tmp_path / "other", "other-secret-project")
    members, missing = bundled(run_folder(tmp_path / "copied-run", named_project=other))
    assert "answers.yaml" not in members
    assert (
        "answers.yaml: the run folder lies in no project folder (PROJECT/runs/RUN with an answers.yaml); "
        "the project run.json names is not taken on its word"
    ) in missing
    assert "doctor.json: skipped: the run folder lies in no project folder to check" in missing
