"""Finish the project as npu-wizard does: per-node launch scripts, runtime copy, answers."""

import json
from pathlib import Path

from wizard.answers.model import from_context
from wizard.render.project import finish

CONTEXT = {k: v for k, v in json.loads(r"""{{ cookiecutter | jsonify }}""").items() if not k.startswith("_")}
finish(Path.cwd(), CONTEXT, from_context(CONTEXT))
