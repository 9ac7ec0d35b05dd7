"""A bundle made from a shell that lacks the job's secrets still removes them: the runner recorded keyed hashes
of their values (RUN/secret-marks.json), never the values, and the bundle finds the words that match."""

from __future__ import annotations

import json
import tarfile
from pathlib import Path

import pytest

from wizard.bundle.command import bundle
from wizard.run.secret_marks import MARKS_FILE, SecretMarks, read_secret_marks, record_secret_marks

JOB_ENV = {
    "HF_TOKEN": "hf_Abcdefghijklmnopqrstuvwxyz0123",
    "AWS_SECRET_ACCESS_KEY": "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY",
    "DB_PASSWORD": "correct-horse-77",
    "PATH": "/usr/bin",
}


def run_folder_of_a_job_that_printed_its_secrets(tmp_path: Path) -> Path:
    """A run folder whose job printed its secrets where no name says so, and whose runner recorded their marks."""
    run_dir = tmp_path / "project" / "runs" / "20260101-000000"
    (run_dir / "logs").mkdir(parents=True)
    (run_dir / "events").mkdir()
    (run_dir / "logs" / "rank-0.log").write_text(
        f"connecting as admin with correct-horse-77\nurl s3://bucket?sig={JOB_ENV['AWS_SECRET_ACCESS_KEY']}\n"
        f"login('{JOB_ENV['HF_TOKEN']}')\n"
    )
    (run_dir / "summary.json").write_text(json.dumps({"outcome": "failed", "said": "auth correct-horse-77 refused"}))
    (run_dir / "events" / "rank-0.jsonl").write_text(
        json.dumps({"event": "log", "rank": 0, "text": f"aws {JOB_ENV['AWS_SECRET_ACCESS_KEY']}"}) + "\n"
    )
    record_secret_marks(run_dir, JOB_ENV)
    return run_dir


def test_a_bundle_from_another_shell_removes_the_secrets_the_runner_marked(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    run_dir = run_folder_of_a_job_that_printed_its_secrets(tmp_path)
    for name in JOB_ENV:
        if name != "PATH":
            monkeypatch.delenv(name, raising=False)
    out = bundle(run_dir, tmp_path / "b.tar.gz")
    with tarfile.open(out) as tar:
        members = {m.name.split("/", 1)[1]: tar.extractfile(m).read() for m in tar.getmembers() if m.isfile()}
    assert MARKS_FILE not in members
    everything = b"".join(members.values())
    for value in ("correct-horse-77", JOB_ENV["AWS_SECRET_ACCESS_KEY"], JOB_ENV["HF_TOKEN"]):
        assert value.encode() not in everything
    assert b"connecting as admin with" in members["logs/rank-0.log"]


def test_the_marks_hold_no_secret_value_and_only_their_owner_reads_them(tmp_path: Path) -> None:
    run_dir = run_folder_of_a_job_that_printed_its_secrets(tmp_path)
    text = (run_dir / MARKS_FILE).read_text()
    assert all(value not in text for value in JOB_ENV.values() if value != "/usr/bin")
    assert (run_dir / MARKS_FILE).stat().st_mode & 0o777 == 0o600
    marks = read_secret_marks(run_dir)
    assert marks is not None and marks.names() == ["AWS_SECRET_ACCESS_KEY", "DB_PASSWORD", "HF_TOKEN"]


def test_a_word_is_matched_between_its_edges_and_nothing_else_is() -> None:
    marks = SecretMarks.of({"API_KEY": "s3cr3t-value"})
    assert marks.found_in("x=s3cr3t-value, y='s3cr3t-value' user:s3cr3t-value@host") == {"s3cr3t-value"}
    assert marks.found_in("s3cr3t-values and as3cr3t-value stay") == set()


def test_a_run_without_marks_says_in_the_manifest_what_could_not_be_checked(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    run_dir = run_folder_of_a_job_that_printed_its_secrets(tmp_path)
    (run_dir / MARKS_FILE).unlink()
    out = bundle(run_dir, tmp_path / "b.tar.gz")
    with tarfile.open(out) as tar:
        manifest = next(tar.extractfile(m).read() for m in tar.getmembers() if m.name.endswith("MANIFEST.txt"))
    assert b"no secret marks" in manifest
