"""The bundle's Redactor on the forms a secret takes in logs and JSON beyond NAME=word."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from runtime.events import EventWriter
from runtime.secret_shapes import ARGUMENTS_LEFT_OUT, REDACTED
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


HF_TOKEN_SHAPE = "hf_" + "AbCdEfGhIjKlMnOpQrStUvWxYz01234567"
SSH_WITH_PASSWORD = f"sshpass -p {SECRET} ssh -o StrictHostKeyChecking=no -o BatchMode=no"


@pytest.mark.parametrize(
    "line",
    [
        SSH_WITH_PASSWORD,
        f"sshpass -p{SECRET} ssh node1",
        f"git clone https://user:{SECRET}@git.example.com/team/repo.git",
        f"http_proxy=http://proxyuser:{SECRET}@proxy.example.com:3128",
        f"Authorization: Bearer {SECRET}",
        f"curl -H 'authorization: bearer {SECRET}' https://example.com",
        f"mysql -uroot -p{SECRET} results",
        f"huggingface-cli login {HF_TOKEN_SHAPE}",
    ],
)
def test_a_password_or_token_in_a_known_shape_is_removed(line: str) -> None:
    """Shapes no secret-named variable announces: sshpass -p, URL userinfo, a bearer header, mysql -p, hf_ tokens."""
    out = Redactor().text(line)
    assert SECRET not in out and HF_TOKEN_SHAPE not in out and REDACTED in out, out


def test_ssh_options_that_say_key_are_no_secrets() -> None:
    line = "ssh -o StrictHostKeyChecking=no -o HostKeyAlgorithms=+ssh-rsa -o PubkeyAuthentication=yes node1"
    assert Redactor().text(line) == line
    assert Redactor().value({"argv": ["ssh", "-o", "StrictHostKeyChecking=no"]}) == {
        "argv": ["ssh", "-o", "StrictHostKeyChecking=no"]
    }


def test_a_ranks_started_event_records_only_the_program_of_the_ssh_command(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """NPU_WIZARD_SSH_COMMAND lands in every rank's started event: its program only; URL passwords go too."""
    monkeypatch.setenv("NPU_WIZARD_SSH_COMMAND", SSH_WITH_PASSWORD)
    monkeypatch.setenv("NPU_WIZARD_PROXY", f"http://proxyuser:{SECRET}@proxy.example.com:3128")
    writer = EventWriter(tmp_path, 0)
    writer.started(local_rank=0, node=0, device="cpu", world_size=1)
    writer.error(RuntimeError(f"GET https://user:{SECRET}@hub.example.com failed"))
    writer.close()

    recorded = (tmp_path / "events" / "rank-0.jsonl").read_text()
    assert SECRET not in recorded
    environment = json.loads(recorded.splitlines()[0])["environment"]
    assert environment["NPU_WIZARD_SSH_COMMAND"] == f"sshpass {ARGUMENTS_LEFT_OUT}"
    assert environment["NPU_WIZARD_PROXY"] == f"http://proxyuser:{REDACTED}@proxy.example.com:3128"


def test_the_bundles_environment_keeps_only_the_program_of_an_ssh_command_an_older_runtime_recorded() -> None:
    environment = {"rank 0": {"NPU_WIZARD_SSH_COMMAND": f"/usr/bin/sshpass -p{SECRET} ssh", "HCCL_IF_IP": "10.0.0.1"}}
    assert Redactor().value(environment) == {
        "rank 0": {"NPU_WIZARD_SSH_COMMAND": f"/usr/bin/sshpass {ARGUMENTS_LEFT_OUT}", "HCCL_IF_IP": "10.0.0.1"}
    }


@pytest.mark.parametrize("repeated", ["mysql ", "sshpass -f ", "x://u:", "authorization: "])
def test_a_long_line_of_a_shapes_start_is_scrubbed_in_linear_time(repeated: str) -> None:
    """Each shape's scan is bounded: 2 MB of repeated starts took minutes when one scanned to the line's end."""
    code = (
        "from runtime.secret_shapes import scrub\n"
        f"assert scrub({repeated!r} * {2_000_000 // len(repeated)} + ' hf_{'x' * 34}').endswith(' <removed: secret>')\n"
    )
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
