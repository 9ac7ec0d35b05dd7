"""Checks of the project folder itself, not of this node: files an update left half done, the user's script."""

from __future__ import annotations

import io
import re
import tokenize
from collections.abc import Iterator
from pathlib import Path

from runtime.checks import FAIL, PASS, WARN, Result
from wizard.answers.model import Answers
from wizard.doctor import script_scan
from wizard.render import conflict_markers, pristine

CUDA_WORDS = re.compile(r"nccl|cuda", re.IGNORECASE)
SHOWN = 3


def check_conflict_markers(project: Path) -> Result:
    """FAIL when a generated file still holds the <<<<<<< markers of `npu-wizard update --write-conflicts`."""
    found = conflict_markers.unresolved(project)
    if not found:
        return Result("conflicts", PASS, "no conflict markers left by npu-wizard update")
    return Result(
        "conflicts",
        FAIL,
        conflict_markers.describe(found),
        f"{conflict_markers.fix()}; npu-wizard run and update refuse the project until then",
    )


def check_user_script(project: Path, answers: Answers, root: Path | None = None) -> Result:
    """The user's own script (training.script) exists; on the NPU, WARN where its code names nccl or cuda.

    The code is the script and the modules of its repository (`root`, the project folder unless given) that
    it imports (script_scan says how they are found); each is read, never imported or run.
    """
    root = project if root is None else root
    script = answers["training.script"]
    path = root / script
    if not path.is_file():
        return Result(
            "script",
            FAIL,
            f"{script} (training.script) is not in {root}: every rank would stop at once",
            f"put your script at {path}, or set training.script in answers.yaml to where it is",
        )
    if answers["device"] != "npu":
        return Result("script", PASS, f"{script} is there (device {answers['device']}: nccl/cuda not looked for)")
    modules = script_scan.imported_modules(root, script, skip=_generated_files(project, root))
    found = [
        (module, line, word)
        for module in modules
        for line, word in cuda_names(script_scan.read_module(root, module) or "")
    ]
    read = f"{script} names" if len(modules) == 1 else f"{script} and the {len(modules) - 1} module(s) it imports name"
    if not found:
        return Result("script", PASS, f"{script} is there and {read.split(' ', 1)[1]} neither nccl nor cuda")
    shown = ", ".join(
        f"{'' if module == script else module + ' '}line {line}: {word!r}" for module, line, word in found[:SHOWN]
    )
    more = f" and {len(found) - SHOWN} more" if len(found) > SHOWN else ""
    return Result(
        "script",
        WARN,
        f"{read} nccl or cuda on an NPU project: {shown}{more}",
        'on the NPU the backend is hccl and the device npu: backend = "hccl" if device == "npu" else "gloo" '
        "after import torch_npu (README.md, 'Your script')",
    )


def _generated_files(project: Path, root: Path) -> set[str]:
    """npu-wizard's own files in the project (its runtime copy among them), relative to `root`: not the user's."""
    try:
        names = pristine.load(project).files
    except (OSError, ValueError):
        return set()
    where = project.resolve().relative_to(root.resolve()) if project.resolve() != root.resolve() else Path(".")
    return {(where / name).as_posix() for name in names}


def cuda_names(text: str) -> Iterator[tuple[int, str]]:
    """(line, text) of each name or string in Python source that holds nccl or cuda; comments are skipped."""
    try:
        tokens = [
            (token.start[0], token.string)
            for token in tokenize.generate_tokens(io.StringIO(text).readline)
            if token.type in (tokenize.NAME, tokenize.STRING) or token.type == getattr(tokenize, "FSTRING_MIDDLE", -1)
        ]
    except (tokenize.TokenError, SyntaxError):  # not valid Python: every line as text
        tokens = list(enumerate(text.splitlines(), 1))
    for line, string in tokens:
        match = CUDA_WORDS.search(string)
        if match is not None:
            yield line, string if len(string) <= 40 else match.group()
