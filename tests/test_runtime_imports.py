"""The runtime stays small: importing it pulls in no wizard, Textual, Jinja or YAML."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
MODULES = sorted(p.stem for p in (REPO / "runtime").glob("*.py") if p.stem != "__init__")
FORBIDDEN = ("wizard", "textual", "jinja2", "yaml", "torch_npu", "torchvision")

PROBE = """
import importlib, json, sys
names = json.loads(sys.argv[1])
import runtime
bare = sorted(m for m in ("torch",) if m in sys.modules)
for name in names:
    importlib.import_module(f"runtime.{name}")
print(json.dumps({"bare": bare, "loaded": sorted(sys.modules)}))
"""


def test_runtime_and_every_module_import_without_the_wizard_stack() -> None:
    result = subprocess.run(
        [sys.executable, "-c", PROBE, json.dumps(MODULES)], cwd=REPO, capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr
    outcome = json.loads(result.stdout.strip().splitlines()[-1])
    roots = {name.split(".")[0] for name in outcome["loaded"]}
    assert not roots & set(FORBIDDEN), sorted(roots & set(FORBIDDEN))
    assert outcome["bare"] == []  # `import runtime` alone stays free of torch (the wizard imports it)


def test_the_runtime_is_flat_so_the_project_copy_is_complete() -> None:
    # no package inside it (caches aside: __pycache__, and the .ruff_cache of a ruff run in runtime/)
    assert not [p for p in (REPO / "runtime").iterdir() if p.is_dir() and not p.name.startswith((".", "__pycache__"))]
    assert set(MODULES) >= {"device", "distributed", "amp", "events", "checkpoint", "data"}
