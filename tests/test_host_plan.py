"""Which hosts the next attempt runs on (wizard/run/hosts.py), and how each engine starts a node on them.

The plan's rules: a spare takes a node's rank when the node's host fails its
health check, or the same host fails twice in a row; node 0 (the master) is
restarted in place; spares are used once each, in order. Each engine is the
real one: the manual engine starts node K's real launch script on the spare's
address, the ssh engine's command reaches the spare, sbatch gets --exclude.
"""

from __future__ import annotations

import os
import shlex
import time
from pathlib import Path

from wizard.answers.model import Answers, resolve
from wizard.render.render import render
from wizard.run.engines.base import Launch
from wizard.run.engines.manual import ManualEngine
from wizard.run.engines.slurm import SlurmEngine
from wizard.run.engines.ssh import SshEngine
from wizard.run.hosts import HostPlan

SSH = {
    "project_name": "spare",
    "device": "cpu",
    "nodes": 3,
    "devices_per_node": 1,
    "cluster.engine": "ssh",
    "network.host_ips": ["10.0.0.2", "10.0.0.3", "10.0.0.4"],
    "network.spare_hosts": ["10.0.0.8", "10.0.0.9"],
}


def started(answers: Answers, project: Path = Path("/p"), **fields: object) -> tuple[SshEngine, Launch]:
    """An ssh engine that ran every node of `answers` (nothing is started: its launch is what it was given)."""
    engine = SshEngine()
    engine.launch = Launch(project, answers, tuple(range(answers["nodes"])), project / "runs" / "r", {}, **fields)
    return engine, engine.launch


def test_a_healthy_host_that_fails_once_keeps_its_node_and_the_second_time_in_a_row_gives_it_to_a_spare() -> None:
    answers = resolve(SSH)
    plan = HostPlan.for_answers(answers)
    engine, launch = started(answers)

    second = plan.next_launch(launch, engine, 2, {}, attempt=2)
    assert second.spares == {} and plan.changes == []
    engine.launch = second
    third = plan.next_launch(second, engine, 2, {}, attempt=3)

    assert third.spares == {2: "10.0.0.8"}
    assert plan.lines() == ["attempt 3: node 2 moved from 10.0.0.4 to spare host 10.0.0.8 (failed twice in a row)"]
    assert SshEngine.hosts(third) == ("10.0.0.2", "10.0.0.3", "10.0.0.8")


def test_unhealthy_hosts_are_replaced_at_once_node_0_never_and_spares_run_out() -> None:
    answers = resolve(SSH)
    plan = HostPlan.for_answers(answers)
    engine, launch = started(answers)
    health = {0: ["ssh to 10.0.0.2 failed: refused"], 1: ["ssh to 10.0.0.3 failed: refused"], 2: []}

    assert not plan.can_replace(health)  # node 0 cannot be replaced: the restart waits for it
    assert plan.can_replace({1: ["refused"], 2: []})
    moved = plan.next_launch(launch, engine, 1, health, attempt=2)
    engine.launch = moved
    again = plan.next_launch(moved, engine, 2, {2: ["1 process(es) of the run still alive on 10.0.0.4"]}, attempt=3)
    engine.launch = again
    last = plan.next_launch(again, engine, 2, {2: ["ssh to 10.0.0.9 failed: refused"]}, attempt=4)

    assert last.spares == {1: "10.0.0.8", 2: "10.0.0.9"}
    assert plan.notes == [
        "node 0 (10.0.0.2) failed its health check: ssh to 10.0.0.2 failed: refused: node 0 holds the master "
        "address every node's script names, so it is restarted in place",
        "node 2 (10.0.0.9) failed its health check: ssh to 10.0.0.9 failed: refused: no spare host left "
        "(network.spare_hosts), so it is restarted in place",
    ]
    assert [(c.node, c.replaced, c.by, c.attempt) for c in plan.changes] == [
        (1, "10.0.0.3", "10.0.0.8", 2),
        (2, "10.0.0.4", "10.0.0.9", 3),
    ]
    why = plan.summary_fields()["hosts_changed"][0]["why"]
    assert why == "failed its health check: ssh to 10.0.0.3 failed: refused"


def test_the_ssh_command_of_a_replaced_node_reaches_the_spare_and_names_its_address() -> None:
    answers = resolve({**SSH, "cluster.ssh_hosts": ["a", "b", "c"]})
    _engine, launch = started(answers, spares={1: "10.0.0.8"})

    engine = SshEngine()
    command = engine.start_command(launch, 1)
    untouched = engine.start_command(launch, 2)

    assert command[-2] == "10.0.0.8" and untouched[-2] == "c"
    assert f"NPU_WIZARD_SPARE_ADDR={shlex.quote('10.0.0.8')}" in command[-1]
    assert "NPU_WIZARD_SPARE_ADDR" not in untouched[-1]
    assert engine.node_log(launch, 1).startswith("10.0.0.8:")


def test_sbatch_keeps_the_excluded_nodes_off_the_job(tmp_path: Path) -> None:
    answers = resolve({"project_name": "s", "device": "cpu", "nodes": 1, "cluster.engine": "slurm"})
    launch = Launch(tmp_path, answers, (0,), tmp_path / "runs" / "r", {}, excluded=("n1", "n3"))

    command = SlurmEngine().command(launch)

    assert command[:4] == ["sbatch", "--parsable", f"--output={tmp_path}/runs/r/logs/slurm-%j.out", "--exclude=n1,n3"]


def test_the_manual_engine_starts_node_ks_real_script_with_the_spares_address(tmp_path: Path) -> None:
    raw = {"project_name": "m", "device": "cpu", "nodes": 2, "devices_per_node": 1}
    answers = resolve({**raw, "network.host_ips": ["127.0.0.1", "127.0.0.1"], "network.spare_hosts": ["127.0.0.3"]})
    project = render(answers, tmp_path).project_dir
    seen = tmp_path / "seen"
    # a stand-in for the steps every node shares: what node K's script handed it
    (project / "launch" / "run-node.sh").write_text(f'echo "$NODE_RANK $NODE_ADDR" >> {shlex.quote(str(seen))}\n')
    engine = ManualEngine()
    launch = Launch(project, answers, (0, 1), project / "runs" / "r", {}, spares={1: "127.0.0.3"})
    os.environ.pop("NPU_WIZARD_SPARE_ADDR", None)

    engine.submit(launch)
    deadline = time.monotonic() + 60
    while engine.describe().state != "ended" and time.monotonic() < deadline:
        time.sleep(0.1)

    assert sorted(seen.read_text().splitlines()) == ["0 127.0.0.1", "1 127.0.0.3"]
    assert engine.host_of(1) == "127.0.0.3" and engine.host_of(0) == "127.0.0.1"
