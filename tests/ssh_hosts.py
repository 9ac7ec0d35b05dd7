"""Two ssh hosts on this machine: network namespaces on the test's own bridge, each with its sshd.

The root namespace holds the bridge (10.X.Y.1, where `npu-wizard run` runs);
each host is a namespace with its own address (10.X.Y.2, 10.X.Y.3) and an sshd
bound to it with a host key and authorized_keys made here. The client key and
options are in `ssh_command`, meant for NPU_WIZARD_SSH_COMMAND; `rate_limited`
shapes one host's link with tc. Everything is removed afterwards: the daemons
by PID, the namespaces, the bridge.
"""

from __future__ import annotations

import os
import random
import shutil
import signal
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

SSHD = "/usr/sbin/sshd"


def have_ssh_hosts() -> bool:
    """Whether sshd, ssh, rsync and ip are installed and this process may make namespaces (root)."""
    tools = all(shutil.which(name) for name in ("ssh", "rsync", "ip", "ssh-keygen"))
    return tools and Path(SSHD).exists() and os.geteuid() == 0


def _run(*command: str) -> None:
    subprocess.run(command, check=True, capture_output=True, timeout=60)


def _with_set_env(extra: str, *assignments: str) -> str:
    """`extra` config lines with `assignments` added to its SetEnv: sshd takes only the first SetEnv line."""
    lines = extra.splitlines()
    given = [line.split(None, 1)[1] for line in lines if line.startswith("SetEnv ")]
    rest = [line for line in lines if not line.startswith("SetEnv ")]
    return "".join(f"{line}\n" for line in [*rest, "SetEnv " + " ".join([*assignments, *given])])


@dataclass
class SshHosts:
    """The hosts' addresses, the ssh command that reaches them, and what to tear down."""

    root: Path
    tag: str = field(default_factory=lambda: f"{os.getpid() % 10000}{random.randrange(100, 999)}")
    addresses: list[str] = field(default_factory=list)
    namespaces: list[str] = field(default_factory=list)
    pids: list[int] = field(default_factory=list)
    bridge: str = ""
    gateway: str = ""
    extra: dict[int, str] = field(default_factory=dict)
    """More sshd_config lines for host K (a Banner, a ForceCommand)."""
    ipv6: bool = False
    """Give each host an IPv6 address too (in addresses6), its sshd listening there as well."""
    addresses6: list[str] = field(default_factory=list)

    @property
    def ssh_command(self) -> str:
        """The ssh client command for NPU_WIZARD_SSH_COMMAND: the test's key, no known_hosts, batch mode."""
        return (
            f"ssh -F /dev/null -i {self.root / 'client_key'} -o BatchMode=yes -o StrictHostKeyChecking=no "
            "-o UserKnownHostsFile=/dev/null -o LogLevel=ERROR -o ConnectTimeout=10"
        )

    def start(self, count: int = 2) -> None:
        """Make the bridge, `count` namespaces with addresses, keys and an sshd each."""
        subnet = f"10.{random.randrange(100, 250)}.{random.randrange(1, 250)}"
        self.bridge, self.gateway = f"nwb{self.tag}", f"{subnet}.1"
        _run("ip", "link", "add", self.bridge, "type", "bridge")
        _run("ip", "addr", "add", f"{self.gateway}/24", "dev", self.bridge)
        _run("ip", "link", "set", self.bridge, "up")
        prefix6 = f"fd42:{random.randrange(0x1000, 0xFFFF):x}::"
        if self.ipv6:
            _run("ip", "-6", "addr", "add", f"{prefix6}1/64", "dev", self.bridge, "nodad")
        _run("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(self.root / "client_key"))
        authorized = self.root / "authorized_keys"
        shutil.copyfile(self.root / "client_key.pub", authorized)
        authorized.chmod(0o600)
        Path("/run/sshd").mkdir(mode=0o755, exist_ok=True)  # sshd's privilege separation folder
        for index in range(count):
            self._host(index, f"{subnet}.{index + 2}", f"{prefix6}{index + 2}" if self.ipv6 else None)

    def _host(self, index: int, address: str, address6: str | None) -> None:
        namespace, outside, inside = f"nwh{self.tag}{index}", f"nwv{self.tag}{index}", f"nwi{self.tag}{index}"
        _run("ip", "netns", "add", namespace)
        self.namespaces.append(namespace)
        _run("ip", "link", "add", outside, "type", "veth", "peer", "name", inside)
        _run("ip", "link", "set", outside, "master", self.bridge, "up")
        _run("ip", "link", "set", inside, "netns", namespace)
        _run("ip", "-n", namespace, "addr", "add", f"{address}/24", "dev", inside)
        _run("ip", "-n", namespace, "link", "set", inside, "up")
        _run("ip", "-n", namespace, "link", "set", "lo", "up")
        if address6:
            _run("ip", "-n", namespace, "-6", "addr", "add", f"{address6}/64", "dev", inside, "nodad")
        host_key = self.root / f"host{index}_key"
        _run("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(host_key))
        pid_file = self.root / f"sshd{index}.pid"
        config = self.root / f"sshd{index}.conf"
        config.write_text(
            f"ListenAddress {address}\n" + (f"ListenAddress {address6}\n" if address6 else "") + "Port 22\n"
            f"HostKey {host_key}\nPidFile {pid_file}\n"
            f"AuthorizedKeysFile {self.root / 'authorized_keys'}\nPermitRootLogin prohibit-password\n"
            "PasswordAuthentication no\nKbdInteractiveAuthentication no\nUsePAM no\nStrictModes no\n"
            "PermitUserEnvironment no\nMaxStartups 100\nMaxSessions 100\n"
            # this machine's root ~/.bashrc runs `pyenv init`, whose rehash waits 60 s for a lock that a session
            # killed during its login leaves behind (the suite kills remote ranks): every later login would hang.
            # OMP_NUM_THREADS=1: the hosts share this machine's cores, and a node's only rank would otherwise take
            # a thread for each of them (runtime/device.py): ranks of several hosts spinning on the same two cores
            # took four times as long, at three times the CPU (torchrun gives 1 where a node has 2 ranks or more)
             + _with_set_env(self.extra.get(index, ""), "PYENV_REHASH_TIMEOUT=1", "OMP_NUM_THREADS=1")
        )
        _run("ip", "netns", "exec", namespace, SSHD, "-f", str(config), "-E", str(self.root / f"sshd{index}.log"))
        deadline = time.monotonic() + 30
        while not (pid_file.is_file() and pid_file.read_text().strip().isdigit()):
            if time.monotonic() > deadline:
                raise AssertionError(f"sshd on {address} did not start; see {self.root / f'sshd{index}.log'}")
            time.sleep(0.1)
        self.pids.append(int(pid_file.read_text()))
        self.addresses.append(address)
        if address6:
            self.addresses6.append(address6)

    def links(self, index: int) -> tuple[str, str]:
        """Host `index`'s veth pair: the end on the bridge (root namespace) and the end inside the host."""
        return f"nwv{self.tag}{index}", f"nwi{self.tag}{index}"

    @contextmanager
    def rate_limited(self, index: int, rate: str) -> Iterator[None]:
        """Host `index`'s link shaped to `rate` (tc's words, e.g. 200mbit) both ways for the block.

        tc shapes what a device sends: the inside end for what the host sends, the
        bridge end for what it receives. The qdiscs go when the block ends.
        """
        outside, inside = self.links(index)
        shape = ("root", "tbf", "rate", rate, "burst", "256kb", "latency", "50ms")
        ends = [("ip", "netns", "exec", self.namespaces[index], "tc"), ("tc",)]
        devices = [inside, outside]
        added: list[tuple[tuple[str, ...], str]] = []
        try:
            for tc, device in zip(ends, devices, strict=True):
                _run(*tc, "qdisc", "add", "dev", device, *shape)
                added.append((tc, device))
            yield
        finally:
            for tc, device in added:
                subprocess.run(
                    [*tc, "qdisc", "del", "dev", device, "root"], capture_output=True, timeout=60, check=False
                )

    def stop(self) -> None:
        """Stop each sshd by PID, delete the namespaces and the bridge."""
        for pid in self.pids:
            try:
                os.kill(pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
        for namespace in self.namespaces:
            subprocess.run(["ip", "netns", "del", namespace], capture_output=True, timeout=60, check=False)
        if self.bridge:
            subprocess.run(["ip", "link", "del", self.bridge], capture_output=True, timeout=60, check=False)


@contextmanager
def ssh_hosts(
    root: Path, count: int = 2, extra: dict[int, str] | None = None, ipv6: bool = False
) -> Iterator[SshHosts]:
    """Started hosts under `root` (host K's sshd_config with extra[K] added), torn down when the block ends."""
    hosts = SshHosts(root, extra=extra or {}, ipv6=ipv6)
    try:
        hosts.start(count)
        yield hosts
    finally:
        hosts.stop()
