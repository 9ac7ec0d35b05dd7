"""The launch scripts' preflight (runtime/preflight.py): a bad node stops in seconds, with the reason.

The scripts run for real under bash, with the fake rank of test_launch_scripts
standing in for train.py (no torch needed), so that what a check stops, or
lets through, is visible as a rank that never started, or did.
"""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from runtime import preflight
from tests.runs import free_port, hccl_base_apart_from
from tests.test_launch_scripts import render_project, run_node, script_env, with_fake_train

FOREIGN = "203.0.113.77"  # TEST-NET-3: not on this host; never sent any traffic


def test_a_taken_master_port_stops_node_0_before_any_rank(tmp_path: Path, held_port: int) -> None:
    project = render_project(
        tmp_path,
        launcher="shell",
        **{"network.master_port": held_port, "network.hccl_base_port": hccl_base_apart_from(held_port)},
    )
    record = with_fake_train(project, tmp_path)
    result = run_node(project, 0, script_env(record))
    assert result.returncode == 1, result.stdout + result.stderr
    out = result.stdout.splitlines()
    assert f"node 0: preflight FAIL: master port: {held_port} is taken (Address already in use)" in "\n".join(out)
    assert out[-1].startswith("node 0: preflight failed: nothing started; fix the above")
    assert not list(record.glob("rank-*.json"))


@pytest.mark.parametrize("address", ["::1", "::"])
def test_a_master_port_held_on_ipv6_alone_stops_node_0(tmp_path: Path, address: str) -> None:
    try:
        holder = socket.socket(socket.AF_INET6, socket.SOCK_STREAM)
        holder.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
        holder.bind((address, 0))
    except OSError:
        pytest.skip("no IPv6 on this host")
    with holder:
        holder.listen()
        port = holder.getsockname()[1]
        project = render_project(tmp_path, launcher="shell", **{"network.master_port": port})
        record = with_fake_train(project, tmp_path)
        result = run_node(project, 0, script_env(record))
    assert result.returncode == 1, result.stdout + result.stderr
    assert f"node 0: preflight FAIL: master port: {port} is taken (Address already in use)" in result.stdout
    assert not list(record.glob("rank-*.json"))


def test_a_host_ip_not_on_this_host_stops_the_node(tmp_path: Path) -> None:
    project = render_project(
        tmp_path,
        launcher="shell",
        nodes=2,
        **{"network.host_ips": ["127.0.0.1", FOREIGN], "network.master_addr": "127.0.0.1"},
    )
    record = with_fake_train(project, tmp_path)
    result = run_node(project, 1, script_env(record))
    assert result.returncode == 1, result.stdout + result.stderr
    assert f"node 1: preflight FAIL: HCCL_IF_IP: {FOREIGN} is not an address of this host" in result.stdout
    assert not list(record.glob("rank-*.json"))


def test_the_preflight_can_be_skipped(tmp_path: Path, held_port: int) -> None:
    project = render_project(
        tmp_path,
        launcher="shell",
        devices_per_node=1,
        **{"network.master_port": held_port, "network.hccl_base_port": hccl_base_apart_from(held_port)},
    )
    record = with_fake_train(project, tmp_path)
    result = run_node(project, 0, script_env(record, NPU_WIZARD_SKIP_PREFLIGHT="1"))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "node 0: preflight skipped (NPU_WIZARD_SKIP_PREFLIGHT=1)" in result.stdout.splitlines()
    assert (record / "rank-0.json").is_file()


def test_a_healthy_node_says_what_passed_in_one_line(tmp_path: Path) -> None:
    project = render_project(tmp_path, launcher="shell", devices_per_node=1, **{"network.master_port": free_port()})
    record = with_fake_train(project, tmp_path)
    result = run_node(project, 0, script_env(record))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "node 0: preflight ok: HCCL_IF_IP, master address, master port" in result.stdout.splitlines()


def test_simulated_nodes_do_not_wait_for_the_master(tmp_path: Path) -> None:
    project = render_project(tmp_path, launcher="shell", nodes=2, devices_per_node=1)
    record = with_fake_train(project, tmp_path)
    # node 0 never started: node 1 goes on without it (a 600 s wait would pass run_node's 30 s deadline); on
    # loopback the master check is skipped, and a refused port would pass at once anyway while the job starts
    result = run_node(project, 1, script_env(record, NPU_WIZARD_PREFLIGHT_WAIT="600"))
    assert result.returncode == 0, result.stdout + result.stderr


def node_0_env(**extra: str) -> dict[str, str]:
    """What node 0's launch script exports before its preflight, on loopback."""
    return {
        "NODE_RANK": "0",
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(free_port()),
        "HCCL_IF_IP": "127.0.0.1",
        **extra,
    }


def test_npu_without_cann_fails_listing_the_places_tried(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["--device", "npu", "--hccl-port-count", "1"]
    argv += ["--cann-tried", "/nonexistent/set_env.sh", "--cann-tried", "/usr/local/Ascend/cann/set_env.sh"]
    code = preflight.main(argv, env=node_0_env(HCCL_IF_BASE_PORT=str(free_port())))
    lines = capsys.readouterr().out.splitlines()
    assert code == preflight.EXIT_FAILED
    assert lines[0] == (
        "node 0: preflight FAIL: CANN: no CANN set_env.sh found (tried /nonexistent/set_env.sh, "
        "/usr/local/Ascend/cann/set_env.sh) and ASCEND_HOME_PATH is unset: torch_npu will not load; "
        "fix: install CANN, or set CANN_SET_ENV to its set_env.sh (the answers' environment.cann_set_env)"
    )
    assert lines[1] == "node 0: preflight ok: HCCL_IF_IP, master address, master port, HCCL ports"


def test_npu_with_cann_already_set_up_in_the_shell_passes(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["--device", "npu", "--hccl-port-count", "1", "--cann-tried", "/nonexistent/set_env.sh"]
    env = node_0_env(HCCL_IF_BASE_PORT=str(free_port()), ASCEND_HOME_PATH="/opt/cann")
    assert preflight.main(argv, env=env) == 0
    assert "CANN" in capsys.readouterr().out.splitlines()[-1]


def test_a_named_nic_replaces_hccl_if_ip_in_the_checks(capsys: pytest.CaptureFixture[str]) -> None:
    env = {k: v for k, v in node_0_env(HCCL_SOCKET_IFNAME="=lo").items() if k != "HCCL_IF_IP"}
    assert preflight.main(["--device", "cpu"], env=env) == 0
    assert capsys.readouterr().out.splitlines() == [
        "node 0: preflight ok: HCCL_SOCKET_IFNAME, master address, master port"
    ]
    assert preflight.check_socket_ifname("=lo").detail == "'=lo' is lo (127.0.0.1) on this host"


def test_a_nic_this_host_lacks_stops_the_node(capsys: pytest.CaptureFixture[str]) -> None:
    env = {k: v for k, v in node_0_env(HCCL_SOCKET_IFNAME="=nosuch0").items() if k != "HCCL_IF_IP"}
    assert preflight.main(["--device", "cpu"], env=env) == preflight.EXIT_FAILED
    first = capsys.readouterr().out.splitlines()[0]
    assert first.startswith("node 0: preflight FAIL: HCCL_SOCKET_IFNAME: '=nosuch0' names no interface with an address")
    assert "(interfaces: lo" in first


def test_a_failed_check_exits_with_its_own_code(capsys: pytest.CaptureFixture[str], held_port: int) -> None:
    code = preflight.main(["--device", "cpu"], env=node_0_env(MASTER_PORT=str(held_port)))
    assert code == preflight.EXIT_FAILED == 3  # the launch script tells it from a preflight that could not run
    assert "preflight FAIL: master port" in capsys.readouterr().out


# ---- the checks themselves --------------------------------------------------------------


def test_the_master_is_awaited_until_it_listens() -> None:
    port = free_port()
    now = [0.0]  # the check's clock, moved on by its sleeps alone
    with socket.socket() as server:

        def sleep(seconds: float) -> None:  # node 0 starts listening while the check waits, a second in
            now[0] += seconds
            if now[0] >= 1.0 and not listening:
                server.bind(("127.0.0.1", port))
                server.listen()
                listening.append(True)

        listening: list[bool] = []
        result = preflight.check_master_reachable("127.0.0.1", port, wait_s=5.0, sleep=sleep, clock=lambda: now[0])
    assert now[0] == 1.0  # tried again after each pause, and done at the first try that got in
    assert (result.status, result.detail) == (preflight.PASS, f"127.0.0.1:{port} accepts connections")


def test_a_master_that_never_listens_is_a_warning_after_the_wait() -> None:
    port = free_port()
    now = [0.0]  # the check's clock, moved on by its sleeps alone: the wait is counted, not timed

    def sleep(seconds: float) -> None:
        now[0] += seconds

    result = preflight.check_master_reachable("127.0.0.1", port, wait_s=1.0, sleep=sleep, clock=lambda: now[0])
    assert now[0] == 1.0  # it tried until the second was up, and no longer
    assert result.status == preflight.WARN
    assert result.detail == f"127.0.0.1 answers but nothing listens on {port} after 1s: node 0 may not have started yet"


def test_taken_hccl_ports_are_named_in_short_ranges(held_port: int) -> None:
    result = preflight.check_ports_free("HCCL ports", "127.0.0.1", held_port - 1, 3)
    assert result.status == preflight.FAIL
    assert result.detail == f"{held_port} taken on 127.0.0.1 (HCCL needs {held_port - 1}-{held_port + 1})"


@pytest.mark.parametrize(
    ("text", "ranges"),
    [
        ("", []),
        ("60000-60015\n", [(60000, 60015)]),
        ("22,29500,60000-60031", [(22, 22), (29500, 29500), (60000, 60031)]),
    ],
)
def test_reserved_port_lists_parse_as_the_kernel_writes_them(text: str, ranges: list[tuple[int, int]]) -> None:
    assert preflight.parse_port_list(text) == ranges


def test_visible_devices_parse_as_the_runtime_reads_them() -> None:
    assert preflight.parse_visible_devices("0,1,4,5") == (0, 1, 4, 5)
    for bad in ("1,0", "0,0", "0,x", ""):
        with pytest.raises(ValueError, match="ASCEND_RT_VISIBLE_DEVICES"):
            preflight.parse_visible_devices(bad)


def test_at_start_a_master_host_that_refuses_the_port_passes_at_once() -> None:
    # the route works; node 0's launcher is still starting and this node's launcher waits for it
    port = free_port()
    result = preflight.check_master_reachable("127.0.0.1", port, wait_s=60.0, starting=True)
    assert (result.status, result.detail) == (
        preflight.PASS,
        f"127.0.0.1 answers; nothing listens on {port} yet (node 0 is starting: the launcher waits for it)",
    )
