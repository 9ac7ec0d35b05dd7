"""The project template rendered with Jinja alone, file for file as cookiecutter's generate_files renders it.

`render` needs no cookiecutter: importing it (and the arrow and rich it pulls
in) cost the `--answers` path about 180 ms. Plain cookiecutter users still run
the same template through cookiecutter (tests/test_cookiecutter.py), so this
does what generate_files does for it: the one top folder's name and every
path under it rendered, each file's text rendered by a strict environment
(StrictUndefined, the trailing newline kept, the template's `_extensions`),
`_copy_without_render` files copied, each file written with the newline its
template's first line ends with and given the template's mode. No hooks (the
wizard's render runs none). The template holds text files only; the __pycache__ folders
pip's byte-compiling leaves in an installed template are passed over.
"""

from __future__ import annotations

import os
import shutil
from fnmatch import fnmatch
from pathlib import Path
from typing import Any

import jinja2

from wizard.render.templates import TEMPLATE_SETTINGS

# What opens a Jinja expression, statement or comment with the environment's default delimiters (no line statements),
# and a carriage return, which Jinja's lexer turns into a newline as cookiecutter's render of a path would
_JINJA_MARKERS = ("{{", "{%", "{#", "\r")


def render_tree(template: Path, context: dict[str, Any], into: Path, cache: jinja2.BytecodeCache | None) -> Path:
    """Render the template folder `template` with `context` into `into`; the project folder it made."""
    variables = {"cookiecutter": {**context, **TEMPLATE_SETTINGS}}
    (top,) = [path for path in template.iterdir() if path.is_dir() and "{{" in path.name]
    environment = jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(top)),
        keep_trailing_newline=True,
        undefined=jinja2.StrictUndefined,
        extensions=TEMPLATE_SETTINGS["_extensions"],
        bytecode_cache=cache,
    )

    def rendered(name: str) -> str:
        # A path without them renders as itself: compiling it cost a render about 13 ms (18 paths)
        if not any(marker in name for marker in _JINJA_MARKERS):
            return name
        return environment.from_string(name).render(**variables)

    project = into / rendered(top.name)
    project.mkdir()
    for folder, folders, files in os.walk(top):
        # Python's bytecode is no template: pip byte-compiles the template's plain .py files (model.py) on install
        folders[:] = sorted(name for name in folders if name != "__pycache__")
        here = Path(folder).relative_to(top)
        for name in folders:
            (project / rendered((here / name).as_posix())).mkdir()
        for name in sorted(name for name in files if not name.endswith(".pyc")):
            relative, source = (here / name).as_posix(), Path(folder) / name
            target = project / rendered(relative)
            if any(fnmatch(relative, pattern) for pattern in TEMPLATE_SETTINGS["_copy_without_render"]):
                shutil.copyfile(source, target)
            else:
                text = environment.get_template(relative).render(**variables)
                with target.open("w", encoding="utf-8", newline=_newline(source)) as handle:
                    handle.write(text)
            shutil.copymode(source, target)
    return project


def _newline(source: Path) -> str | None:
    """The newline the template's first line ends with (None: it has none, the platform's is written)."""
    with source.open(encoding="utf-8") as handle:
        handle.readline()
        seen = handle.newlines
    return seen[0] if isinstance(seen, tuple) else seen
