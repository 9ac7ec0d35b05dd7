"""Where the project template lives: inside the wheel, or beside the source tree.

`python -m wizard.templates` (wizard/templates.py) regenerates cookiecutter.json after the questions change.
"""

from __future__ import annotations

from pathlib import Path

from wizard.answers import release_facts
from wizard.render.shellquote import EXTENSION

_PACKAGE = Path(__file__).parent.parent  # wizard/: the wheel puts the templates in wizard/_templates
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


def cookiecutter_json() -> dict[str, object]:
    """cookiecutter.json for the template: the default answers, choices listed default first."""
    from wizard.answers.model import context_key, resolve, to_context
    from wizard.answers.questions import QUESTIONS

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


def write_cookiecutter_json() -> Path:
    """Write cookiecutter.json of the template from the questions; the path written."""
    import json

    target = project_template() / "cookiecutter.json"
    target.write_text(json.dumps(cookiecutter_json(), indent=2) + "\n")
    return target
