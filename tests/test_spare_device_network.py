"""A spare host's device network is checked, as doctor checks a node's, before it takes a node's place.

No NPU and no second host here: an ssh test double (NPU_WIZARD_SSH_COMMAND) runs the engine's command on this
machine, recording the host it was meant for, and the recording hccn_tool double of doctor's tests answers;
the spare 10.0.0.8 has device 1's link down, the spare 10.0.0.9 is ready.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.test_doctor_device_network import double_env, npu_cluster
from wizard.run.engines.base import Launch
from wizard.run.engines.ssh import SshEngine
from wizard.run.hosts import HostPlan

SSH_DOUBLE = """\
#!/usr/bin/env bash
# ssh test double (no second host here): records the host, runs the command on this machine; on 10.0.0.8
# the hccn_tool double reports device 1's link down
host="$1"
shift
printf '%s %s\\n' "$host" "$*" >>"$SSH_DOUBLE_RECORD"
if [[ "$host" == 10.0.0.8 ]]; then export HCCN_DOUBLE_DOWN=1; fi
exec bash -c "$*"
"""


def spare_cluster(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[SshEngine, Launch, HostPlan]:
    """A 3-node ssh NPU job with two spares, its ssh and hccn_tool doubles in place."""
    answers = npu_cluster(
        nodes=3,
        devices_per_node=2,
        cluster__engine="ssh",
        network__host_ips=["10.0.0.1", "10.0.0.2", "10.0.0.3"],
        network__spare_hosts=["10.0.0.8", "10.0.0.9"],
    )
    for name, value in double_env(tmp_path).items():
        monkeypatch.setenv(name, value)
    ssh = tmp_path / "ssh_double"
    ssh.write_text(SSH_DOUBLE)
    ssh.chmod(0o755)
    monkeypatch.setenv("NPU_WIZARD_SSH_COMMAND", str(ssh))
    monkeypatch.setenv("SSH_DOUBLE_RECORD", str(tmp_path / "ssh_calls"))
    engine = SshEngine()
    engine.launch = Launch(Path("/p"), answers, (0, 1, 2), Path("/p/runs/r"), {})
    return engine, engine.launch, HostPlan.for_answers(answers)


def test_a_spare_whose_device_link_is_down_is_skipped_with_the_reason(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    engine, launch, plan = spare_cluster(tmp_path, monkeypatch)
    moved = plan.next_launch(launch, engine, 2, {2: ["ssh to 10.0.0.3 failed: refused"]}, attempt=2)
    assert moved.spares == {2: "10.0.0.9"}
    assert plan.notes == [
        "spare host 10.0.0.8 skipped for node 2: its device network fails doctor's check: device 1 link DOWN "
        "(hccn_tool -i 1 -link -g)"
    ]
    hosts = {line.split()[0] for line in (tmp_path / "ssh_calls").read_text().splitlines()}
    assert hosts == {"10.0.0.8", "10.0.0.9"}  # checked on the spares themselves, through the engine's ssh
    assert all(" -g" in line for line in (tmp_path / "hccn_calls").read_text().splitlines())  # read only


def test_no_spare_passing_the_check_restarts_the_node_in_place(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    engine, launch, plan = spare_cluster(tmp_path, monkeypatch)
    monkeypatch.setenv("HCCN_DOUBLE_NO_IP", "0")  # every spare: device 0 without an address
    moved = plan.next_launch(launch, engine, 2, {2: ["ssh to 10.0.0.3 failed: refused"]}, attempt=2)
    assert moved.spares == {}
    assert plan.notes[-1] == (
        "node 2 (10.0.0.3) failed its health check: ssh to 10.0.0.3 failed: refused: no spare host left "
        "(network.spare_hosts), so it is restarted in place"
    )
    assert (
        "spare host 10.0.0.9 skipped for node 2: its device network fails doctor's check: device 0 has no "
        in (plan.notes[1])
    )
