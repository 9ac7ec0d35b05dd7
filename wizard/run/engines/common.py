"""What the remote engines share: the interpreter the nodes use and the command runner."""

from __future__ import annotations

import socket
import subprocess
from collections.abc import Mapping, Sequence

from wizard.answers.model import Answers
from wizard.run.engines.interpreter import ENV_PYTHON, interpreter

ENV_STATUS_HOST = "NPU_WIZARD_STATUS_HOST"
"""The host name or address the nodes reach this runner at, where the engine cannot tell."""
ENV_SPARE_ADDR = "NPU_WIZARD_SPARE_ADDR"
"""Set for node K's launch script on a spare host: that host's address, its HCCL_IF_IP (launch/nodeK.sh)."""


def node_environment(answers: Answers, env: Mapping[str, str]) -> dict[str, str]:
    """The ranks' extra environment plus PYTHON, the interpreter by absolute path.

    A non-interactive remote shell does not activate the user's virtual environment or
    conda env, so the nodes get its interpreter by absolute path (the same on every host,
    as on a shared home) and its folder first on PATH, where torchrun lives.
    """
    return {**env, ENV_PYTHON: interpreter(answers, env)}


def route_source(host: str) -> str | None:
    """The local address this host uses to reach `host` (None when it cannot tell)."""
    try:
        infos = socket.getaddrinfo(host, 9, type=socket.SOCK_DGRAM)
    except OSError:
        return None
    for family, kind, proto, _name, address in infos:
        with socket.socket(family, kind, proto) as probe:
            try:
                probe.connect(address)  # UDP: picks the route, sends nothing
            except OSError:
                continue
            return str(probe.getsockname()[0])
    return None


def run_command(
    command: Sequence[str], *, env: Mapping[str, str] | None = None, timeout: float = 60.0, cwd: str | None = None
) -> subprocess.CompletedProcess[str]:
    """Run a short command to its end and capture its output (never raises on a non-zero exit)."""
    try:
        return subprocess.run(
            list(command),
            env=None if env is None else dict(env),
            cwd=cwd,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
    except FileNotFoundError as error:
        return subprocess.CompletedProcess(list(command), 127, "", f"{command[0]}: not found ({error})")
    except subprocess.TimeoutExpired:
        return subprocess.CompletedProcess(list(command), 124, "", f"{command[0]}: no answer within {timeout:.0f}s")
