"""Host lists for large clusters: `network.hostfile`, address ranges and pasted lists, through the real command."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from wizard.answers import resolve
from wizard.errors import AnswersError
from wizard.hostfile import Host, HostListError, parse

HOSTFILE = """\
# rack 7, node 0 first
10.0.0.11 slots=8
10.0.0.12 slots=8   # the one with the big disk

10.0.0.13-10.0.0.14
"""


def render_cli(answers: Path, out: Path, cwd: Path) -> subprocess.CompletedProcess[str]:
    """`npu-wizard --answers FILE -o OUT`, run from `cwd` in a fresh interpreter."""
    return subprocess.run(
        [sys.executable, "-m", "wizard", "--answers", str(answers), "-o", str(out)],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=cwd,
    )


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


def test_every_problem_of_a_hostfile_is_listed_with_its_line_and_nothing_is_written(tmp_path: Path) -> None:
    (tmp_path / "hosts").write_text("10.0.0.11\nnode-a\n10.0.0.12 gpus=8\n")
    result = render_cli(write_answers(tmp_path, hostfile="hosts"), tmp_path / "out", cwd=tmp_path)
    assert result.returncode == 1
    assert (
        f"network.hostfile: '{tmp_path / 'hosts'}': line 2: 'node-a': not an IP; "
        "line 3: 'gpus=8': only slots=N may follow the address"
    ) in result.stderr
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
