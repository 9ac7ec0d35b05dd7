"""`network.spare_hosts`: checked like the host IPs, marked in a hostfile, and carried by node K's launch script."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from tests.factories import answers
from wizard.answers.hostfile import parse
from wizard.answers.model import load_text, resolve
from wizard.errors import AnswersError
from wizard.render.render import render

SSH_TWO_NODES = {
    "project_name": "spare",
    "device": "cpu",
    "nodes": 2,
    "devices_per_node": 1,
    "cluster.engine": "ssh",
    "network.host_ips": ["10.0.0.2", "10.0.0.3"],
}


def problems(**raw: object) -> list[str]:
    """Every error the answers give, as `field: message`."""
    with pytest.raises(AnswersError) as refused:
        resolve({**SSH_TWO_NODES, **{name.replace("__", "."): value for name, value in raw.items()}})
    return [f"{problem.field}: {problem.message}" for problem in refused.value.problems]


def test_spare_hosts_are_parsed_like_host_ips_ranges_and_pasted_lists_included() -> None:
    given = resolve({**SSH_TWO_NODES, "network.spare_hosts": "10.0.0.4-10.0.0.5, 10.0.0.9"})

    assert given["network.spare_hosts"] == ("10.0.0.4", "10.0.0.5", "10.0.0.9")
    assert resolve(SSH_TWO_NODES)["network.spare_hosts"] is None
    assert resolve({**SSH_TWO_NODES, "network.spare_hosts": []})["network.spare_hosts"] is None


@pytest.mark.parametrize(
    ("spares", "message"),
    [
        (["10.0.0.4", "node-b"], "network.spare_hosts: not an IPv4 or IPv6 address: node-b"),
        (["10.0.0.4", "10.0.0.3"], "network.spare_hosts: a spare host is not a node; also in network.host_ips: "),
        (["10.0.0.4", "10.0.0.4"], "network.spare_hosts: each spare host is listed once; repeated: 10.0.0.4"),
    ],
)
def test_a_spare_that_is_no_address_a_node_or_repeated_is_refused(spares: list[str], message: str) -> None:
    assert any(text.startswith(message) for text in problems(network__spare_hosts=spares))


@pytest.mark.parametrize(
    ("engine", "why"),
    [
        ("slurm", "resubmits the job with the failed node excluded"),
        ("ascendjob", "the operator reschedules a failed pod"),
        ("pytorchjob", "the operator reschedules a failed pod"),
    ],
)
def test_a_scheduler_refuses_spare_hosts_saying_what_it_does_instead(engine: str, why: str) -> None:
    extra = {"cluster.image": "registry.example.com/train:1"} if engine != "slurm" else {}
    found = problems(cluster__engine=engine, network__spare_hosts=["10.0.0.4"], **extra)

    assert len(found) == 1 and found[0].startswith("network.spare_hosts: the " + engine + " engine chooses the nodes")
    assert why in found[0]


def test_the_manual_engine_takes_spares_only_when_every_node_is_simulated_here() -> None:
    found = problems(cluster__engine="manual", network__spare_hosts=["10.0.0.4"])
    assert found == [
        "network.spare_hosts: the manual engine starts only the node of the host it runs on (run --node N), so it "
        "cannot start a spare in a failed node's place: use cluster.engine ssh, which starts every node, or "
        "loopback addresses to simulate the nodes and spares on this host"
    ]

    simulated = answers(nodes=2, network__spare_hosts=["127.0.0.1"])  # loopback nodes, a loopback spare
    assert simulated["network.spare_hosts"] == ("127.0.0.1",)


def test_a_hostfile_marks_spares_with_the_word_spare(tmp_path: Path) -> None:
    hosts = tmp_path / "hosts"
    hosts.write_text("10.0.0.2 slots=1\n10.0.0.9 spare  # stands by\n10.0.0.3\n10.0.0.10 slots=1 spare\n")
    text = "project_name: spare\ndevice: cpu\nnodes: 2\ndevices_per_node: 1\ncluster: {engine: ssh}\n"

    loaded = load_text(text + f"network: {{hostfile: {hosts}}}\n")

    assert loaded["network.host_ips"] == ("10.0.0.2", "10.0.0.3")
    assert loaded["network.spare_hosts"] == ("10.0.0.9", "10.0.0.10")
    with pytest.raises(AnswersError) as both:
        load_text(text + f"network: {{hostfile: {hosts}, spare_hosts: [10.0.0.11]}}\n")
    assert [p.message for p in both.value.problems] == [
        "the hostfile marks spare hosts already: give them there (the word spare) or here, not both"
    ]
    assert [host.spare for host in parse("10.0.0.2 spare\n10.0.0.3\n")] == [True, False]


def test_a_hostfile_of_spares_only_has_no_nodes(tmp_path: Path) -> None:
    hosts = tmp_path / "hosts"
    hosts.write_text("10.0.0.9 spare\n")
    with pytest.raises(AnswersError) as refused:
        load_text(f"project_name: spare\nnodes: 1\nnetwork: {{hostfile: {hosts}}}\n")
    assert "no host addresses in it" in refused.value.problems[0].message


def test_node_k_script_run_on_a_spare_takes_the_spares_address_and_keeps_node_ks_rank(tmp_path: Path) -> None:
    project = render(resolve({**SSH_TWO_NODES, "network.spare_hosts": ["10.0.0.4"]}), tmp_path / "out").project_dir
    # what run-node.sh is handed, seen by a stand-in for it (the real one would start training)
    (project / "launch" / "run-node.sh").write_text('echo "rank=$NODE_RANK addr=$NODE_ADDR"\n')
    node1 = ["bash", str(project / "launch" / "node1.sh")]

    on_spare = subprocess.run(node1, env={"NPU_WIZARD_SPARE_ADDR": "10.0.0.4"}, capture_output=True, text=True)
    at_home = subprocess.run(node1, env={}, capture_output=True, text=True)

    assert on_spare.stdout == "rank=1 addr=10.0.0.4\n"
    assert at_home.stdout == "rank=1 addr=10.0.0.3\n"
    readme = (project / "README.md").read_text()
    assert "Spare hosts, standing by for a failed node: 10.0.0.4." in readme


def test_a_project_without_spares_renders_its_node_scripts_as_before(tmp_path: Path) -> None:
    project = render(resolve(SSH_TWO_NODES), tmp_path / "out").project_dir

    script = (project / "launch" / "node1.sh").read_text()
    assert "export NODE_ADDR=10.0.0.3\n" in script and "SPARE" not in script
