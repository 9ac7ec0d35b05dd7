"""Host lists for large clusters: `network.hostfile`, address ranges and pasted lists, through the real command."""

from __future__ import annotations

import os
import resource
import subprocess
from pathlib import Path

import pytest
import yaml

from tests.wizard_forks import wizard
from wizard.answers import hostfile
from wizard.answers.hostfile import Host, HostListError, expand, parse
from wizard.answers.model import resolve
from wizard.errors import AnswersError, Problem

HOSTFILE = """\
# rack 7, node 0 first
10.0.0.11 slots=8
10.0.0.12 slots=8   # the one with the big disk

10.0.0.13-10.0.0.14
"""


def render_cli(answers: Path, out: Path, cwd: Path) -> subprocess.CompletedProcess[str]:
    """`npu-wizard --answers FILE -o OUT`, run from `cwd`, a process of its own (tests/wizard_forks.py)."""
    return wizard(["--answers", str(answers), "-o", str(out)], timeout=120, cwd=cwd)


def write_answers(folder: Path, **network: object) -> Path:
    """An answers file for 4 nodes x 8 devices with these network answers."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "answers.yaml"
    path.write_text(yaml.safe_dump({"project_name": "big", "nodes": 4, "devices_per_node": 8, "network": network}))
    return path


def test_a_hostfile_gives_the_host_ips_and_a_relative_path_is_taken_from_the_answers_file(tmp_path: Path) -> None:
    (tmp_path / "cluster").mkdir()
    (tmp_path / "cluster" / "hosts").write_text(HOSTFILE)
    answers = write_answers(tmp_path / "cluster", hostfile="hosts")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()

    result = render_cli(answers, tmp_path / "out", cwd=elsewhere)

    assert result.returncode == 0, result.stderr
    project = tmp_path / "out" / "big"
    recorded = yaml.safe_load((project / "answers.yaml").read_text())["network"]
    assert recorded["host_ips"] == ["10.0.0.11", "10.0.0.12", "10.0.0.13", "10.0.0.14"]
    assert "hostfile" not in recorded  # the project keeps the addresses, not a path to another file
    assert "export NODE_ADDR=10.0.0.14" in (project / "launch" / "node3.sh").read_text().splitlines()


def as_shown(path: Path, message: str) -> str:
    """The problem line for a hostfile's path, shortened as every message shortens a long value (a long TMPDIR)."""
    return str(Problem("network.hostfile", str(path), message))


def test_every_problem_of_a_hostfile_is_listed_with_its_line_and_nothing_is_written(tmp_path: Path) -> None:
    (tmp_path / "hosts").write_text("10.0.0.11\nnode-a\n10.0.0.12 gpus=8\n")
    result = render_cli(write_answers(tmp_path, hostfile="hosts"), tmp_path / "out", cwd=tmp_path)
    assert result.returncode == 1
    message = "line 2: not an IP address; line 3: only slots=N and the word spare may follow the address"
    assert as_shown(tmp_path / "hosts", message) in result.stderr
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(
    ("hosts", "message"),
    [
        ("10.0.0.11\n10.0.0.12\n", "give one address per node: 4 expected, 2 given"),
        ("10.0.0.11\n10.0.0.12\n10.0.0.11\n10.0.0.13\n", "each node needs its own address; repeated: 10.0.0.11"),
        ("10.0.0.11-10.0.0.13\n10.0.0.14 slots=16\n", "line 2 slots=16: every node runs devices_per_node = 8 ranks"),
        ("# nothing yet\n", "no host addresses in it (one per line, # for comments)"),
    ],
)
def test_a_hostfile_is_checked_like_host_ips(tmp_path: Path, hosts: str, message: str) -> None:
    (tmp_path / "hosts").write_text(hosts)
    with pytest.raises(AnswersError) as raised:
        resolve({"nodes": 4, "devices_per_node": 8, "network.hostfile": str(tmp_path / "hosts")})
    assert [(p.field, p.message) for p in raised.value.problems] == [("network.hostfile", message)]


def test_a_missing_hostfile_and_a_hostfile_beside_host_ips_are_refused(tmp_path: Path) -> None:
    with pytest.raises(AnswersError) as raised:
        resolve({"nodes": 1, "network.hostfile": str(tmp_path / "nope")})
    assert [(p.field, p.message) for p in raised.value.problems] == [
        ("network.hostfile", "cannot read it: No such file or directory")
    ]
    (tmp_path / "hosts").write_text("10.0.0.11\n")
    with pytest.raises(AnswersError) as raised:
        resolve({"nodes": 1, "network.hostfile": str(tmp_path / "hosts"), "network.host_ips": ["10.0.0.11"]})
    assert [(p.field, p.message) for p in raised.value.problems] == [
        ("network.host_ips", "give network.hostfile or this, not both")
    ]


def test_hostfile_lines_keep_their_numbers_and_slots() -> None:
    assert parse(HOSTFILE) == [
        Host("10.0.0.11", 8, 2),
        Host("10.0.0.12", 8, 3),
        Host("10.0.0.13", None, 5),
        Host("10.0.0.14", None, 5),
    ]
    with pytest.raises(HostListError, match="line 1: 10.0.0.9-10.0.0.1: a range runs from a lower to a higher"):
        parse("10.0.0.9-10.0.0.1\n")


def test_host_ips_take_ranges_and_pasted_lists() -> None:
    ranged = resolve({"nodes": 64, "network.host_ips": "10.0.0.11-10.0.0.74", "network.master_addr": "10.0.0.11"})
    assert ranged["network.host_ips"] == tuple(f"10.0.0.{n}" for n in range(11, 75))
    across = resolve({"nodes": 5, "network.host_ips": ["10.0.0.254-10.0.1.1", "10.0.2.5"]})
    assert across["network.host_ips"] == ("10.0.0.254", "10.0.0.255", "10.0.1.0", "10.0.1.1", "10.0.2.5")
    pasted = resolve({"nodes": 3, "network.host_ips": "10.0.0.1\n10.0.0.2 10.0.0.3\n"})
    assert pasted["network.host_ips"] == ("10.0.0.1", "10.0.0.2", "10.0.0.3")


ADDRESS_SPACE = (2 << 30, 2 << 30)
"""Keeps a child that reads without end from taking the shared machine's memory with it."""


def npu_wizard(
    *args: str, cwd: Path, env: dict[str, str] | None = None, real: bool = False
) -> subprocess.CompletedProcess[str]:
    """`npu-wizard ARGS`, a process of its own (tests/wizard_forks.py; real=True: a fresh interpreter) that must
    finish within a minute (a FIFO read would hang) and may map at most 2 GiB."""
    return wizard(args, timeout=60, cwd=cwd, env=env, limits={resource.RLIMIT_AS: ADDRESS_SPACE}, real=real)


def not_a_plain_file(tmp_path: Path, kind: str) -> str:
    """The path of a hostfile that is a FIFO nobody writes to, a device that never ends, or a folder."""
    if kind == "fifo":
        os.mkfifo(tmp_path / "hosts")
        return str(tmp_path / "hosts")
    if kind == "folder":
        (tmp_path / "hosts").mkdir()
        return str(tmp_path / "hosts")
    return "/dev/zero"


@pytest.mark.parametrize(
    ("kind", "message"),
    [
        ("fifo", "a FIFO, not a hostfile: give a plain file with one address per line"),
        ("device", "a device or socket, not a hostfile: give a plain file with one address per line"),
        ("folder", "a folder, not a hostfile: give a plain file with one address per line"),
    ],
)
def test_a_hostfile_that_is_not_a_plain_file_is_refused_at_once(tmp_path: Path, kind: str, message: str) -> None:
    answers = write_answers(tmp_path / "answers", hostfile=not_a_plain_file(tmp_path, kind))
    result = npu_wizard("--answers", str(answers), "-o", str(tmp_path / "out"), cwd=tmp_path)
    assert result.returncode == 1
    assert message in result.stderr
    assert not (tmp_path / "out").exists()


def received_project_naming(tmp_path: Path, hostfile: str) -> Path:
    """A rendered 1-node CPU project whose answers.yaml was changed to read its hosts from `hostfile`."""
    answers = tmp_path / "cpu.yaml"
    answers.write_text(
        yaml.safe_dump({"project_name": "received", "device": "cpu", "nodes": 1, "devices_per_node": 1, "amp": "off"})
    )
    rendered = npu_wizard("--answers", str(answers), "-o", str(tmp_path), cwd=tmp_path)
    assert rendered.returncode == 0, rendered.stderr
    project = tmp_path / "received"
    document = yaml.safe_load((project / "answers.yaml").read_text())
    del document["network"]["host_ips"]
    document["network"]["hostfile"] = hostfile
    (project / "answers.yaml").write_text(yaml.safe_dump(document, sort_keys=False))
    return project


def tree(folder: Path) -> dict[str, bytes]:
    """Every file under `folder` with its bytes."""
    return {str(path.relative_to(folder)): path.read_bytes() for path in folder.rglob("*") if path.is_file()}


@pytest.mark.parametrize("command", ["update", "run", "doctor"])
def test_a_received_project_whose_hostfile_is_a_fifo_is_refused_by_each_command(tmp_path: Path, command: str) -> None:
    fifo = tmp_path / "hosts"
    os.mkfifo(fifo)
    project = received_project_naming(tmp_path, str(fifo))
    before = tree(project)

    result = npu_wizard(command, str(project), cwd=tmp_path)

    assert result.returncode == 1, result.stdout + result.stderr
    assert as_shown(fifo, "a FIFO, not a hostfile") in result.stderr
    assert tree(project) == before


def test_address_ranges_are_counted_before_they_are_expanded(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    expanded: list[str] = []  # each address or range expanded, in order

    def counted(item: str) -> list[str]:
        expanded.append(item)
        return expand(item)

    monkeypatch.setattr(hostfile, "expand", counted)  # the hostfile's lines and host_ips' ranges both expand here
    # 250 lines of 4000 addresses each: a million hosts once expanded
    (tmp_path / "hosts").write_text("".join(f"10.{n}.0.0-10.{n}.15.159\n" for n in range(250)))
    with pytest.raises(AnswersError) as raised:
        resolve({"nodes": 4, "devices_per_node": 8, "network.hostfile": str(tmp_path / "hosts")})
    assert [(p.field, p.message) for p in raised.value.problems] == [
        ("network.hostfile", "line 2: more than 4096 addresses in all, the most nodes a job has")
    ]
    assert expanded == ["10.0.0.0-10.0.15.159"]  # the first line only: the second was counted, refused, unexpanded
    expanded.clear()
    with pytest.raises(AnswersError) as raised:
        resolve({"nodes": 4, "network.host_ips": ["10.0.0.0-10.0.15.159", "10.1.0.0-10.1.0.255"]})
    assert expanded == ["10.0.0.0-10.0.15.159"]
    assert [(p.field, p.message) for p in raised.value.problems] == [
        ("network.host_ips", "more than 4096 addresses in all, the most nodes a job has")
    ]


SECRET = "s3cr3t-t0ken-Zq8wXv"


@pytest.mark.parametrize(
    "text",
    [
        f"aws_access_key_id = AKIA\naws_secret_access_key = {SECRET}\n",
        f"TOKEN={SECRET}\0HOME=/root\0PATH=/usr/bin\0",
        f"10.0.0.1 slots={SECRET}\n",
        f"{SECRET}-10.0.0.2\n",
    ],
    ids=["credentials", "environ", "slots", "range"],
)
def test_a_hostfile_error_never_echoes_what_the_file_holds(tmp_path: Path, text: str) -> None:
    (tmp_path / "hosts").write_text(text)
    with pytest.raises(AnswersError) as raised:
        resolve({"nodes": 1, "network.hostfile": str(tmp_path / "hosts")})
    message = str(raised.value)
    assert SECRET not in message
    assert SECRET[:8] not in message
    assert "line " in message


def test_the_environment_read_as_a_hostfile_is_not_printed(tmp_path: Path) -> None:
    answers = write_answers(tmp_path, hostfile="/proc/self/environ")
    env = {"NPU_WIZARD_TEST_SECRET": SECRET * 20, **os.environ}
    # a fresh interpreter: a fork's /proc/self/environ is its server's, which holds no secret
    result = npu_wizard("--answers", str(answers), "-o", str(tmp_path / "out"), cwd=tmp_path, env=env, real=True)
    assert result.returncode == 1
    assert "network.hostfile: '/proc/self/environ': line 1: " in result.stderr
    assert SECRET not in result.stderr
    assert len(result.stderr) < 1000


@pytest.mark.parametrize("line", ["fe80::1%eth0;id", "fe80::1%$(reboot)", "fe80::1%" + "a" * 16])
def test_a_hostfile_line_with_a_zone_id_that_is_no_interface_name_is_refused(tmp_path: Path, line: str) -> None:
    (tmp_path / "hosts").write_text(f"{line} slots=8\n")
    with pytest.raises(AnswersError) as raised:
        resolve({"nodes": 1, "devices_per_node": 8, "network.hostfile": str(tmp_path / "hosts")})
    assert [(p.field, p.message) for p in raised.value.problems] == [("network.hostfile", "line 1: not an IP address")]
    (tmp_path / "hosts").write_text("fe80::1%eth0 slots=8\n")
    fine = resolve({"nodes": 1, "devices_per_node": 8, "network.hostfile": str(tmp_path / "hosts")})
    assert fine["network.host_ips"] == ("fe80::1%eth0",)


@pytest.mark.parametrize("hosts", ["fe80::1%eth0-fe80::3%eth1", "fe80::1%eth0-fe80::3", "fe80::1-fe80::3%eth1"])
def test_a_range_with_an_ipv6_zone_id_is_refused_naming_the_line_only(tmp_path: Path, hosts: str) -> None:
    (tmp_path / "hosts").write_text(f"# three nodes\n{hosts}\nfe80::4%eth0\n")
    answers = tmp_path / "answers.yaml"
    answers.write_text(yaml.safe_dump({"project_name": "zones", "nodes": 4, "network": {"hostfile": "hosts"}}))

    result = render_cli(answers, tmp_path / "out", cwd=tmp_path)

    assert result.returncode == 1, result.stdout + result.stderr
    assert "line 2: a range cannot carry an IPv6 zone id (%NIC)" in result.stderr
    assert "eth" not in result.stderr and "fe80" not in result.stderr
    assert not (tmp_path / "out").exists()


def test_an_address_whose_zone_id_holds_a_dash_is_one_host_not_a_range(tmp_path: Path) -> None:
    (tmp_path / "hosts").write_text("fe80::1%br-lan\nfe80::2%br-lan\n")
    answers = tmp_path / "answers.yaml"
    answers.write_text(yaml.safe_dump({"project_name": "zones", "nodes": 2, "network": {"hostfile": "hosts"}}))

    result = render_cli(answers, tmp_path / "out", cwd=tmp_path)

    assert result.returncode == 0, result.stdout + result.stderr
    recorded = yaml.safe_load((tmp_path / "out" / "zones" / "answers.yaml").read_text())
    assert recorded["network"]["host_ips"] == ["fe80::1%br-lan", "fe80::2%br-lan"]
