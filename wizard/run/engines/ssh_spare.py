"""A spare host's device network, checked over ssh before it takes a node's place (the ssh engine's part).

Doctor checks each node's NPUs' own network with hccn_tool (wizard/doctor/device_network.py): an address and
subnet, the link up, one TLS switch. A spare never ran doctor under this job, so before it takes a node's rank
the same check runs on it, each read-only hccn_tool call sent through the engine's ssh. A spare whose check
fails would stop every rank at the first collective; one that cannot be read is taken, as doctor only warns.
"""

from __future__ import annotations

import shlex
import subprocess
from collections.abc import Mapping, Sequence

from runtime.checks import FAIL
from wizard.answers.model import Answers
from wizard.doctor.device_network import Call, check_device_network

TOOL_FOLDERS = "/usr/local/Ascend/driver/tools:/usr/local/sbin:/usr/local/bin"  # where hccn_tool is, beyond PATH
CALL_S = 20.0  # the most one hccn_tool call over ssh may take


def spare_device_network(answers: Answers, host: str, ssh: Sequence[str]) -> list[str]:
    """What keeps `host` from taking a node's place, as doctor's device-network check finds it there; [] if fine."""

    def on_spare(argv: Sequence[str], env: Mapping[str, str]) -> Call:
        command = f'PATH="$PATH:{TOOL_FOLDERS}" {shlex.join(argv)}'
        try:
            done = subprocess.run(
                [*ssh, host, command], capture_output=True, text=True, errors="replace", timeout=CALL_S, check=False
            )
        except subprocess.TimeoutExpired:
            return Call(None, f"no answer over ssh within {CALL_S:g} s")
        except OSError as error:
            return Call(None, f"cannot run ssh: {error.strerror or error}")
        return Call(done.returncode, done.stdout + done.stderr)

    result = check_device_network(answers, {}, which=lambda name: name, run=on_spare)
    return [f"its device network fails doctor's check: {result.detail}"] if result.status == FAIL else []
