"""Answers as a value: load, check, default, and turn into a template context.

`load_text` and `resolve` give an immutable `Answers` or raise `AnswersError`
listing every problem. The interactive wizard and the answers-file path both
go through `resolve`, so they accept and refuse exactly the same things.
"""

from __future__ import annotations

import difflib
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any

import yaml

from wizard.answers import hostfile, rules
from wizard.answers.questions import BY_NAME, QUESTIONS
from wizard.answers.script import GENERATED_FILE, args_text
from wizard.answers.spec import Invalid
from wizard.answers.strict_yaml import read_document
from wizard.errors import FILE, NO_VALUE, SHOWN_PROBLEMS, AnswersError, Problem

SCHEMA = 1
SECTIONS = ("cluster", "network", "training", "run", "environment")


@dataclass(frozen=True)
class Answers:
    """A complete, checked set of answers, keyed by dotted question name."""

    values: Mapping[str, Any]
    warnings: tuple[Problem, ...] = field(default=())

    def __getitem__(self, name: str) -> Any:
        return self.values[name]

    def get(self, name: str, default: Any = None) -> Any:
        """The value of a question, or `default` where it does not apply."""
        return self.values.get(name, default)

    @property
    def world_size(self) -> int:
        """Processes in the whole job."""
        return self["nodes"] * self["devices_per_node"]


def resolve(raw: Mapping[str, Any]) -> Answers:
    """Parse, default and check raw answers keyed by dotted name; raise on any error."""
    values, problems = evaluate(raw)
    errors = [p for p in problems if p.severity == "error"]
    if errors:
        raise AnswersError(errors)
    return Answers(MappingProxyType(values), tuple(problems))


def evaluate(raw: Mapping[str, Any]) -> tuple[dict[str, Any], list[Problem]]:
    """Every question's value (or default) and every problem, errors and warnings alike."""
    values: dict[str, Any] = {}
    problems: list[Problem] = []
    for question in QUESTIONS:
        if not question.applies(values):
            if raw.get(question.name) not in (None, "", [], ()):
                if question.refused is not None:
                    problems.append(Problem(question.name, raw[question.name], question.refused(values)))
                else:
                    problems.append(
                        Problem(
                            question.name, raw[question.name], "ignored: it does not apply to these answers", "warning"
                        )
                    )
            continue
        if question.name not in raw:
            values[question.name] = question.default_for(values)
            continue
        try:
            values[question.name] = question.parse(raw[question.name])
        except Invalid as invalid:
            problems.append(Problem(question.name, raw[question.name], str(invalid)))
    if values.get("network.hostfile") and raw.get("network.host_ips") not in (None, "", [], ()):
        problems.append(Problem("network.host_ips", raw["network.host_ips"], "give network.hostfile or this, not both"))
    if values.get("network.spare_hosts") and raw.get("network.hostfile") and raw.get("network.spare_hosts"):
        if hostfile_spares(values["network.hostfile"]):
            problems.append(
                Problem(
                    "network.spare_hosts",
                    raw["network.spare_hosts"],
                    "the hostfile marks spare hosts already: give them there (the word spare) or here, not both",
                )
            )
    problems.extend(rules.check(values))
    return values, problems


def generated_script_of_old_files(raw: dict[str, Any]) -> dict[str, Any]:
    """`raw` with an older npu-wizard's `training.script: train.py` read as it was meant: the generated script.

    Before any script name was the user's, every generated project's answers.yaml said `script: train.py`
    beside the generated script's `training.model`; a file of the user's own script has no model answer.
    """
    if raw.get("training.script") == GENERATED_FILE and "training.model" in raw:
        return {name: value for name, value in raw.items() if name != "training.script"}
    return raw


def hostfile_spares(path: str) -> tuple[str, ...]:
    """The spare hosts a hostfile marks (none where it cannot be read: the hostfile's own problem says why)."""
    try:
        return hostfile.spares(hostfile.read(path))
    except hostfile.HostListError:
        return ()


def load_text(text: str, base: Path | None = None) -> Answers:
    """Load an answers file's text (YAML); a relative hostfile is taken from `base`; raise listing every problem."""
    document = read_document(text)
    if not isinstance(document, dict):
        raise AnswersError([Problem(FILE, NO_VALUE, "the answers file must be a mapping of answers (key: value)")])
    raw, problems = flatten(document)
    raw = generated_script_of_old_files(raw)
    hostfile = raw.get("network.hostfile")
    if base is not None and isinstance(hostfile, str) and hostfile.strip() and not Path(hostfile).is_absolute():
        raw["network.hostfile"] = str(base / hostfile.strip())
    try:
        answers = resolve(raw)
    except AnswersError as error:
        raise AnswersError(problems + error.problems) from None
    if problems:
        raise AnswersError(problems)
    return answers


def flatten(document: Mapping[Any, Any]) -> tuple[dict[str, Any], list[Problem]]:
    """Nested answers to dotted names, with unknown keys and a wrong schema as problems."""
    problems: list[Problem] = []
    raw: dict[str, Any] = {}
    schema = document.get("schema", SCHEMA)
    if schema != SCHEMA or isinstance(schema, bool):
        problems.append(Problem("schema", schema, f"this npu-wizard reads schema {SCHEMA}"))
    for key, value in document.items():
        if key == "schema":
            continue
        name = str(key)
        if name in SECTIONS:
            if not isinstance(value, dict):
                problems.append(Problem(name, value, "must be a mapping of its own keys"))
                continue
            for sub, sub_value in value.items():
                _take(f"{name}.{sub}", sub_value, raw, problems)
        else:
            _take(name, value, raw, problems)
    return raw, problems


def _take(name: str, value: Any, raw: dict[str, Any], problems: list[Problem]) -> None:
    if name in BY_NAME:
        raw[name] = value
        return
    # A did-you-mean costs a fuzzy match: only for as many problems as a message shows.
    hint = _closest_key(name) if len(problems) < SHOWN_PROBLEMS and len(name) <= 64 else None
    problems.append(Problem(name, value, f"unknown key; did you mean '{hint}'?" if hint else "unknown key"))


def _closest_key(name: str) -> str | None:
    """The known key a misspelt one most likely meant: a misplaced exact name, else the closest whole name or part."""
    by_leaf = {question.rsplit(".", 1)[-1]: question for question in BY_NAME}
    if name.rsplit(".", 1)[-1] in by_leaf:  # network.batch_size: the key is right, its section is not
        return by_leaf[name.rsplit(".", 1)[-1]]
    close = difflib.get_close_matches(name, [*BY_NAME, "schema", *SECTIONS], n=1)
    if close:
        return close[0]
    close = difflib.get_close_matches(name.rsplit(".", 1)[-1], list(by_leaf), n=1)
    return by_leaf[close[0]] if close else None


def to_document(answers: Answers) -> dict[str, Any]:
    """Answers as the nested mapping of an answers file, in question order."""
    document: dict[str, Any] = {"schema": SCHEMA}
    for question in QUESTIONS:
        if question.name not in answers.values or question.name == "network.hostfile":
            # a hostfile is recorded as what it said: network.host_ips
            continue
        value = answers[question.name]
        if question.kind == "labels" and value is not None:
            value = dict(value)
        elif isinstance(value, tuple):
            value = list(value)
        if "." in question.name:
            section, key = question.name.split(".", 1)
            document.setdefault(section, {})[key] = value
        else:
            document[question.name] = value
    return document


def dump(answers: Answers) -> str:
    """The canonical answers file text for these answers."""
    header = "# npu-wizard answers (schema 1): render again with `npu-wizard --answers answers.yaml`\n"
    return header + yaml.safe_dump(to_document(answers), sort_keys=False, default_flow_style=False)


def context_key(name: str) -> str:
    """The template variable of a question: its name without the section."""
    return name.rsplit(".", 1)[-1]


def to_context(answers: Answers) -> dict[str, str]:
    """Answers as flat text variables, the way cookiecutter hands them to templates."""
    context: dict[str, str] = {}
    for question in QUESTIONS:
        value = None if question.name == "network.hostfile" else answers.get(question.name)
        if value is None and question.choices and question.name not in answers.values:
            # cookiecutter refuses a choice variable outside its choices, even one that does not apply
            text = question.choices[0].value
        elif value is None:
            text = ""
        elif question.kind == "labels":
            text = ",".join(f"{key}={label}" for key, label in value)
        elif question.kind == "args":
            text = args_text(value)  # the one list whose items may hold commas: shell words, split back on load
        elif question.kind == "bool":
            text = "true" if value else "false"  # as JSON and YAML write it; str() would give True
        elif isinstance(value, tuple):
            text = ",".join(value)
        else:
            text = str(value)
        context[context_key(question.name)] = text
    return context


def from_context(context: Mapping[str, Any]) -> Answers:
    """Rebuild answers from template variables (the cookiecutter hooks' path)."""
    raw = {q.name: context[context_key(q.name)] for q in QUESTIONS if context_key(q.name) in context}
    raw = {name: value for name, value in raw.items() if value != "" or BY_NAME[name].optional}
    values, _ = evaluate(raw)  # a question that does not apply still has a context variable: left out
    return resolve({name: value for name, value in raw.items() if BY_NAME[name].applies(values)})
