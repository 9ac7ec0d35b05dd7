"""The shape of wizard/: the import graph has no loop, monitor/ never reaches into run/, and no module
imports another module's private (`_name`) names.

The graph is read from the source with `ast`, every import counted wherever it sits (module level, inside a
function, under `if TYPE_CHECKING:`), absolute and relative imports resolved to wizard modules. Run this file
as a script with a folder to check another copy of the code: `python tests/test_layout.py /path/to/wizard`.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

WIZARD = Path(__file__).resolve().parent.parent / "wizard"


def module_names(root: Path) -> dict[str, Path]:
    """Every module under `root` (the wizard folder) by its dotted name; a package by its own name."""
    names = {}
    for path in sorted(root.rglob("*.py")):
        parts = ["wizard", *path.relative_to(root).with_suffix("").parts]
        if parts[-1] == "__init__":
            parts = parts[:-1]
        names[".".join(parts)] = path
    return names


def _absolute(module: str, is_package: bool, node: ast.ImportFrom) -> str:
    """The absolute name an `ImportFrom` (relative or not) refers to."""
    if not node.level:
        return node.module or ""
    base = module.split(".")
    if not is_package:
        base = base[:-1]
    base = base[: len(base) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def imports(root: Path) -> list[tuple[str, str, str | None, int]]:
    """(importer, imported wizard module, name taken from it or None, line) for every import in wizard/."""
    modules = module_names(root)
    found = []
    for module, path in modules.items():
        is_package = path.name == "__init__.py"
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                for alias in node.names:
                    name = alias.name
                    while name and name not in modules:
                        name = name.rpartition(".")[0]
                    if name:
                        found.append((module, name, None, node.lineno))
            elif isinstance(node, ast.ImportFrom):
                target = _absolute(module, is_package, node)
                if not target.startswith("wizard"):
                    continue
                for alias in node.names:
                    submodule = f"{target}.{alias.name}"
                    if submodule in modules:  # `from wizard import rules`: the module itself
                        found.append((module, submodule, None, node.lineno))
                    elif target in modules:
                        found.append((module, target, alias.name, node.lineno))
    return found


def find_cycle(edges: dict[str, set[str]]) -> list[str] | None:
    """One import loop as [a, b, ..., a], or None."""
    done: set[str] = set()
    for start in sorted(edges):
        if start in done:
            continue
        stack = [(start, iter(sorted(edges.get(start, ()))))]
        path = [start]
        on_path = {start}
        while stack:
            node, children = stack[-1]
            child = next(children, None)
            if child is None:
                stack.pop()
                path.pop()
                on_path.discard(node)
                done.add(node)
            elif child in on_path:
                return path[path.index(child) :] + [child]
            elif child not in done:
                stack.append((child, iter(sorted(edges.get(child, ())))))
                path.append(child)
                on_path.add(child)
    return None


def _within(module: str, package: str) -> bool:
    """Whether `module` is `package` or inside it."""
    return module == package or module.startswith(package + ".")


# The floors of wizard/, lowest first (docs/architecture.md, "How it is built"): a module imports only from its own
# package or from a lower floor. The shared pieces sit at the bottom; the commands beside the pipeline (doctor, the
# interactive screens) take answers and render, and the run may use doctor's checks; the CLI sits on top.
FLOORS = (
    ("wizard.errors", "wizard.stopping", "wizard.atomic_files"),
    ("wizard.answers",),
    ("wizard.render",),
    ("wizard.monitor", "wizard.doctor", "wizard.tui"),
    ("wizard.run",),
    ("wizard.run_page",),
    ("wizard.bundle",),
    ("wizard.cli", "wizard.__main__", "wizard.templates", "wizard"),
)


def floor_of(module: str) -> tuple[int, str] | None:
    """(floor, package) of a wizard module: the longest package in FLOORS it is or sits in; None when in none."""
    best = None
    for level, packages in enumerate(FLOORS):
        for package in packages:
            if _within(module, package) and (best is None or len(package) > len(best[1])):
                best = (level, package)
    return best


def back_arrow(importer: str, imported: str) -> bool:
    """Whether `importer` reaching `imported` runs up the floors, or sideways into another package of its floor."""
    here, there = floor_of(importer), floor_of(imported)
    if here is None or there is None or here[1] == there[1] or there[1] == "wizard":
        return False
    sideways = there[0] == here[0] and 0 < here[0] < len(FLOORS) - 1
    return there[0] > here[0] or sideways


def problems(root: Path) -> list[str]:
    """Everything wrong with the layout of the wizard folder at `root`, one line each."""
    found = imports(root)
    edges: dict[str, set[str]] = {}
    wrong = []
    for importer, imported, name, line in found:
        if imported != importer:
            edges.setdefault(importer, set()).add(imported)
        where = f"{importer} (line {line})"
        if _within(importer, "wizard.monitor") and _within(imported, "wizard.run"):
            wrong.append(f"monitor imports run: {where} imports {imported}")
        elif back_arrow(importer, imported):
            wrong.append(f"import runs up the floors: {where} imports {imported}")
        if name and name.startswith("_") and not name.startswith("__") and imported != importer:
            wrong.append(f"private name: {where} imports {name} from {imported}")
    edges_left = {k: set(v) for k, v in edges.items()}
    while cycle := find_cycle(edges_left):
        wrong.append("import loop: " + " -> ".join(cycle))
        edges_left[cycle[0]].discard(cycle[1])  # report each loop once, then look for the next
    return wrong


def test_graph_reader_sees_every_kind_of_import(tmp_path: Path) -> None:
    """The reader finds imports inside functions and TYPE_CHECKING blocks, relative ones, and loops among them."""
    package = tmp_path / "wizard"
    (package / "monitor").mkdir(parents=True)
    (package / "run").mkdir()
    (package / "__init__.py").write_text("")
    (package / "monitor" / "__init__.py").write_text("")
    (package / "run" / "__init__.py").write_text("")
    (package / "run" / "job.py").write_text("from ..monitor import view\n")
    (package / "monitor" / "view.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from wizard.run.job import _helper\n"
    )
    (package / "a.py").write_text("def f():\n    import wizard.b\n")
    (package / "b.py").write_text("from . import a\n")
    found = problems(package)
    assert "import loop: wizard.monitor.view -> wizard.run.job -> wizard.monitor.view" in found
    assert "import loop: wizard.a -> wizard.b -> wizard.a" in found
    assert "monitor imports run: wizard.monitor.view (line 3) imports wizard.run.job" in found
    assert "private name: wizard.monitor.view (line 3) imports _helper from wizard.run.job" in found
    assert len(found) == 4


def test_an_import_that_runs_up_the_floors_is_named(tmp_path: Path) -> None:
    """A lower stage importing a higher one (run -> bundle, render -> run) is a problem; downward ones are not."""
    package = tmp_path / "wizard"
    for name in ("run", "bundle", "render"):
        (package / name).mkdir(parents=True)
        (package / name / "__init__.py").write_text("")
    (package / "__init__.py").write_text("")
    (package / "run" / "command.py").write_text("from wizard.bundle.command import line\n")
    (package / "bundle" / "command.py").write_text("from wizard.run.lock import held\nline = 1\n")
    (package / "render" / "update.py").write_text("def f():\n    from wizard.run.lock import held\n")
    (package / "run" / "lock.py").write_text("from wizard.errors import Problem\nheld = 1\n")
    assert sorted(problems(package)) == [
        "import runs up the floors: wizard.render.update (line 2) imports wizard.run.lock",
        "import runs up the floors: wizard.run.command (line 1) imports wizard.bundle.command",
    ]


def test_wizard_has_no_import_loop_no_back_arrow_and_no_private_import() -> None:
    """The real wizard/: the list of problems is empty (each line names the module, the line and the loop)."""
    assert problems(WIZARD) == []


if __name__ == "__main__":
    lines = problems(Path(sys.argv[1]) if len(sys.argv) > 1 else WIZARD)
    print("\n".join(lines) or "no problems")
    sys.exit(1 if lines else 0)
