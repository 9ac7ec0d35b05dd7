"""Each doctor check against real conditions made here: held ports, foreign addresses, /proc files.

Sockets are real and stay on loopback; an address that is not on this host
(203.0.113.77, TEST-NET-3) is only ever tested for being assigned locally,
never connected to. The software facts of an NPU node cannot exist here, so
those checks get a `Software` value built by hand (the probe itself runs for
real in test_doctor_command.py).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from runtime.checks import FAIL, PASS, SKIP, WARN
from runtime.probes import parse_port_list
from tests.factories import answers
from tests.runs import free_port, hccl_base_apart_from, hccl_range_from
from wizard.answers.model import Answers
from wizard.doctor import network, software
from wizard.doctor.probe import Software
from wizard.errors import TargetError

FOREIGN = "203.0.113.77"  # TEST-NET-3: not on this host; never sent any traffic
NO_NONLOCAL_BIND = Path("/nonexistent/ip_nonlocal_bind")


def npu_answers(**overrides: object) -> Answers:
    """A valid NPU project (A2, 2 nodes x 8 on loopback) with overrides (`network__master_port=...`)."""
    base: dict[str, object] = {
        "device": "npu",
        "hardware": "atlas-a2",
        "devices_per_node": 8,
        "nodes": 2,
        "network__host_ips": ["127.0.0.1", "127.0.0.1"],
        "network__hccl_port_count": 16,
    }
    return answers(**{**base, **overrides})


def port_files(tmp_path: Path, reserved: str, ephemeral: str = "32768\t60999") -> network.PortFacts:
    """The kernel's port facts read from fixture files."""
    (tmp_path / "reserved").write_text(reserved + "\n")
    (tmp_path / "range").write_text(ephemeral + "\n")
    return network.read_port_facts(tmp_path / "reserved", tmp_path / "range")


# ---- addresses and which node this is -------------------------------------------------


def test_an_address_of_this_host_passes() -> None:
    node = network.Node(0, "127.0.0.1", "simulated")
    result = network.check_if_ip(npu_answers(), node, NO_NONLOCAL_BIND)
    assert (result.status, result.detail) == (PASS, "node 0: 127.0.0.1 is on this host")


def test_an_address_not_on_this_host_fails_with_its_fix() -> None:
    result = network.check_if_ip(npu_answers(), network.Node(1, FOREIGN, "--node"), NO_NONLOCAL_BIND)
    assert result.status == FAIL
    assert f"{FOREIGN} is not an address of this host" in result.detail
    assert "ip -brief addr" in result.fix


def test_no_host_ip_on_this_host_means_a_guessed_node_and_says_so() -> None:
    cluster = answers(nodes=2, network__host_ips=[FOREIGN, "198.51.100.7"], network__master_addr=FOREIGN)
    node = network.which_node(cluster, None, NO_NONLOCAL_BIND)
    assert (node.index, node.how) == (0, "guessed")
    result = network.check_if_ip(cluster, node, NO_NONLOCAL_BIND)
    assert result.status == FAIL
    assert result.detail.startswith(f"none of the project's host IPs ({FOREIGN}, 198.51.100.7) is on this host")
    assert "--node N" in result.fix


def test_the_node_is_found_by_its_host_ip() -> None:
    cluster = answers(nodes=2, network__host_ips=[FOREIGN, "127.0.0.2"], network__master_addr=FOREIGN)
    assert network.which_node(cluster, None, NO_NONLOCAL_BIND) == network.Node(1, "127.0.0.2", "found")


def test_a_node_out_of_range_is_refused() -> None:
    with pytest.raises(TargetError, match="nodes 0 to 1"):
        network.which_node(npu_answers(), 2, NO_NONLOCAL_BIND)


def test_nonlocal_bind_makes_the_address_test_a_warning(tmp_path: Path) -> None:
    (tmp_path / "nonlocal").write_text("1\n")
    result = network.check_if_ip(npu_answers(), network.Node(1, FOREIGN, "--node"), tmp_path / "nonlocal")
    assert result.status == WARN and "ip_nonlocal_bind=1" in result.detail


# ---- ports: free, reserved, ephemeral ------------------------------------------------


def test_a_taken_hccl_port_fails_and_names_it(held_port: int) -> None:
    project = npu_answers(
        network__hccl_base_port=held_port - 2,
        network__master_port=free_port(outside=hccl_range_from(held_port - 2)),
    )
    node = network.Node(0, "127.0.0.1", "simulated")
    if_ip = network.check_if_ip(project, node, NO_NONLOCAL_BIND)
    result = network.check_hccl_free(project, node, if_ip)
    assert result.status == FAIL
    # the range is 16 ports from two below the held one (its neighbours free when it was picked, tests/conftest.py):
    # another test's socket may hold some of the others, and neighbours are written as a span (56911-56913)
    taken, _, where = result.detail.partition(" taken on ")
    ports = [port for first, last in parse_port_list(taken) for port in range(first, last + 1)]
    assert held_port in ports and where.startswith("127.0.0.1"), result.detail
    assert f"sport = :{min(ports)}" in result.fix and "HCCL base port" in result.fix


def test_free_hccl_ports_pass() -> None:
    base = free_port()
    master = 29500 if not base - 16 < 29500 < base + 16 else base + 32  # never inside the HCCL range (refused)
    project = npu_answers(network__hccl_base_port=base, network__hccl_port_count=16, network__master_port=master)
    node = network.Node(0, "127.0.0.1", "simulated")
    result = network.check_hccl_free(project, node, network.check_if_ip(npu_answers(), node, NO_NONLOCAL_BIND))
    assert result.status in (PASS, FAIL)  # the 15 ports above a free one are very likely free too
    if result.status == FAIL:
        pytest.skip(f"another program holds a port near {base}: {result.detail}")


def test_the_master_port_taken_on_node_0_fails(held_port: int, tmp_path: Path) -> None:
    project = npu_answers(network__master_port=held_port, network__hccl_base_port=hccl_base_apart_from(held_port))
    result = network.check_master_port(project, network.Node(0, "127.0.0.1", "simulated"), port_files(tmp_path, ""))
    assert (result.status, result.detail) == (FAIL, f"{held_port} is taken (Address already in use)")
    assert "an earlier run" in result.fix


def test_the_master_port_is_not_bound_on_other_nodes(held_port: int, tmp_path: Path) -> None:
    project = npu_answers(network__master_port=held_port, network__hccl_base_port=hccl_base_apart_from(held_port))
    result = network.check_master_port(project, network.Node(1, "127.0.0.1", "--node"), port_files(tmp_path, ""))
    assert result.status == SKIP


def test_an_unreserved_ephemeral_master_port_warns(tmp_path: Path) -> None:
    port = free_port()
    facts = port_files(tmp_path, "", f"{port - 10}\t{port + 10}")
    result = network.check_master_port(npu_answers(network__master_port=port), network.Node(0, "127.0.0.1", "x"), facts)
    assert result.status == WARN and "reserve-ports.sh" in result.fix


def test_unreserved_hccl_ports_in_the_ephemeral_range_fail(tmp_path: Path) -> None:
    result = network.check_hccl_reserved(npu_answers(), port_files(tmp_path, "29500"))
    assert result.status == FAIL
    assert result.detail.startswith("60000-60015 lie in the ephemeral range 32768-60999 and are not reserved")
    assert "sudo bash sysctl/reserve-ports.sh --apply" in result.fix


def test_partly_reserved_hccl_ports_name_the_rest(tmp_path: Path) -> None:
    result = network.check_hccl_reserved(npu_answers(), port_files(tmp_path, "29500,60000-60007,60010"))
    assert result.status == FAIL and result.detail.startswith("60008-60009, 60011-60015 lie in")


def test_reserved_hccl_ports_pass(tmp_path: Path) -> None:
    result = network.check_hccl_reserved(npu_answers(), port_files(tmp_path, "22,59990-60020"))
    assert (result.status, result.detail) == (PASS, "60000-60015 reserved (HCCL_IF_BASE_PORT=60000, 16 ports)")


def test_hccl_ports_outside_the_ephemeral_range_need_no_reservation(tmp_path: Path) -> None:
    result = network.check_hccl_reserved(npu_answers(), port_files(tmp_path, "", "32768\t50000"))
    assert (result.status, result.detail) == (
        PASS,
        "60000-60015 outside the ephemeral range (HCCL_IF_BASE_PORT=60000, 16 ports)",
    )


def test_an_unreadable_reservation_is_a_warning(tmp_path: Path) -> None:
    (tmp_path / "range").write_text("32768 60999\n")
    facts = network.read_port_facts(tmp_path / "missing", tmp_path / "range")
    result = network.check_hccl_reserved(npu_answers(), facts)
    assert result.status == WARN and "cannot read the reserved ports" in result.detail


def test_hccl_port_checks_skip_on_cpu(tmp_path: Path) -> None:
    result = network.check_hccl_reserved(answers(), port_files(tmp_path, ""))
    assert result.status == SKIP


# ---- the master, from the other nodes ------------------------------------------------


def test_a_listening_master_is_reachable(held_port: int) -> None:
    project = npu_answers(network__master_port=held_port, network__hccl_base_port=hccl_base_apart_from(held_port))
    result = network.check_master(project, network.Node(1, "127.0.0.1", "--node"), 1.0, NO_NONLOCAL_BIND)
    assert (result.status, result.detail) == (PASS, f"127.0.0.1:{held_port} accepts connections")


def test_a_master_not_listening_yet_is_a_warning_not_a_failure() -> None:
    project = npu_answers(network__master_port=free_port())
    result = network.check_master(project, network.Node(1, "127.0.0.1", "--node"), 1.0, NO_NONLOCAL_BIND)
    assert result.status == WARN
    assert "node 0 may not have started yet" in result.detail
    assert "run doctor again" in result.fix


def test_node_0_must_hold_the_master_address() -> None:
    cluster = answers(nodes=2, network__host_ips=[FOREIGN, "127.0.0.1"], network__master_addr=FOREIGN)
    result = network.check_master(cluster, network.Node(0, FOREIGN, "--node"), 1.0, NO_NONLOCAL_BIND)
    assert result.status == FAIL and "node 0 runs rank 0" in result.detail


# ---- HCCL timeouts ------------------------------------------------------------------


def test_timeouts_in_order_pass_with_their_source(tmp_path: Path) -> None:
    script = tmp_path / "run-node.sh"
    script.write_text("export HCCL_CONNECT_TIMEOUT=120\nexport HCCL_EXEC_TIMEOUT=1836\n")
    result = network.check_timeouts(npu_answers(), script)
    assert (result.status, result.detail) == (PASS, "connect 120s, exec 1836s (launch/run-node.sh)")


def test_exec_timeout_0_on_a2_means_never_and_passes() -> None:
    result = network.check_timeouts(npu_answers(network__exec_timeout=0), None)
    assert (result.status, result.detail) == (PASS, "connect 120s, exec never (0) (the answers)")


def test_connect_not_below_exec_only_warns() -> None:
    result = network.check_timeouts(npu_answers(network__connect_timeout=2000, network__exec_timeout=1836), None)
    assert result.status == WARN
    assert result.detail.startswith("connect 2000s >= exec 1836s")


def test_a_training_series_exec_timeout_off_the_68_grid_warns_with_what_hccl_waits() -> None:
    project = npu_answers(hardware="atlas-training", amp="fp16", network__exec_timeout=600)
    result = network.check_timeouts(project, None)
    assert result.status == WARN
    assert result.detail == "exec 600s: the Atlas training series floors it to a multiple of 68, so HCCL waits 544s"


def test_a_hand_edited_launch_script_disagreeing_with_the_answers_warns(tmp_path: Path) -> None:
    script = tmp_path / "run-node.sh"
    script.write_text("export HCCL_CONNECT_TIMEOUT=2000\nexport HCCL_EXEC_TIMEOUT=1836\n")
    result = network.check_timeouts(npu_answers(), script)
    assert result.status == WARN
    assert result.detail == "run-node.sh sets connect 2000s, exec 1836s; the answers say 120s, 1836s (edited by hand?)"


def test_a_large_job_with_the_default_connect_timeout_warns() -> None:
    big = npu_answers(nodes=16, network__host_ips=["127.0.0.1"] * 16)
    result = network.check_timeouts(big, None)
    assert result.status == WARN and "1200" in result.fix


# ---- software, CANN and devices -------------------------------------------------------

NPU_NODE = Software(python="3.11.7", executable="/usr/bin/python3", torch="2.9.0+cpu", torch_npu="2.9.0.post6")


def test_torch_npu_must_pair_with_torch() -> None:
    found = Software(python="3.11.7", executable="/x", torch="2.14.1", torch_npu="2.9.0.post6")
    result = software.check_torch_npu(found, npu_answers())
    assert (result.status, result.detail) == (FAIL, "2.9.0.post6 needs torch 2.9.0, but torch is 2.14.1")
    assert result.fix.startswith("pip install torch==2.9.0")


def test_the_pinned_pair_passes_and_names_its_cann() -> None:
    result = software.check_torch_npu(NPU_NODE, npu_answers())
    assert (result.status, result.detail) == (PASS, "2.9.0.post6, pairs with torch 2.9.0+cpu, built for CANN 9.1.0")


def test_another_torch_npu_than_pinned_warns_with_both_canns() -> None:
    found = Software(python="3.11.7", executable="/x", torch="2.9.0", torch_npu="2.9.0.post2")
    result = software.check_torch_npu(found, npu_answers())
    assert result.status == WARN
    assert result.detail == "2.9.0.post2 installed, built for CANN 9.0.0; the project pins 2.9.0.post6 (CANN 9.1.0)"


def test_torch_npu_missing_fails_on_npu_and_is_skipped_on_cpu() -> None:
    found = Software(python="3.11.7", executable="/x", torch="2.9.0", torch_npu_missing=True)
    on_npu = software.check_torch_npu(found, npu_answers())
    assert on_npu.status == FAIL and "torch-npu==2.9.0.post6" in on_npu.fix
    assert software.check_torch_npu(found, answers()).status == SKIP


def test_torch_npu_failing_to_load_carries_the_runtimes_explanation() -> None:
    found = Software(
        python="3.11.7",
        executable="/x",
        torch="2.9.0",
        torch_npu_error="ImportError: libhccl.so: cannot open shared object file",
        torch_npu_fix="CANN is not sourced: ...",
    )
    result = software.check_torch_npu(found, npu_answers())
    assert result.status == FAIL and result.fix == "CANN is not sourced: ..."
    assert software.check_torch_npu(found, answers(device="auto")).status == WARN


def test_an_old_python_fails() -> None:
    result = software.check_python(Software(python="3.9.18", executable="/usr/bin/python3"))
    assert result.status == FAIL and "3.10+" in result.fix


def test_missing_cann_set_env_fails_on_npu_listing_the_places_tried(tmp_path: Path) -> None:
    missing = str(tmp_path / "missing" / "set_env.sh")
    result = software.check_cann_files(npu_answers(environment__cann_set_env=missing), {"HOME": str(tmp_path)})
    assert result.status == FAIL and result.fix
    assert f"(tried {missing}, /usr/local/Ascend/cann/set_env.sh, " in result.detail
    assert f"{tmp_path}/Ascend/nnae/set_env.sh)" in result.detail


def test_cann_set_env_present_passes_and_cpu_skips(tmp_path: Path) -> None:
    set_env = tmp_path / "set_env.sh"
    set_env.write_text("export ASCEND_TOOLKIT_HOME=/opt\n")
    assert software.check_cann_files(npu_answers(environment__cann_set_env=str(set_env)), {}).status == PASS
    assert software.check_cann_files(answers(), {}).status == SKIP


def test_cann_is_found_where_the_install_info_or_home_puts_it(tmp_path: Path) -> None:
    project = npu_answers(environment__cann_set_env=str(tmp_path / "missing" / "set_env.sh"))
    home_toolkit = tmp_path / "home" / "Ascend" / "ascend-toolkit" / "set_env.sh"
    home_toolkit.parent.mkdir(parents=True)
    home_toolkit.write_text("")
    env = {"HOME": str(tmp_path / "home")}
    result = software.check_cann_files(project, env, install_info=tmp_path / "no-info")
    assert (result.status, result.detail) == (PASS, str(home_toolkit))
    custom = tmp_path / "opt" / "cann" / "set_env.sh"
    custom.parent.mkdir(parents=True)
    custom.write_text("")
    info = tmp_path / "ascend_cann_install.info"
    info.write_text(f"Install_Path={tmp_path / 'opt'}\n")
    assert software.check_cann_files(project, env, install_info=info).detail == str(custom)


def test_doctor_checks_the_named_nic_instead_of_the_host_ip(tmp_path: Path) -> None:
    base = free_port()
    project = npu_answers(
        network__nic="=lo", network__hccl_base_port=base, network__master_port=free_port(outside=hccl_range_from(base))
    )
    node = network.Node(0, FOREIGN, "--node")
    if_ip = network.check_if_ip(project, node, NO_NONLOCAL_BIND)
    assert (if_ip.status, if_ip.detail) == (PASS, "node 0: '=lo' is lo (127.0.0.1) on this host")
    free = network.check_hccl_free(project, node, if_ip)
    assert free.status != SKIP and " on 127.0.0.1" in free.detail  # probed on the NIC's address, not FOREIGN
    missing = network.check_if_ip(npu_answers(network__nic="=nosuch0"), node, NO_NONLOCAL_BIND)
    assert missing.status == FAIL and "names no interface" in missing.detail


@pytest.mark.parametrize(
    ("visible", "hardware", "per_node", "status", "detail"),
    [
        (None, "atlas-a2", 8, PASS, "8 NPU(s) visible (all devices visible), 8 used"),
        ("0,1,2,3", "atlas-a2", 8, FAIL, "4 NPU(s) visible (ASCEND_RT_VISIBLE_DEVICES=0,1,2,3)"),
        ("2,1", "atlas-a2", 2, FAIL, "ASCEND_RT_VISIBLE_DEVICES='2,1': the ids must be ascending, each once"),
        ("0;1", "atlas-a2", 2, FAIL, "ASCEND_RT_VISIBLE_DEVICES='0;1': give comma-separated device ids"),
        ("3,4", "atlas-training", 2, FAIL, "devices 3, 4 span the card groups 0-3 and 4-7"),
        ("4,5", "atlas-training", 2, PASS, "2 NPU(s) visible (ASCEND_RT_VISIBLE_DEVICES=4,5), 2 used"),
    ],
)
def test_visible_devices_against_devices_per_node(
    visible: str | None, hardware: str, per_node: int, status: str, detail: str
) -> None:
    project = npu_answers(hardware=hardware, devices_per_node=per_node, amp="fp16")
    count = len(visible.split(",")) if visible and "," in visible else 8
    env = {"ASCEND_RT_VISIBLE_DEVICES": visible} if visible else {}
    found = Software(python="3.11.7", torch="2.9.0", torch_npu="2.9.0.post6", npu_count=count)
    result = software.check_devices(found, project, env)
    assert result.status == status
    assert result.detail.startswith(detail)
    assert status == PASS or result.fix
