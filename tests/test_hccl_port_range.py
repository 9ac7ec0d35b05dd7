"""HCCL_HOST_SOCKET_PORT_RANGE and HCCL_NPU_SOCKET_PORT_RANGE: the checks and the scripts follow the one in force.

On the A2 and A3 series HCCL_HOST_SOCKET_PORT_RANGE, where a node sets it,
overrides HCCL_IF_BASE_PORT, and HCCL_NPU_SOCKET_PORT_RANGE moves device port
16666 (CANN's HCCL environment docs). The launch script and sysctl/reserve-ports.sh
run for real under bash; the preflight and doctor bind real sockets.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from runtime import hccl_ports, preflight
from runtime.checks import FAIL, PASS, SKIP, WARN
from tests.factories import answers
from tests.runs import free_port
from tests.test_launch_scripts import render_project, run_node, script_env, with_fake_train
from wizard.answers.model import Answers
from wizard.doctor import network

CANN_SET_UP = {"ASCEND_HOME_PATH": "/opt/cann-set-up-already"}


def node_0_env(**extra: str) -> dict[str, str]:
    """Node 0 of a loopback NPU job, its master port and HCCL base port free."""
    return {
        "NODE_RANK": "0",
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(free_port()),
        "HCCL_IF_IP": "127.0.0.1",
        "HCCL_IF_BASE_PORT": str(free_port()),
        **CANN_SET_UP,
        **extra,
    }


def preflight_lines(capsys: pytest.CaptureFixture[str], env: dict[str, str], *flags: str) -> tuple[int, list[str]]:
    """The preflight's exit code and lines for an NPU node with `env`."""
    code = preflight.main(["--device", "npu", "--hccl-port-count", "1", *flags], env=env)
    return code, capsys.readouterr().out.splitlines()


# ---- the preflight ------------------------------------------------------------------------


def test_a_taken_port_of_the_host_port_range_stops_an_a2_node(
    capsys: pytest.CaptureFixture[str], held_port: int
) -> None:
    env = node_0_env(HCCL_HOST_SOCKET_PORT_RANGE=f"{held_port - 1}-{held_port}")
    code, lines = preflight_lines(capsys, env, "--hccl-reads-port-range")
    assert code == preflight.EXIT_FAILED
    assert lines[0].startswith(
        f"node 0: preflight FAIL: HCCL ports: {held_port} taken on 127.0.0.1 (HCCL needs {held_port - 1}-{held_port} "
        f"(HCCL_HOST_SOCKET_PORT_RANGE={held_port - 1}-{held_port}), which overrides HCCL_IF_BASE_PORT)"
    )


def test_the_atlas_training_series_checks_the_base_port_whatever_the_range_says(
    capsys: pytest.CaptureFixture[str], held_port: int
) -> None:
    code, lines = preflight_lines(capsys, node_0_env(HCCL_HOST_SOCKET_PORT_RANGE=str(held_port)))
    assert code == 0 and lines[-1].endswith("HCCL ports")


def test_a_free_host_port_range_passes_and_auto_has_nothing_to_check() -> None:
    free = free_port()
    result = preflight.check_hccl_ports_in_force("127.0.0.1", {hccl_ports.HOST_RANGE: f"{free}"}, 32, True)
    assert (result.status, result.detail) == (
        PASS,
        f"{free} (HCCL_HOST_SOCKET_PORT_RANGE={free}) free on 127.0.0.1, overriding HCCL_IF_BASE_PORT",
    )
    auto = preflight.check_hccl_ports_in_force("127.0.0.1", {hccl_ports.HOST_RANGE: "auto"}, 32, True)
    assert (auto.status, auto.detail) == (
        PASS,
        "chosen by the kernel (HCCL_HOST_SOCKET_PORT_RANGE=auto): none to check",
    )


@pytest.mark.parametrize(
    "value",
    [
        "60000-",
        "sixty",
        "60010-60000",
        "0-10",
        "60000;60001",
        "\u0666\u0660\u0660\u0660\u0660",  # 60000 in Arabic-Indic digits: Python's int() reads it, HCCL does not
        "\u00b2",  # a superscript two: str.isdigit() says yes, int() raises
        "60000-60010,60005",  # CANN: the ports and ranges between commas must not overlap
        "60000,60000",
        ",".join(["1024-65535"] * 2),
    ],
)
def test_a_host_port_range_hccl_cannot_read_fails_naming_it(value: str) -> None:
    result = preflight.check_hccl_ports_in_force("127.0.0.1", {hccl_ports.HOST_RANGE: value}, 32, True)
    assert result.status == FAIL and result.detail.startswith(f"HCCL_HOST_SOCKET_PORT_RANGE={value!r}")


def test_overlapping_ports_are_named_in_the_refusal() -> None:
    with pytest.raises(ValueError, match=r": 60000-60010 and 60005 overlap, which CANN does not allow"):
        hccl_ports.parse_ports(hccl_ports.HOST_RANGE, "60005, 60000-60010")


@pytest.mark.parametrize("value", ["\u0666\u0660\u0660\u0660\u0660", "\u00b2", "6e4"])
def test_a_base_port_hccl_cannot_read_fails_naming_it(value: str) -> None:
    result = preflight.check_hccl_ports_in_force("127.0.0.1", {hccl_ports.BASE_PORT: value}, 32, False)
    assert (result.status, result.detail) == (FAIL, f"HCCL_IF_BASE_PORT={value!r} is not a port of 1024-65520")


@pytest.mark.parametrize(
    ("value", "text"),
    [("60000-60050", "60000-60050"), ("60150-60160,60000, 60050-60100", "60000,60050-60100,60150-60160")],
)
def test_port_lists_parse_as_cann_documents_them(value: str, text: str) -> None:
    assert hccl_ports.host_ports({hccl_ports.HOST_RANGE: value}, 32, reads_range=True).text == text


# ---- the launch script, for real --------------------------------------------------------


def npu_project(tmp_path: Path, hardware: str = "atlas-a2") -> Path:
    """A one-node, two-device NPU project on loopback (the fake rank stands in for train.py)."""
    return render_project(
        tmp_path, device="npu", hardware=hardware, launcher="shell", **{"network.hccl_port_count": 16}
    )


def test_the_launch_script_says_which_variable_decides_and_its_preflight_follows_it(
    tmp_path: Path, held_port: int
) -> None:
    project = npu_project(tmp_path)
    record = with_fake_train(project, tmp_path)
    env = script_env(
        record, HCCL_HOST_SOCKET_PORT_RANGE=str(held_port), HCCL_NPU_SOCKET_PORT_RANGE="61000-61015", **CANN_SET_UP
    )
    result = run_node(project, 0, env)
    assert result.returncode == 1, result.stdout + result.stderr
    assert (
        f"node 0: HCCL host ports from HCCL_HOST_SOCKET_PORT_RANGE={held_port}, which overrides HCCL_IF_BASE_PORT="
        in result.stdout
    )
    assert "node 0: HCCL device port(s) from HCCL_NPU_SOCKET_PORT_RANGE=61000-61015, not 16666" in result.stdout
    assert f"preflight FAIL: HCCL ports: {held_port} taken on 127.0.0.1" in result.stdout
    assert not list(record.glob("rank-*.json"))  # no rank started


def test_without_the_range_the_launch_script_names_the_base_port(tmp_path: Path) -> None:
    project = npu_project(tmp_path)
    record = with_fake_train(project, tmp_path)
    result = run_node(project, 0, script_env(record, NPU_WIZARD_SKIP_PREFLIGHT="1", **CANN_SET_UP))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "node 0: HCCL host ports from HCCL_IF_BASE_PORT=60000 (16 ports)" in result.stdout
    assert "HCCL_NPU_SOCKET_PORT_RANGE" not in result.stdout


# ---- sysctl/reserve-ports.sh -----------------------------------------------------------


def reserve_print(project: Path, tmp_path: Path, **env: str) -> subprocess.CompletedProcess[str]:
    """`bash sysctl/reserve-ports.sh --print` against an empty reserved list."""
    current = tmp_path / "reserved"
    current.write_text("\n")
    return subprocess.run(
        ["bash", str(project / "sysctl" / "reserve-ports.sh"), "--print"],
        env={"PATH": "/usr/bin:/bin", "NPU_WIZARD_RESERVED_PORTS_FILE": str(current), **env},
        capture_output=True,
        text=True,
        timeout=30,
    )


def test_reserve_ports_reserves_the_host_port_range_in_force(tmp_path: Path) -> None:
    project = npu_project(tmp_path)
    assert reserve_print(project, tmp_path).stdout.strip() == "29500,60000-60015"
    moved = reserve_print(project, tmp_path, HCCL_HOST_SOCKET_PORT_RANGE="61000-61031,61100")
    assert moved.stdout.strip() == "29500,61000-61031,61100"
    assert "overrides HCCL_IF_BASE_PORT" in moved.stderr
    auto = reserve_print(project, tmp_path, HCCL_HOST_SOCKET_PORT_RANGE="auto")
    assert auto.stdout.strip() == "29500" and "only the master port" in auto.stderr


@pytest.mark.parametrize(
    ("value", "shown"),
    [
        ("60000\n60001", "$'60000\\n60001'"),  # the line break reached /etc/sysctl.d in --permanent's comment
        ("60000\t60001", "$'60000\\t60001'"),
        ("6 0000", "6\\ 0000"),  # taken for 60000, which the preflight refuses
        ("$(echo 61000)", "\\$\\(echo\\ 61000\\)"),  # shown as bash's printf %q quotes it, never run
    ],
)
def test_reserve_ports_refuses_a_host_port_range_hccl_cannot_read(tmp_path: Path, value: str, shown: str) -> None:
    project = npu_project(tmp_path)
    result = reserve_print(project, tmp_path, HCCL_HOST_SOCKET_PORT_RANGE=value)
    assert (result.returncode, result.stdout) == (1, "")
    assert result.stderr == (
        f"HCCL_HOST_SOCKET_PORT_RANGE={shown} is not a port list: give ports and ranges with commas "
        "(60000-60031,60100) or auto\n"
    )


def test_reserve_ports_of_the_atlas_training_series_ignores_the_range(tmp_path: Path) -> None:
    project = npu_project(tmp_path, hardware="atlas-training")
    moved = reserve_print(project, tmp_path, HCCL_HOST_SOCKET_PORT_RANGE="61000-61031")
    assert moved.stdout.strip() == "29500,60000-60015"


# ---- doctor ------------------------------------------------------------------------------


def npu_answers(**overrides: object) -> Answers:
    """An A2 NPU project of one node on loopback."""
    return answers(**{"device": "npu", "hardware": "atlas-a2", "network__hccl_port_count": 16, **overrides})


def port_facts(tmp_path: Path, reserved: str) -> network.PortFacts:
    """The kernel's lists as doctor reads them: the usual ephemeral range, `reserved` reserved."""
    (tmp_path / "reserved").write_text(reserved + "\n")
    (tmp_path / "range").write_text("32768\t60999\n")
    return network.read_port_facts(tmp_path / "reserved", tmp_path / "range")


def test_doctor_judges_the_reservation_of_the_host_port_range_in_force(tmp_path: Path) -> None:
    facts = port_facts(tmp_path, "60000-60015")
    assert network.check_hccl_reserved(npu_answers(), facts, {}).status == PASS
    moved = network.check_hccl_reserved(npu_answers(), facts, {hccl_ports.HOST_RANGE: "50000-50031"})
    assert moved.status == FAIL
    assert moved.detail.startswith("50000-50031 lie in the ephemeral range 32768-60999 and are not reserved")
    assert moved.detail.endswith("HCCL's host ports here: 50000-50031 (HCCL_HOST_SOCKET_PORT_RANGE=50000-50031)")
    training = network.check_hccl_reserved(
        npu_answers(hardware="atlas-training"), facts, {hccl_ports.HOST_RANGE: "50000-50031"}
    )
    assert training.status == PASS and "HCCL_IF_BASE_PORT=60000" in training.detail


def test_doctor_checks_the_host_port_range_in_force_is_free(held_port: int) -> None:
    node = network.Node(0, "127.0.0.1", "simulated")
    if_ip = preflight.check_hccl_if_ip("127.0.0.1")
    result = network.check_hccl_free(npu_answers(), node, if_ip, {hccl_ports.HOST_RANGE: str(held_port)})
    assert result.status == FAIL and result.name == "HCCL ports free"
    assert f"HCCL_HOST_SOCKET_PORT_RANGE={held_port}" in result.detail


def test_doctor_says_which_device_port_a_node_has() -> None:
    default = network.check_device_port(npu_answers(), {})
    assert (default.status, default.detail) == (PASS, "16666 (the default: HCCL_NPU_SOCKET_PORT_RANGE is not set)")
    moved = network.check_device_port(npu_answers(), {hccl_ports.NPU_RANGE: "61000-61015"})
    assert moved.status == WARN
    assert moved.detail == (
        "61000-61015 (HCCL_NPU_SOCKET_PORT_RANGE=61000-61015), not 16666: every node of the job must set the same"
    )
    assert network.check_device_port(npu_answers(), {hccl_ports.NPU_RANGE: "x"}).status == FAIL
    assert network.check_device_port(answers(device="cpu"), {}).status == SKIP
