"""Start runtime/userscript.py from its file, the runtime loaded under a name no repository uses.

    python PATH/TO/runtime/start_userscript.py SCRIPT [ARGS...]

`python -m runtime.userscript` needs the runtime's parent folder on sys.path
and makes its modules `runtime.*`: in a repository of the user's with a
package of its own named runtime, one of the two would hide the other. Started
from this file, the runtime's folder is loaded as the package
npu_wizard_runtime, the folder is taken off sys.path, and userscript.main runs
SCRIPT with its own folder first, as `python SCRIPT` does: the user's
`import runtime` finds theirs. Their report hook: `from npu_wizard_runtime import report`.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import sys
from pathlib import Path

PACKAGE = "npu_wizard_runtime"


def load_package(folder: Path, name: str = PACKAGE) -> None:
    """Import the runtime in `folder` as the package `name`, without `folder` or its parent on sys.path."""
    spec = importlib.util.spec_from_file_location(
        name, folder / "__init__.py", submodule_search_locations=[str(folder)]
    )
    if spec is None or spec.loader is None:
        raise ImportError(f"{folder} holds no runtime package (no __init__.py)")
    package = importlib.util.module_from_spec(spec)
    sys.modules[name] = package
    spec.loader.exec_module(package)


def main() -> int:
    """Load the runtime as npu_wizard_runtime and run the user's script as one rank; its exit status."""
    folder = Path(__file__).resolve().parent
    # `python FILE` put this folder first; userscript replaces the working folder there with SCRIPT's folder
    if sys.path and Path(sys.path[0] or ".").resolve() == folder:
        sys.path[0] = os.getcwd()
    load_package(folder)
    return importlib.import_module(f"{PACKAGE}.userscript").main()


if __name__ == "__main__":
    sys.exit(main())
