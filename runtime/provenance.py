"""What a rank started with, for `npu-wizard bundle`: versions and its HCCL/ASCEND/NPU_WIZARD variables.

Standard library only; nothing is imported to learn a version (an imported
module's __version__, else the installed distribution, says it). A variable
whose name says token, key, secret, password (passwd) or credential, in any
case, keeps its name and loses its value; the others lose any secret of a known
shape (runtime/secret_shapes.py), and NPU_WIZARD_SSH_COMMAND keeps only its program.
"""

from __future__ import annotations

import os
import platform
import re
import sys
from collections.abc import Mapping
from importlib import metadata

from . import cann as cann_install
from .secret_shapes import REDACTED, SSH_COMMAND_VARIABLE, program_only, scrub

PREFIXES = ("HCCL_", "ASCEND_", "NPU_WIZARD_")
HIDDEN = re.compile(r"token|key|secret|passw(?:or)?d|credential", re.IGNORECASE)
CANN_VARIABLES = ("ASCEND_HOME_PATH", "ASCEND_TOOLKIT_HOME")
# the started event crosses the status stream (one line of 256 KiB at most): bound what it carries
MAX_VARIABLES = 200
MAX_VALUE = 1024


def _version(distribution: str) -> str | None:
    """The module's own __version__ where it is imported (it has the local part, +cpu), else the installed one."""
    loaded = getattr(sys.modules.get(distribution), "__version__", None)
    if loaded:
        return str(loaded)
    try:
        return metadata.version(distribution)
    except metadata.PackageNotFoundError:
        return None


def versions(env: Mapping[str, str] = os.environ) -> dict[str, str | None]:
    """python, torch, torch_npu (None: not installed), the CANN the rank's environment set up and its release.

    `cann` is the install's folder, `cann_version` its release as its own version files say (None: none).
    """
    cann = next((env[name] for name in CANN_VARIABLES if env.get(name)), None)
    return {
        "python": platform.python_version(),
        "torch": _version("torch"),
        "torch_npu": _version("torch_npu"),
        "cann": cann,
        "cann_version": cann_install.toolkit_version(cann) if cann else None,
    }


def environment(env: Mapping[str, str] = os.environ) -> dict[str, str]:
    """The HCCL_, ASCEND_ and NPU_WIZARD_ variables, secrets' values replaced by a marker (bounded)."""
    names = [name for name in sorted(env) if name.startswith(PREFIXES)][:MAX_VARIABLES]
    return {name: _recorded(name, env[name]) for name in names}


def _recorded(name: str, value: str) -> str:
    if HIDDEN.search(name):
        return REDACTED
    # sshpass -p PASSWORD ssh ...: the program says enough
    if name == SSH_COMMAND_VARIABLE:
        return program_only(value)
    return scrub(value[:MAX_VALUE])
