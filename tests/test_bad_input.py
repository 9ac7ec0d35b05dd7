"""Bad input gets one clear message and exit 1, never a traceback, never a default, and writes nothing."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.factories import answers_yaml
from tests.test_hostfile import npu_wizard, received_project_naming, tree
from tests.wizard_forks import wizard
from wizard.answers.model import load_text
from wizard.errors import SHOWN_PROBLEMS, AnswersError

GOOD = answers_yaml({"project_name": "demo", "device": "cpu", "devices_per_node": 2})


def run_cli(*args: str, stdin: bytes = b"") -> subprocess.CompletedProcess[str]:
    """The real command, a process of its own under a UTF-8 locale (tests/wizard_forks.py); output decoded as
    text."""
    result = wizard(args, input=stdin, timeout=120, env={"LC_ALL": "C.UTF-8", "PATH": "/usr/bin:/bin"}, text=False)
    return subprocess.CompletedProcess(result.args, result.returncode, result.stdout.decode(), result.stderr.decode())


def refused(result: subprocess.CompletedProcess[str], *expected: str) -> None:
    """Exit 1, a short message holding each expected text, no traceback."""
    assert result.returncode == 1, result.stdout + result.stderr
    assert "Traceback" not in result.stderr
    assert len(result.stderr) < 600, result.stderr
    assert len(result.stderr.splitlines()) <= 3, result.stderr
    for text in expected:
        assert text in result.stderr


def render_file(tmp_path: Path, text: str | bytes) -> subprocess.CompletedProcess[str]:
    """Render from an answers file holding `text` into tmp_path/out."""
    path = tmp_path / "a.yaml"
    path.write_bytes(text.encode() if isinstance(text, str) else text)
    return run_cli("--answers", str(path), "-o", str(tmp_path / "out"))


@pytest.mark.parametrize("text", ["", "\n\n", "# only a comment\n", "---\n"])
def test_an_empty_answers_file_is_refused(text: str, tmp_path: Path) -> None:
    refused(render_file(tmp_path, text), "the answers file is empty")
    assert not (tmp_path / "out").exists()


def test_empty_stdin_is_refused(tmp_path: Path) -> None:
    refused(run_cli("--answers", "-", "-o", str(tmp_path / "out")), "the answers file is empty")
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (GOOD + "nodes: 1\nnodes: 2\n", "nodes: given twice, at lines 5 and 6; keep one"),
        (
            GOOD + "network:\n  host_ips: [10.0.0.1, 10.0.0.2]\nnodes: 2\nnetwork:\n  master_port: 29600\n",
            "network: given twice, at lines 5 and 8; keep one",
        ),
        (
            GOOD + "network:\n  master_port: 29600\n  nic: eth0\n  master_port: 29700\n",
            "network.master_port: given twice, at lines 6 and 8; keep one",
        ),
        (
            GOOD + "network.master_port: 29600\nnetwork:\n  nic: eth0\n  master_port: 29700\n",
            "network.master_port: given twice, at lines 5 and 8; keep one",
        ),
        (
            GOOD + "network:\n  master_port: 29600\nnodes: 1\nnetwork.master_port: 29700\n",
            "network.master_port: given twice, at lines 6 and 8; keep one",
        ),
    ],
    ids=["key", "section", "key-in-section", "dotted-then-nested", "nested-then-dotted"],
)
def test_a_key_or_section_given_twice_is_refused_naming_both_lines(text: str, message: str, tmp_path: Path) -> None:
    refused(render_file(tmp_path, text), message)
    assert not (tmp_path / "out").exists()


def test_an_alias_bomb_is_refused_before_it_expands(tmp_path: Path) -> None:
    levels = ["a0: &a0 [x, x, x, x, x, x, x, x, x]"]
    levels += [f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 9)}]" for i in range(1, 10)]
    refused(render_file(tmp_path, "\n".join(levels) + "\n"), "more than 16 aliases")


def test_a_value_that_holds_itself_is_refused(tmp_path: Path) -> None:
    refused(render_file(tmp_path, GOOD + "nic: &n [*n]\n"), "an alias refers to the value that holds it")


def test_a_few_aliases_still_work(tmp_path: Path) -> None:
    text = GOOD + "nodes: 2\nnetwork:\n  host_ips: &ips [127.0.0.1, 127.0.0.1]\n  master_addr: 127.0.0.1\n"
    assert load_text(text)["network.host_ips"] == ("127.0.0.1", "127.0.0.1")


def test_deeply_nested_yaml_is_refused(tmp_path: Path) -> None:
    refused(render_file(tmp_path, "nic: " + "[" * 5000 + "]" * 5000 + "\n"), "nested more than 32 levels deep")


def test_an_integer_of_thousands_of_digits_is_refused(tmp_path: Path) -> None:
    refused(render_file(tmp_path, GOOD + "nodes: " + "9" * 5000 + "\n"), "line 5: a number of 5000 digits")


@pytest.mark.parametrize("where", ["stdin", "file"])
def test_answers_that_are_not_utf8_are_refused(where: str, tmp_path: Path) -> None:
    data = GOOD.encode() + b"nic: \xff\xfe\n"
    if where == "stdin":
        refused(run_cli("--answers", "-", "-o", str(tmp_path / "out"), stdin=data), "stdin are not UTF-8 text")
    else:
        refused(render_file(tmp_path, data), "is not UTF-8 text")
    assert not (tmp_path / "out").exists()


def test_a_long_bad_value_is_quoted_at_most_80_characters(tmp_path: Path) -> None:
    result = render_file(tmp_path, GOOD + f"network:\n  nic: {'e' * 10_000}\n")
    refused(result, "network.nic: 'eeee", "... (10002 characters): too long: at most 255 characters")


def test_a_huge_answers_file_is_refused_unread(tmp_path: Path) -> None:
    text = GOOD + "".join(f"unknown{i}: {i}\n" for i in range(700_000))
    refused(render_file(tmp_path, text), "at most 1,048,576")


def test_many_unknown_keys_list_a_capped_number_of_problems() -> None:
    text = GOOD + "epochz: 1\n" + "".join(f"unknown_key_{i}: {i}\n" for i in range(1998)) + "nodez: 2\n"
    with pytest.raises(AnswersError) as error:
        load_text(text)
    assert len(error.value.problems) == 2000
    message = str(error.value).splitlines()
    assert message[0] == "2000 problems in the answers (nothing was written):"
    assert len(message) == SHOWN_PROBLEMS + 2
    assert message[-1] == f"  ... and {2000 - SHOWN_PROBLEMS} more"
    # Suggestions only for the problems shown: past them no fuzzy matching is done.
    assert "did you mean" in error.value.problems[0].message
    assert error.value.problems[-1].message == "unknown key"


# ---- the output folder --------------------------------------------------------------


@pytest.fixture
def read_only_folder(tmp_path: Path) -> Iterator[Path]:
    """A folder on a read-only bind mount (root can write anywhere else)."""
    folder = tmp_path / "ro"
    folder.mkdir()
    mounted = subprocess.run(["mount", "--bind", str(folder), str(folder)], capture_output=True)
    if mounted.returncode != 0:
        pytest.skip(f"mount --bind is not permitted here: {mounted.stderr.decode().strip()}")
    try:
        subprocess.run(["mount", "-o", "remount,bind,ro", str(folder)], check=True)
        yield folder
    finally:
        subprocess.run(["umount", str(folder)], check=True)


def test_a_read_only_output_folder_is_refused(read_only_folder: Path, tmp_path: Path) -> None:
    (tmp_path / "a.yaml").write_text(GOOD)
    for output in (read_only_folder, read_only_folder / "new" / "deeper"):
        result = run_cli("--answers", str(tmp_path / "a.yaml"), "-o", str(output))
        refused(result, f"cannot write in {output}: Read-only file system; choose another -o")
    assert list(read_only_folder.iterdir()) == []


def test_an_output_folder_that_cannot_be_made_is_refused(tmp_path: Path) -> None:
    (tmp_path / "a.yaml").write_text(GOOD)
    result = run_cli("--answers", str(tmp_path / "a.yaml"), "-o", "/proc/npu-wizard-test")
    refused(result, "cannot write in /proc/npu-wizard-test")


def test_a_dangling_symlink_output_is_refused(tmp_path: Path) -> None:
    (tmp_path / "a.yaml").write_text(GOOD)
    (tmp_path / "link").symlink_to(tmp_path / "gone")
    result = run_cli("--answers", str(tmp_path / "a.yaml"), "-o", str(tmp_path / "link"))
    refused(result, f"{tmp_path / 'link'} is a symlink to {tmp_path / 'gone'}, which does not exist")
    assert not (tmp_path / "gone").exists()


PAST_THE_LAST_PORT = [
    # (answers, the port or range the message names)
    ({"network": {"master_port": 65535}}, "65536"),
    ({"network": {"hccl_base_port": 65520, "hccl_port_count": 32}}, "65520-65551"),
    ({"cluster": {"engine": "slurm"}, "network": {"master_port": 65000}}, "65000-65999"),
    ({"cluster": {"engine": "slurm"}, "network": {"hccl_base_port": 65000}}, "65000-67047"),
]


@pytest.mark.parametrize(("extra", "named"), PAST_THE_LAST_PORT)
def test_a_derived_port_past_65535_is_refused_naming_it(extra: dict, named: str, tmp_path: Path) -> None:
    document = {"project_name": "demo", "device": "cpu", "devices_per_node": 2, **extra}
    refused(render_file(tmp_path, answers_yaml(document)), named, "65535")
    assert not (tmp_path / "out").exists()


def test_run_refuses_a_project_whose_status_port_would_be_65536(tmp_path: Path) -> None:
    render_file(tmp_path, answers_yaml({"project_name": "demo", "device": "cpu", "devices_per_node": 2}))
    project = tmp_path / "out" / "demo"
    answers_file = project / "answers.yaml"
    answers_file.write_text(answers_file.read_text().replace("master_port: 29500", "master_port: 65535"))
    refused(run_cli("run", str(project)), "network.master_port: 65535", "65536")
    assert not (project / "runs").exists()


def test_run_refuses_a_status_port_past_65535(tmp_path: Path) -> None:
    render_file(tmp_path, GOOD)
    project = tmp_path / "out" / "demo"
    result = run_cli("run", str(project), "--status-port", "65536")
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr
    assert "--status-port: '65536': give a port from 1 to 65535" in result.stderr
    assert not (project / "runs").exists()


@pytest.mark.parametrize(
    ("command", "option", "value", "message"),
    [
        ("run", "--hang-after", "nan", "argument --hang-after: 'nan': give a number of seconds above 0"),
        ("run", "--hang-after", "-1", "argument --hang-after: '-1': give a number of seconds above 0"),
        ("run", "--hang-after", "inf", "argument --hang-after: 'inf': give a number of seconds above 0"),
        ("run", "--interval", "0", "argument --interval: '0': give a number of seconds above 0"),
        ("run", "--max-restarts", "-5", "argument --max-restarts: '-5': give a whole number, 0 or more"),
        ("monitor", "--hang-after", "nan", "argument --hang-after: 'nan': give a number of seconds above 0"),
    ],
)
def test_run_and_monitor_refuse_seconds_or_restarts_that_mean_nothing(
    command: str, option: str, value: str, message: str, tmp_path: Path
) -> None:
    render_file(tmp_path, GOOD)
    project = tmp_path / "out" / "demo"
    dry = ("--dry-run",) if command == "run" else ()  # were it accepted, print the commands and start nothing
    result = run_cli(command, str(project), option, value, *dry)
    assert result.returncode == 2, result.stdout + result.stderr
    assert "Traceback" not in result.stderr
    assert f"npu-wizard {command}: error: {message}" in result.stderr
    assert not (project / "runs").exists()


def test_an_endless_answers_file_is_refused_after_4_mib(tmp_path: Path) -> None:
    result = npu_wizard("--answers", "/dev/zero", "-o", str(tmp_path / "out"), cwd=tmp_path)
    refused(result, "answers file /dev/zero holds over 4 MiB; at most 1,048,576 characters are read")
    assert not (tmp_path / "out").exists()


def test_update_refuses_a_project_whose_answers_file_is_a_fifo(tmp_path: Path) -> None:
    project = received_project_naming(tmp_path, str(tmp_path / "unused"))
    (project / "answers.yaml").unlink()
    os.mkfifo(project / "answers.yaml")
    before = tree(project)

    result = npu_wizard("update", str(project), cwd=tmp_path)

    refused(result, f"{project / 'answers.yaml'} is not a plain file (a FIFO, a device or a folder)")
    assert tree(project) == before


def test_render_force_over_a_project_whose_answers_file_is_a_fifo_is_refused(tmp_path: Path) -> None:
    project = received_project_naming(tmp_path, str(tmp_path / "unused"))
    (project / "answers.yaml").unlink()
    os.mkfifo(project / "answers.yaml")
    before = tree(project)
    answers = tmp_path / "new.yaml"
    answers.write_text(answers_yaml({"project_name": "received", "device": "cpu", "devices_per_node": 1}))

    result = npu_wizard("--answers", str(answers), "-o", str(tmp_path), "--force", cwd=tmp_path)

    refused(result, f"{project / 'answers.yaml'} is not a plain file", "the project was left as it was")
    assert tree(project) == before
    assert (project / "answers.yaml").is_fifo()


@pytest.mark.parametrize("command", ["run", "doctor"])
def test_a_project_whose_answers_file_is_not_utf8_is_refused_naming_it(command: str, tmp_path: Path) -> None:
    render_file(tmp_path, GOOD)
    project = tmp_path / "out" / "demo"
    answers_file = project / "answers.yaml"
    answers_file.write_bytes(answers_file.read_bytes() + b"# \xff\n")
    before = tree(project)

    result = npu_wizard(command, str(project), cwd=tmp_path)

    refused(result, f"answers file {answers_file} is not UTF-8 text")
    assert tree(project) == before


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ("training:\n  lr: 1_0.5\n", "the answers file, line 6: 1_0.5: YAML reads it as a number without the '_'"),
        ("nodes: 1:30\n", "nodes: '1:30': must be"),
        (
            "network: {<<: {master_port: 29600}, master_port: 29500}\n",
            "the answers file, line 5: the merge key '<<' is not read in answers; write the keys out",
        ),
    ],
    ids=["underscore-float", "base-60-int", "merge-key"],
)
def test_numbers_yaml_1_1_misreads_and_merge_keys_are_refused(line: str, message: str, tmp_path: Path) -> None:
    refused(render_file(tmp_path, GOOD + line), message)
    assert not (tmp_path / "out").exists()
