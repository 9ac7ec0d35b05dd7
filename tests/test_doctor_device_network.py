"""`npu-wizard doctor` reads the device network of a multi-node NPU project with hccn_tool, read only.

No NPU exists here: a recording test double of hccn_tool (a bash script on
PATH) answers `-ip -g`, `-link -g`, `-tls -g` and `-net_health -g` the way the
driver's tool prints them, or fails as it does (a non-zero exit code), and
writes down every argv it gets, so the tests also prove that doctor only reads.
"""

from __future__ import annotations

from pathlib import Path

from runtime.checks import FAIL, PASS, SKIP, WARN
from tests.factories import answers
from wizard.answers.model import Answers
from wizard.doctor import System, device_network, examine
from wizard.doctor.probe import Software

HCCN_TOOL_DOUBLE = """\
#!/usr/bin/env bash
# hccn_tool test double (no NPU here): records its argv, answers like the driver's tool.
# HCCN_DOUBLE_DOWN / _NO_IP / _TLS_ON / _FAULT / _FAIL: space-separated device ids with a
# link down, without an address, with the TLS switch on, with a net health fault, whose
# every call fails (as for a user without rights, an unknown id or a driver that is down).
printf '%s\\n' "$*" >>"$HCCN_DOUBLE_RECORD"
device="$2"
has() { [[ " $1 " == *" $device "* ]]; }
if has "${HCCN_DOUBLE_FAIL:-}"; then
    echo "Permission denied, please run as root" >&2
    exit 255
fi
case "$3" in
    -ip)
        if has "${HCCN_DOUBLE_NO_IP:-}"; then echo "ipaddr:"; else
            echo "ipaddr:192.168.100.$((101 + device))"
            echo "netmask:255.255.255.0"
        fi ;;
    -link) if has "${HCCN_DOUBLE_DOWN:-}"; then echo "link status: DOWN"; else echo "link status: UP"; fi ;;
    -tls)
        switch=0
        if has "${HCCN_DOUBLE_TLS_ON:-}"; then switch=1; fi
        echo "dev_id:$device, tls switch[$switch](0:disable, 1:enable), tls preconfigured[1]" ;;
    -net_health)
        health=Success
        if has "${HCCN_DOUBLE_FAULT:-}"; then health=Fault; fi
        echo "net health status: $health" ;;
    *) echo "unknown option $3" >&2; exit 1 ;;
esac
"""


def npu_cluster(**overrides: object) -> Answers:
    """An NPU project of 2 nodes x 4 devices on an A2."""
    base: dict[str, object] = {
        "device": "npu",
        "hardware": "atlas-a2",
        "nodes": 2,
        "devices_per_node": 4,
        "network__host_ips": ["10.0.0.1", "10.0.0.2"],
        "network__master_addr": "10.0.0.1",
    }
    return answers(**{**base, **overrides})


def double_env(tmp_path: Path, **behaviour: str) -> dict[str, str]:
    """An environment with the hccn_tool double first on PATH."""
    folder = tmp_path / "hccn_tool_double"
    folder.mkdir(exist_ok=True)
    tool = folder / "hccn_tool"
    tool.write_text(HCCN_TOOL_DOUBLE)
    tool.chmod(0o755)
    return {"PATH": f"{folder}:/usr/bin:/bin", "HCCN_DOUBLE_RECORD": str(tmp_path / "hccn_calls"), **behaviour}


def calls(tmp_path: Path) -> list[str]:
    """Every argv the double got, in order."""
    return (tmp_path / "hccn_calls").read_text().splitlines()


def test_a_ready_device_network_passes_and_doctor_only_reads(tmp_path: Path) -> None:
    result = device_network.check_device_network(npu_cluster(), double_env(tmp_path))
    assert result.status == PASS
    assert result.detail.startswith(
        "addresses 0=192.168.100.101/255.255.255.0, 1=192.168.100.102/255.255.255.0, "
        "2=192.168.100.103/255.255.255.0, 3=192.168.100.104/255.255.255.0, links up, TLS switch 0, net health Success"
    )
    expected = [f"-i {n} {what} -g" for n in range(4) for what in ("-ip", "-link", "-tls", "-net_health")]
    assert calls(tmp_path) == expected


def test_a_device_without_address_a_link_down_and_mixed_tls_fail_by_name(tmp_path: Path) -> None:
    env = double_env(tmp_path, HCCN_DOUBLE_NO_IP="2", HCCN_DOUBLE_DOWN="3", HCCN_DOUBLE_TLS_ON="1")
    result = device_network.check_device_network(npu_cluster(), env)
    assert result.status == FAIL
    assert result.detail == (
        "device 2 has no address (hccn_tool -i 2 -ip -g); device 3 link DOWN (hccn_tool -i 3 -link -g); "
        "TLS switch differs between devices (0: 0, 1: 1, 2: 0, 3: 0)"
    )
    assert "hccn_tool -i N -ip -s" in result.fix and "TLS" in result.fix


def test_a_failing_hccn_tool_call_is_unread_not_a_device_without_address(tmp_path: Path) -> None:
    result = device_network.check_device_network(npu_cluster(), double_env(tmp_path, HCCN_DOUBLE_FAIL="1"))
    assert result.status == WARN
    assert "has no address" not in result.detail and "link unknown" not in result.detail
    assert result.detail.startswith(
        "could not read the device network: hccn_tool -i 1 -ip -g failed "
        "(exit code 255: Permission denied, please run as root); hccn_tool -i 1 -link -g failed"
    )
    assert "run doctor as root" in result.fix and "logical id" in result.fix


def test_a_failing_call_is_named_beside_the_faults_that_were_read(tmp_path: Path) -> None:
    env = double_env(tmp_path, HCCN_DOUBLE_FAIL="0", HCCN_DOUBLE_DOWN="3")
    result = device_network.check_device_network(npu_cluster(), env)
    assert result.status == FAIL
    assert result.detail.startswith("device 3 link DOWN (hccn_tool -i 3 -link -g); hccn_tool -i 0 -ip -g failed")
    assert "device 0 has no address" not in result.detail


def test_a_net_health_fault_is_reported_by_device(tmp_path: Path) -> None:
    result = device_network.check_device_network(npu_cluster(), double_env(tmp_path, HCCN_DOUBLE_FAULT="2"))
    assert result.status == WARN
    assert result.detail == "device 2 net health Fault (hccn_tool -i 2 -net_health -g)"


def test_a_tool_that_cannot_run_is_unread_without_a_traceback(tmp_path: Path) -> None:
    tool = tmp_path / "hccn_tool"
    tool.write_text("not a program")
    tool.chmod(0o644)  # found, but not executable: running it raises PermissionError
    result = device_network.check_device_network(npu_cluster(), {"PATH": "/bin"}, which=lambda name: str(tool))
    assert result.status == WARN and "cannot run it" in result.detail


def test_output_that_is_not_utf_8_is_read_without_a_traceback(tmp_path: Path) -> None:
    env = double_env(tmp_path)
    double = tmp_path / "hccn_tool_double" / "hccn_tool"
    double.rename(double.with_name("hccn_tool_utf8"))
    double.write_text(  # a line in GBK first, as a tool under a Chinese locale may print it
        '#!/usr/bin/env bash\nprintf \'\\xb3\\xc9\\xb9\\xa6\\n\'\nexec "$0_utf8" "$@"\n'
    )
    double.chmod(0o755)
    result = device_network.check_device_network(npu_cluster(), env)
    assert result.status == PASS, result.detail
    assert "addresses 0=192.168.100.101/255.255.255.0" in result.detail


def test_visible_devices_decide_which_devices_are_read(tmp_path: Path) -> None:
    project = npu_cluster(devices_per_node=2)
    env = double_env(tmp_path, ASCEND_RT_VISIBLE_DEVICES="4,5")
    assert device_network.check_device_network(project, env).status == PASS
    assert {line.split()[1] for line in calls(tmp_path)} == {"4", "5"}


def test_without_hccn_tool_doctor_warns_and_says_how_to_check_by_hand(tmp_path: Path) -> None:
    result = device_network.check_device_network(npu_cluster(), {"PATH": str(tmp_path)})
    assert result.status == WARN
    assert result.detail.startswith("hccn_tool not found")
    assert "hccn_tool -i N -ip -g, -link -g, -tls -g and -net_health -g" in result.fix


def test_one_node_or_the_cpu_skips_it(tmp_path: Path) -> None:
    env = double_env(tmp_path)
    one_node = npu_cluster(nodes=1, network__host_ips=["10.0.0.1"])
    assert device_network.check_device_network(one_node, env).status == SKIP
    assert device_network.check_device_network(npu_cluster(device="cpu"), env).status == SKIP
    assert not (tmp_path / "hccn_calls").exists()


def test_doctor_reports_the_device_network_among_its_checks(tmp_path: Path) -> None:
    system = System(env=double_env(tmp_path), probe=lambda env: Software(python="3.11.7"))
    report = examine(npu_cluster(), node=0, system=system)
    (found,) = [r for r in report.results if r.name == "device network"]
    assert found.status == PASS
