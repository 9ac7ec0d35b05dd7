"""What a rendered project says and reserves about its ports matches the ports its nodes really use.

Real renders; the reservation script runs for real (--print, against a file standing
in for the kernel's reserved list).
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from tests.test_k8s_manifests import container, rendered
from tests.test_launch_scripts import render_project


def reserved_by_script(project: Path, tmp_path: Path) -> str:
    """The list sysctl/reserve-ports.sh would write on a node that reserves nothing yet."""
    kernel_list = tmp_path / "ip_local_reserved_ports"
    kernel_list.write_text("\n")
    result = subprocess.run(
        ["bash", str(project / "sysctl" / "reserve-ports.sh"), "--print"],
        env={"PATH": "/usr/bin:/bin", "NPU_WIZARD_RESERVED_PORTS_FILE": str(kernel_list)},
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    )
    return result.stdout.strip()


@pytest.mark.parametrize(("engine", "operator_port"), [("ascendjob", 2222), ("pytorchjob", 23456)])
def test_kubernetes_projects_reserve_the_port_the_pods_listen_on(
    tmp_path: Path, engine: str, operator_port: int
) -> None:
    project, job, _ = rendered(tmp_path, engine, network__master_port=29500, network__hccl_port_count=16)
    (pod_port,) = container(job)["ports"]
    assert pod_port["containerPort"] == operator_port
    expected = ",".join(sorted([str(operator_port), "60000-60015"], key=lambda item: int(item.split("-")[0])))
    assert reserved_by_script(project, tmp_path) == expected
    conf = (project / "sysctl" / "reserve-ports.conf").read_text()
    assert f"net.ipv4.ip_local_reserved_ports={expected}\n" in conf
    assert "29500" not in conf
    sysctl_readme = (project / "sysctl" / "README.md").read_text()
    assert f"port {operator_port} in the Master pod" in sysctl_readme
    assert f'`value: "{expected}"`' in sysctl_readme  # the pod sysctl: a node's list does not reach a pod
    readme = (project / "README.md").read_text()
    assert f"| {operator_port} | `MASTER_PORT` (the operator's)" in readme
    assert "launch/nodeK.sh" not in readme


def test_a_slurm_readme_lists_every_job_ids_ports_and_no_script_it_lacks(tmp_path: Path) -> None:
    project = render_project(
        tmp_path,
        nodes=2,
        **{
            "cluster.engine": "slurm",
            "network.host_ips": None,
            "network.master_addr": None,
            "network.master_port": 29500,
            "network.hccl_port_count": 16,
        },
    )
    readme = (project / "README.md").read_text()
    assert "| 29500-30499 | `MASTER_PORT` = 29500 + job id % 1000" in readme
    assert "| 60000-61023 | HCCL host ports: slot job id % 64 of 16 ports each" in readme
    assert "launch/nodeK.sh" not in readme and "launch/node0.sh --smoke" not in readme
    assert "may be overridden" not in readme
    assert "an inherited `MASTER_PORT` is ignored" in readme
    assert "the later one's preflight stops it before any rank starts, naming the port, the slot and the job" in readme
    sysctl_readme = (project / "sysctl" / "README.md").read_text()
    assert "never collide" not in sysctl_readme
    assert "jobs whose ids differ by a multiple of 64 take the\nsame HCCL slot" in sysctl_readme
    assert reserved_by_script(project, tmp_path) == "29500-30499,60000-61023"
