"""Reject bad answers before plain cookiecutter writes anything (same checks as npu-wizard)."""

import json
import sys

CONTEXT = json.loads(r"""{{ cookiecutter | jsonify }}""")

try:
    from wizard.answers.model import from_context
    from wizard.errors import AnswersError
except ImportError:
    sys.exit("this template needs npu-wizard installed: pip install npu-wizard")

try:
    from_context({k: v for k, v in CONTEXT.items() if not k.startswith("_")})
except AnswersError as error:
    sys.exit(str(error))
