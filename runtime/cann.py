"""Where CANN's set_env.sh is, as the launch scripts look for it (standard library only).

CANN 8.5 and later install to `<root>/cann/`, earlier releases to
`<root>/ascend-toolkit/`, runtime-only installs to `<root>/nnae/`; the root
is the one /etc/Ascend/ascend_cann_install.info names, /usr/local/Ascend,
or `$HOME/Ascend` for a non-root install (ASCEND.md). The launch script
tries the answer (or CANN_SET_ENV) first, then these, in this order.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

from runtime.checks import FAIL, PASS, SKIP, Result

INSTALL_INFO = Path("/etc/Ascend/ascend_cann_install.info")
LAYOUTS = ("cann", "ascend-toolkit", "nnae")
CANN_VARIABLES = ("ASCEND_TOOLKIT_HOME", "ASCEND_HOME_PATH")


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
