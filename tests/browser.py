"""Open a page in headless Chromium with no network, through the DevTools protocol over a pipe.

Chromium runs inside a fresh network namespace (`unshare -n`: not even loopback is up), so nothing the page
asks for can arrive; every request it makes is recorded anyway, with its console errors, uncaught exceptions
and log errors, the boxes of its plots, and a screenshot of the whole page. The protocol goes over
--remote-debugging-pipe (file descriptors 3 and 4, one JSON message per NUL), so no port is opened.
"""

from __future__ import annotations

import base64
import fcntl
import json
import os
import select
import shutil
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

WIDTH = 1200
LAYOUT = (
    "JSON.stringify({height: document.documentElement.scrollHeight, images: [...document.images].map(i => {"
    "const r = i.getBoundingClientRect(); return {id: i.id, x: r.x + scrollX, y: r.y + scrollY, "
    "width: r.width, height: r.height, natural: [i.naturalWidth, i.naturalHeight], complete: i.complete};})})"
)


def chromium() -> str | None:
    """The Chromium binary from the distribution's package, if installed."""
    return shutil.which("chromium") or shutil.which("chromium-browser")


def can_isolate_network() -> bool:
    """Whether this process may make a network namespace (root, or unprivileged user namespaces)."""
    return shutil.which("unshare") is not None and subprocess.run(["unshare", "-n", "true"]).returncode == 0


@dataclass
class PageVisit:
    """What the browser saw of one page."""

    screenshot: bytes
    images: list[dict[str, Any]]
    height: int
    requests: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)


class DevTools:
    """A DevTools protocol session over Chromium's debugging pipe."""

    def __init__(self, binary: str, profile: Path) -> None:
        to_browser, self._browser_in = os.pipe()
        self._browser_out, from_browser = os.pipe()
        # above 4 in this process, so the child's 3 and 4 are wired from them and they are closed after
        to_browser, from_browser = _above_four(to_browser), _above_four(from_browser)
        flags = [
            "--headless=new",
            "--no-sandbox",
            "--disable-gpu",
            "--no-first-run",
            "--disable-extensions",
            "--disable-background-networking",
            "--disable-component-update",
            f"--user-data-dir={profile}",
            "--remote-debugging-pipe",
            "about:blank",
        ]
        # the browser reads commands on fd 3 and writes answers on fd 4
        wiring = f'exec "$0" "$@" 3<&{to_browser} 4>&{from_browser} {to_browser}<&- {from_browser}>&-'
        self.process = subprocess.Popen(
            ["unshare", "-n", "bash", "-c", wiring, binary, *flags],
            pass_fds=(to_browser, from_browser),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )
        os.close(to_browser)
        os.close(from_browser)
        self._buffer = b""
        self._next_id = 0
        self.events: list[dict[str, Any]] = []

    def call(self, method: str, params: dict | None = None, session: str | None = None, timeout: float = 60) -> dict:
        """Send one command and return its result (events that arrive meanwhile are kept in `events`)."""
        self._next_id += 1
        message: dict[str, Any] = {"id": self._next_id, "method": method, "params": params or {}}
        if session:
            message["sessionId"] = session
        os.write(self._browser_in, json.dumps(message).encode() + b"\0")
        deadline = time.monotonic() + timeout
        while True:
            reply = self._receive(deadline)
            if reply.get("id") == self._next_id:
                if "error" in reply:
                    raise RuntimeError(f"{method}: {reply['error']}")
                return reply.get("result", {})
            self.events.append(reply)

    def wait_event(self, method: str, timeout: float = 60) -> dict:
        """The first event `method` (already received or arriving within `timeout`)."""
        deadline = time.monotonic() + timeout
        while True:
            found = next((e for e in self.events if e.get("method") == method), None)
            if found is not None:
                return found
            self.events.append(self._receive(deadline))

    def _receive(self, deadline: float) -> dict:
        while b"\0" not in self._buffer:
            left = deadline - time.monotonic()
            if left <= 0 or self.process.poll() is not None:
                raise TimeoutError(f"no answer from Chromium (exit code {self.process.poll()})")
            ready, _, _ = select.select([self._browser_out], [], [], min(left, 1.0))
            if ready:
                chunk = os.read(self._browser_out, 1 << 20)
                if not chunk:
                    raise TimeoutError("Chromium closed its debugging pipe")
                self._buffer += chunk
        message, self._buffer = self._buffer.split(b"\0", 1)
        return json.loads(message)

    def close(self) -> None:
        """Ask the browser to quit, and make sure it did."""
        try:
            self.call("Browser.close", timeout=10)
        except (OSError, RuntimeError, TimeoutError):
            pass
        try:
            self.process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        os.close(self._browser_in)
        os.close(self._browser_out)


def _above_four(fd: int) -> int:
    moved = fcntl.fcntl(fd, fcntl.F_DUPFD, 10)
    os.close(fd)
    return moved


def visit(page: Path, binary: str, *, timeout: float = 120) -> PageVisit:
    """Open `page` (a local file) offline; return its screenshot, plot boxes, requests and errors."""
    with tempfile.TemporaryDirectory(prefix="chromium-profile-") as profile:
        tools = DevTools(binary, Path(profile))
        try:
            target = tools.call("Target.createTarget", {"url": "about:blank"}, timeout=timeout)["targetId"]
            session = tools.call("Target.attachToTarget", {"targetId": target, "flatten": True})["sessionId"]
            for domain in ("Page", "Runtime", "Log", "Network"):
                tools.call(f"{domain}.enable", session=session)
            metrics = {"width": WIDTH, "height": 900, "deviceScaleFactor": 1, "mobile": False}
            tools.call("Emulation.setDeviceMetricsOverride", metrics, session=session)
            tools.call("Page.navigate", {"url": page.resolve().as_uri()}, session=session)
            tools.wait_event("Page.loadEventFired", timeout=timeout)
            layout = tools.call("Runtime.evaluate", {"expression": LAYOUT, "returnByValue": True}, session=session)
            found = json.loads(layout["result"]["value"])
            tools.call("Emulation.setDeviceMetricsOverride", {**metrics, "height": found["height"]}, session=session)
            shot = tools.call(
                "Page.captureScreenshot", {"format": "png", "captureBeyondViewport": True}, session=session
            )
        finally:
            tools.close()
    requests = [e["params"]["request"]["url"] for e in tools.events if e.get("method") == "Network.requestWillBeSent"]
    return PageVisit(base64.b64decode(shot["data"]), found["images"], found["height"], requests, _errors(tools.events))


def _errors(events: list[dict[str, Any]]) -> list[str]:
    """Console errors, uncaught exceptions and log entries of level error."""
    found = []
    for event in events:
        method, params = event.get("method"), event.get("params", {})
        if method == "Runtime.consoleAPICalled" and params.get("type") in ("error", "assert"):
            found.append("console: " + " ".join(str(a.get("value", a.get("description"))) for a in params["args"]))
        elif method == "Runtime.exceptionThrown":
            found.append("exception: " + json.dumps(params.get("exceptionDetails", {}))[:500])
        elif method == "Log.entryAdded" and params.get("entry", {}).get("level") == "error":
            found.append(f"log: {params['entry'].get('text')} ({params['entry'].get('url', '')})")
    return found
