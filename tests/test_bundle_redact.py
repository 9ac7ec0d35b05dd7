"""The bundle's Redactor on the forms a secret takes in logs and JSON beyond NAME=word."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from runtime.provenance import REDACTED
from wizard.bundle.redact import Redactor

SECRET = "s3cr3t-v4lue"
REPO = Path(__file__).resolve().parent.parent


@pytest.mark.parametrize(
    "line",
    [
        f'export HF_TOKEN="first {SECRET}"',  # before: only the first word of a quoted value went
        f"PASSWORD='{SECRET};{SECRET}'",
        f"python train.py --api-key {SECRET} --lr 0.1",  # before: an option's value as the next word stayed
        f'torchrun train.py --hf-token "{SECRET} x"',
        f'"DB_PASSWORD": "{SECRET} {SECRET}"',
    ],
)
def test_a_secret_on_a_command_line_or_in_quotes_is_removed_whole(line: str) -> None:
    out = Redactor().text(line)
    assert SECRET not in out and REDACTED in out, out


def test_an_argv_and_a_kubernetes_variable_in_json_lose_their_secret() -> None:
    document = {
        "argv": ["train.py", "--api-key", SECRET, "--lr", "0.1"],
        "env": [{"name": "HF_TOKEN", "value": SECRET}, {"name": "LR", "value": "0.1"}],
    }
    out = Redactor().json_document(json.dumps(document).encode()).decode()
    assert SECRET not in out
    kept = json.loads(out)
    assert kept["argv"][3:] == ["--lr", "0.1"] and kept["env"][1] == {"name": "LR", "value": "0.1"}


def test_what_is_no_secret_stays() -> None:
    text = "KeyError: 'lr'\npython train.py --api-key --verbose --lr 0.1\nHF_TOKEN=<removed: secret> left"
    assert Redactor().text(text) == text


def test_a_long_line_without_spaces_is_redacted_at_all() -> None:
    """A rank's line of progress dots (2 MiB, the most of a file a bundle keeps): before, every start inside
    the run was tried, in time quadratic in its length (40,000 characters took 98 s; 2 MiB, days)."""
    code = (
        "from wizard.bundle.redact import Redactor\n"
        f"out = Redactor().text('.' * {2 * 1024 * 1024} + ' HF_TOKEN={SECRET}')\n"
        f"assert out.endswith(' HF_TOKEN=<removed: secret>') and {SECRET!r} not in out\n"
    )
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
