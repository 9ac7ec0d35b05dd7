"""Where CANN's set_env.sh is, as the launch scripts look for it (standard library only).

CANN 8.5 and later install to `<root>/cann/`, earlier releases to
`<root>/ascend-toolkit/`, runtime-only installs to `<root>/nnae/`; the root
is the one /etc/Ascend/ascend_cann_install.info names, /usr/local/Ascend,
or `$HOME/Ascend` for a non-root install (ASCEND.md). The launch script
tries the answer (or CANN_SET_ENV) first, then these, in this order.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping, Sequence
from pathlib import Path

from .checks import FAIL, PASS, SKIP, Result

INSTALL_INFO = Path("/etc/Ascend/ascend_cann_install.info")
LAYOUTS = ("cann", "ascend-toolkit", "nnae")
CANN_VARIABLES = ("ASCEND_TOOLKIT_HOME", "ASCEND_HOME_PATH")
# A CANN install says its release in <home>/<arch>-linux/ascend_toolkit_install.info
# ("version=8.0.RC2"; Huawei's install guides: "check the version field") and in
# <home>/version.cfg ("toolkit_running_version=[7.3.0.1.231:8.0.RC2]": internal:release).
VERSION_FILE_BYTES = 64 * 1024
INSTALL_INFO_NAME = "ascend_toolkit_install.info"
RUNNING_VERSION = re.compile(
    r"^(?:toolkit|runtime)_running_version=\[(?:[^:\]]*:)?([^\]]+)\]", re.MULTILINE
)


def install_roots(
    env: Mapping[str, str], install_info: Path = INSTALL_INFO
) -> list[str]:
    """The folders CANN may be installed under, most specific first."""
    roots = []
    try:
        for line in install_info.read_text().splitlines():
            key, _, value = line.partition("=")
            if key.strip() == "Install_Path" and value.strip():
                roots.append(value.strip().rstrip("/"))
    except OSError:
        pass
    roots.append("/usr/local/Ascend")
    if env.get("HOME"):
        roots.append(f"{env['HOME'].rstrip('/')}/Ascend")
    return list(dict.fromkeys(roots))


def candidates(
    answer: str, env: Mapping[str, str], install_info: Path = INSTALL_INFO
) -> list[str]:
    """Every set_env.sh to try, in order: CANN_SET_ENV or the answer, then the known places."""
    first = env.get("CANN_SET_ENV") or answer
    known = [
        f"{root}/{layout}/set_env.sh"
        for root in install_roots(env, install_info)
        for layout in LAYOUTS
    ]
    return list(dict.fromkeys([first, *known] if first else known))


def find_set_env(
    answer: str, env: Mapping[str, str], install_info: Path = INSTALL_INFO
) -> tuple[str, list[str]]:
    """The first set_env.sh that exists ('' if none) and the places tried."""
    tried = candidates(answer, env, install_info)
    return next((path for path in tried if Path(path).is_file()), ""), tried


def check_cann(
    device: str, set_env: str, env: Mapping[str, str], tried: Sequence[str] = ()
) -> Result:
    """On NPUs, torch_npu needs CANN: a set_env.sh found (and sourced), or CANN already set up."""
    name = "CANN"
    if device == "cpu":
        return Result(name, SKIP, "not needed for device cpu")
    if set_env and Path(set_env).is_file():
        return Result(name, PASS, f"{set_env}")
    found = [variable for variable in CANN_VARIABLES if env.get(variable)]
    if found:
        return Result(name, PASS, f"set up in this shell ({found[0]}={env[found[0]]})")
    places = (
        ", ".join(dict.fromkeys([*tried, set_env] if set_env else tried))
        or "set_env.sh"
    )
    return Result(
        name,
        FAIL if device == "npu" else SKIP,
        f"no CANN set_env.sh found (tried {places}) and {CANN_VARIABLES[1]} is unset: torch_npu will not load",
        "install CANN, or set CANN_SET_ENV to its set_env.sh (the answers' environment.cann_set_env)",
    )


def toolkit_version(home: str, machine: str = "") -> str | None:
    """The CANN release installed at `home` (ASCEND_HOME_PATH), from its own version files; None if none says."""
    if not home:
        return None
    root = Path(home)
    arch = f"{machine or os.uname().machine}-linux"
    for line in _read_small(root / arch / INSTALL_INFO_NAME).splitlines():
        key, _, value = line.partition("=")
        if key.strip() == "version" and value.strip():
            return value.strip()
    found = RUNNING_VERSION.search(_read_small(root / "version.cfg"))
    return found.group(1).strip() if found else None


def _read_small(path: Path) -> str:
    """The start of a small text file, '' when it cannot be read."""
    try:
        with path.open("rb") as file:
            return file.read(VERSION_FILE_BYTES).decode("utf-8", "replace")
    except OSError:
        return ""
