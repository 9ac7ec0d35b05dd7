"""What the wizard has been told so far, and what the spec says about it; no Textual here.

The screens keep only the raw answers a person typed or a file pre-filled.
Everything else (defaults, problems, which questions apply, which choices are
open) is asked of the question spec and `wizard.answers.model.evaluate`, so the
interactive path accepts and refuses exactly what `--answers` does.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from wizard.answers.model import Answers, evaluate, resolve
from wizard.answers.questions import BY_NAME, QUESTIONS, STEP_TITLES, STEPS
from wizard.answers.script import args_text, is_foreign
from wizard.answers.spec import Choice, Invalid, Question
from wizard.errors import Problem


@dataclass(frozen=True)
class ChoiceState:
    """One option of a choice question as the screen shows it now."""

    choice: Choice
    refusal: str | None
    note: str | None


def questions_of(step: str) -> tuple[Question, ...]:
    """The questions a step asks, in spec order."""
    return tuple(q for q in QUESTIONS if q.step == step)


def step_title(step: str) -> str:
    """The title of a step with its position, e.g. 'Topology (3 of 7)'."""
    return f"{STEP_TITLES[step]} ({STEPS.index(step) + 1} of {len(STEPS)})"


def as_text(question: Question, value: Any) -> str:
    """A raw or parsed value as the text a field shows."""
    if value is None:
        return ""
    if question.kind == "choice" and isinstance(value, bool):
        return "off" if value is False else "on"
    if question.kind == "bool" and isinstance(value, bool):
        return "true" if value else "false"
    if question.kind == "labels" and isinstance(value, dict):
        return ", ".join(f"{key}={label}" for key, label in value.items())
    if question.kind == "labels" and isinstance(value, tuple):
        return ", ".join(f"{key}={label}" for key, label in value)
    if question.kind == "args" and isinstance(value, list | tuple):
        return args_text([str(item) for item in value])  # shown back as a shell would need it typed
    if isinstance(value, list | tuple):
        return ", ".join(str(item) for item in value)
    return str(value)


def as_rows(value: Any) -> list[str]:
    """A raw or parsed list value (or comma-separated text) as one text per row."""
    if value is None:
        return []
    if isinstance(value, str):
        return [part for part in re.split(r"[,\s]+", value.strip()) if part] or [""]
    if isinstance(value, list | tuple):
        return [str(item) for item in value]
    return [str(value)]


class WizardState:
    """The raw answers given so far, with the spec's verdict on them."""

    def __init__(self, raw: Mapping[str, Any] | None = None, file_problems: Iterable[Problem] = ()) -> None:
        self.raw: dict[str, Any] = dict(raw or {})
        self.file_problems: tuple[Problem, ...] = tuple(file_problems)
        self.output_dir: Path | None = None  # where the project goes: the user's own script must be in it
        self.into = False
        """Render into output_dir itself (the user's repository, as --into) instead of output_dir/<project_name>."""
        self.folder = "npu"
        """Into: the project's folder inside the repository (--folder; '.': the older layout at its root)."""
        self.own_script: bool | None = None
        """The person's pick of "your own" script (True) or the generated one (False); None: as the answers say."""
        self.refresh()

    @property
    def project_dir(self) -> Path | None:
        """The folder the answers render into (the repository itself, into), once the output folder is known."""
        name = self.values.get("project_name")
        if self.output_dir is not None and self.into:
            return self.output_dir
        return None if self.output_dir is None or not name else self.output_dir / name

    def script_is_own(self) -> bool:
        """Whether the person chose a script of their own (or the answers name one)."""
        if self.own_script is not None:
            return self.own_script
        return is_foreign(self.values.get("training.script"))

    def refresh(self) -> None:
        """Evaluate the current raw answers again."""
        self.values, self.problems = evaluate(self.effective_raw())

    def set(self, name: str, raw: Any) -> None:
        """Record what the person entered for a question (None: back to its default; an answer standing in for
        another drops that one)."""
        if raw is None:
            self.raw.pop(name, None)
            self.refresh()
            return
        self.raw[name] = raw
        replaced = BY_NAME[name].replaces
        if replaced and raw not in (None, ""):
            self.raw.pop(replaced, None)
        self.refresh()

    def replaced(self, name: str) -> bool:
        """Whether another answer stands in for this question (a hostfile for the host IPs)."""
        return any(q.replaces == name and self.values.get(q.name) for q in BY_NAME.values())

    def effective_raw(self) -> dict[str, Any]:
        """The raw answers of the questions that apply (kept answers of hidden ones are left out)."""
        values, _ = evaluate(self.raw)
        return {name: raw for name, raw in self.raw.items() if BY_NAME[name].applies(values)}

    def applies(self, name: str) -> bool:
        """Whether a question is asked, given the answers before it (and "your own" chosen, even before a path)."""
        values = self.values
        if self.own_script and not is_foreign(values.get("training.script")):
            values = {**values, "training.script": "your_script.py"}  # asked as for any script of the user's
        return BY_NAME[name].applies(values)

    def shown(self, name: str) -> Any:
        """The value a field shows: what was entered, else the spec's default for these answers."""
        if name in self.raw:
            return self.raw[name]
        return BY_NAME[name].default_for(self.values)

    def step_errors(self, step: str) -> list[Problem]:
        """The errors on a step's questions that apply, and the user's script missing from `project_dir`."""
        names = {q.name for q in questions_of(step) if self.applies(q.name)}
        found = [p for p in self.problems if p.severity == "error" and p.field in names]
        if "training.script" in names:
            found += self.script_problems()
        return found

    def script_problems(self) -> list[Problem]:
        """What the answers alone cannot see: the user's script missing on disk, or "your own" without a name
        (said at the field, never switched silently to the generated script)."""
        script = self.values.get("training.script")
        if script is None:
            return []
        if self.own_script and not is_foreign(script):
            return [Problem("training.script", script, "name your script: its path, relative to the project folder")]
        if self.project_dir is not None and is_foreign(script):
            missing = script_file_problem(self.project_dir, script)
            if missing is not None:
                return [Problem("training.script", script, missing)]
        return []

    def problems_at(self, name: str) -> list[Problem]:
        """The errors and warnings at one question, errors first (the user's script checked on disk too)."""
        found = [p for p in self.problems if p.field == name]
        if name == "training.script":
            found += self.script_problems()
        return sorted(found, key=lambda p: p.severity != "error")

    def errors(self) -> list[Problem]:
        """Every error in the answers, and the user's script as the screens check it."""
        return [*(p for p in self.problems if p.severity == "error"), *self.script_problems()]

    def warnings(self) -> list[Problem]:
        """Every warning in the answers, those about the loaded file first."""
        return [*self.file_problems, *(p for p in self.problems if p.severity == "warning")]

    def choices(self, name: str) -> list[ChoiceState]:
        """Each option of a choice question, refused or noted as the shared checks would say if chosen."""
        states = []
        for choice in BY_NAME[name].choices:
            _, problems = evaluate({**self.effective_raw(), name: choice.value})
            here = [p for p in problems if p.field == name]
            refusal = next((p.message for p in here if p.severity == "error"), None)
            note = next((p.message for p in here if p.severity == "warning"), None)
            states.append(ChoiceState(choice, refusal, note))
        return states

    def answers(self) -> Answers:
        """The checked answers; raises AnswersError while any error remains."""
        return resolve(self.effective_raw())

    def first_step_with_errors(self) -> str | None:
        """The first step that still has an error, if any."""
        return next((step for step in STEPS if self.step_errors(step)), None)

    def lr_hint(self) -> str:
        """The learning rate train.py will use, worked out as the README explains it."""
        v = self.values
        try:
            world = v["nodes"] * v["devices_per_node"]
            global_batch = v["training.batch_size"] * world
        except KeyError:
            return "fix the batch size and topology to see the learning rate"
        if v.get("training.lr") is not None:
            return f"lr {v['training.lr']:g} as given, for a global batch of {global_batch}"
        try:
            base_lr, base_batch = v["training.base_lr"], v["training.base_batch_size"]
        except KeyError:
            return "fix the single-card values to see the scaled learning rate"
        lr = base_lr * global_batch / base_batch
        return (
            f"lr = {base_lr:g} x {global_batch} / {base_batch} = {lr:g}  "
            f"(global batch {global_batch} = {v['training.batch_size']} x {world} devices)"
        )


def script_file_problem(project_dir: Path, script: str) -> str | None:
    """Why the user's `script` (a checked relative path) is not a Python file inside `project_dir`, or None."""
    path = project_dir / script
    if not path.is_file():
        return f"no file {script} in {project_dir}: put your script there first (or change the output folder)"
    if not path.resolve().is_relative_to(project_dir.resolve()):
        return f"{script} leads outside {project_dir} (a symbolic link): the script must lie inside the project"
    return None


def check_text(question: Question, text: str) -> str | None:
    """The spec's message for one typed value, or None when it parses."""
    try:
        question.parse(text)
    except Invalid as invalid:
        return str(invalid)
    return None
