"""RANK_TABLE_FILE switches torch_npu to rank-table init: doctor and the launch preflight say so (issue 36, 28)."""

from __future__ import annotations

import argparse
from pathlib import Path

from runtime import preflight
from runtime.checks import FAIL, PASS, WARN
from tests.factories import answers
from wizard.doctor import network


def rank_table(tmp_path: Path) -> str:
    path = tmp_path / "rank_table.json"
    path.write_text('{"version": "1.0"}')
    return str(path)


def test_a_readable_rank_table_is_named_as_overriding_the_port_plan_and_hccl_if_ip(tmp_path: Path) -> None:
    table = rank_table(tmp_path)
    result = preflight.check_rank_table({"RANK_TABLE_FILE": table})
    assert result.status == WARN
    assert result.detail == (
        f"RANK_TABLE_FILE={table}: torch_npu initialises HCCL from this rank table, so HCCL_IF_IP and the HCCL "
        "port plan (HCCL_IF_BASE_PORT, HCCL_HOST_SOCKET_PORT_RANGE, HCCL_NPU_SOCKET_PORT_RANGE) do not govern "
        "the job's communicator"
    )


def test_a_spare_host_under_a_rank_table_is_refused(tmp_path: Path) -> None:
    result = preflight.check_rank_table({"RANK_TABLE_FILE": rank_table(tmp_path)}, spare=True)
    assert result.status == FAIL
    assert "a spare host is not in the rank table" in result.detail


def test_no_rank_table_passes() -> None:
    assert preflight.check_rank_table({}).status == PASS


def test_the_launch_preflight_of_a_spare_host_refuses_a_rank_table(tmp_path: Path) -> None:
    env = {
        "NODE_RANK": "1", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29500",
        "RANK_TABLE_FILE": rank_table(tmp_path), "NPU_WIZARD_SPARE_ADDR": "10.0.0.9",
    }  # fmt: skip
    args = argparse.Namespace(
        device="npu", wait=0, cann_set_env="", cann_tried="", hccl_port_count=16, hccl_reads_port_range=True,
        user_script="",
    )  # fmt: skip
    results = {r.name: r for r in preflight.launch_checks(args, env)}
    assert results["rank table"].status == FAIL


def test_doctor_refuses_spare_hosts_under_a_rank_table(tmp_path: Path) -> None:
    npu = answers(
        device="npu", nodes=2, network__host_ips=["10.0.0.1", "10.0.0.2"], network__spare_hosts=["10.0.0.3"],
        cluster__engine="ssh",
    )  # fmt: skip
    result = network.check_rank_table(npu, {"RANK_TABLE_FILE": rank_table(tmp_path)})
    assert result.status == FAIL
    assert "network.spare_hosts" in result.fix
