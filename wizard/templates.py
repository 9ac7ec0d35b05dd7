"""Where the project template lives: inside the wheel, or beside the source tree."""

from __future__ import annotations

import os
from pathlib import Path

from jinja2 import FileSystemBytecodeCache
from jinja2.bccache import Bucket

from wizard import release_facts
from wizard.shellquote import EXTENSION

_PACKAGE = Path(__file__).parent
# cookiecutter's own keys, the same for npu-wizard's render and plain cookiecutter.
TEMPLATE_SETTINGS: dict[str, list[str]] = {
    "_copy_without_render": ["launch/_node.sh.j2"],
    "_extensions": [EXTENSION, release_facts.EXTENSION],
}


def project_template() -> Path:
    """The cookiecutter template folder of the generated project."""
    for candidate in (_PACKAGE / "_templates" / "project", _PACKAGE.parent / "templates" / "project"):
        if (candidate / "cookiecutter.json").is_file():
            return candidate
    raise FileNotFoundError("npu-wizard's templates are missing; reinstall npu-wizard")


class _QuietBytecodeCache(FileSystemBytecodeCache):
    """Jinja's file cache of compiled templates, which never fails a render: a write it cannot make is skipped."""

    def dump_bytecode(self, bucket: Bucket) -> None:
        try:
            super().dump_bytecode(bucket)
        except OSError:
            pass


def template_cache(env: dict[str, str] | None = None) -> FileSystemBytecodeCache | None:
    """Where compiled templates are kept between renders, or None (no cache).

    Compiling the project's templates is most of a render's time; like
    Python's own __pycache__ this cache only saves work (delete it freely).
    It lives in $NPU_WIZARD_CACHE_DIR, else $XDG_CACHE_HOME/npu-wizard, else
    ~/.cache/npu-wizard, never in a folder the user renders into;
    NPU_WIZARD_CACHE_DIR='' turns it off.
    """
    env = dict(os.environ) if env is None else env
    if env.get("NPU_WIZARD_CACHE_DIR") == "":
        return None
    if env.get("NPU_WIZARD_CACHE_DIR"):
        folder = Path(env["NPU_WIZARD_CACHE_DIR"])
    else:
        base = Path(env["XDG_CACHE_HOME"]) if env.get("XDG_CACHE_HOME") else Path.home() / ".cache"
        folder = base / "npu-wizard"
    folder = folder / "templates"
    try:
        folder.mkdir(mode=0o700, parents=True, exist_ok=True)
    except OSError:
        return None
    return _QuietBytecodeCache(str(folder))


def cookiecutter_json() -> dict[str, object]:
    """cookiecutter.json for the template: the default answers, choices listed default first."""
    from wizard.answers import context_key, resolve, to_context
    from wizard.questions import QUESTIONS

    defaults = to_context(resolve({}))
    document: dict[str, object] = {}
    for question in QUESTIONS:
        key = context_key(question.name)
        if question.choices:
            values = [c.value for c in question.choices]
            values.remove(defaults[key])
            document[key] = [defaults[key], *values]
        else:
            document[key] = defaults[key]
    document.update(TEMPLATE_SETTINGS)
    return document


if __name__ == "__main__":  # regenerate cookiecutter.json after changing the questions
    import json

    target = project_template() / "cookiecutter.json"
    target.write_text(json.dumps(cookiecutter_json(), indent=2) + "\n")
    print(f"wrote {target}")
