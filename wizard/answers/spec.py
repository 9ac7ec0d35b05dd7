"""The shape of a question: how an answer is asked, parsed and checked.

The list of questions (wizard.answers.questions) drives the answers-file loader, the Textual screens and the tests.
It knows nothing of widgets: a question has a name, a prompt, a kind, a
default, help, the values it allows and a check.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from wizard.answers import hardware, script
from wizard.answers.addresses import ZONE, is_ip

Values = Mapping[str, Any]


class Invalid(ValueError):
    """A raw answer that does not parse or check; the message says what is allowed."""


@dataclass(frozen=True)
class Choice:
    """One allowed value of a choice question, with what it means."""

    value: str
    label: str
    help: str = ""


@dataclass(frozen=True)
class Question:
    """One answer: how it is asked, parsed, defaulted and checked."""

    name: str
    prompt: str
    kind: str
    help: str
    step: str
    default: Any = None
    choices: tuple[Choice, ...] = ()
    minimum: float | None = None
    maximum: float | None = None
    optional: bool = False
    when: Callable[[Values], bool] | None = None
    check: Callable[[Any], None] | None = None
    default_from: Callable[[Values], Any] | None = field(default=None, repr=False)
    replaces: str | None = None  # another question this one's answer stands in for
    refused: Callable[[Values], str] | None = field(default=None, repr=False)
    """Why a value given where the question does not apply is an error (None: it is only ignored, a warning)."""

    def applies(self, values: Values) -> bool:
        """Whether the question is asked, given the answers before it."""
        return self.when is None or self.when(values)

    def default_for(self, values: Values) -> Any:
        """The default, which may depend on earlier answers."""
        return self.default_from(values) if self.default_from else self.default

    def allowed(self) -> str:
        """A short text of the values this question accepts."""
        if self.choices and self.kind != "bool":  # a yes/no question lists its two options as words
            return "one of: " + ", ".join(c.value for c in self.choices)
        if self.kind in ("int", "float") and self.minimum is not None:
            kind = "an integer" if self.kind == "int" else "a number"
            upper = "" if self.maximum is None else f" to {_number(self.maximum)}"
            return f"{kind} from {_number(self.minimum)}{upper}"
        return _ALLOWED_TEXT.get(self.kind, "text")

    def parse(self, raw: Any) -> Any:
        """Turn a raw answer (from YAML or a text field) into a checked value."""
        if raw is None or (isinstance(raw, str) and raw.strip() == "") or (self.optional and _empty_list(raw)):
            if self.kind == "args":
                return ()  # no arguments
            if self.optional:
                return None
            raise Invalid(f"a value is required: {self.allowed()}")
        limit = _MAX_LENGTH.get(self.kind)
        if limit is not None and isinstance(raw, str) and len(raw.strip()) > limit:
            raise Invalid(f"too long: at most {limit} characters")
        if isinstance(raw, str) and self.kind != "ip_list":  # a pasted address list is split at newlines
            refuse_control_characters(raw.strip())
        value = _PARSERS[self.kind](self, raw)
        if self.kind in ("int", "float"):
            if self.minimum is not None and value < self.minimum:
                raise Invalid(f"must be at least {_number(self.minimum)}")
            if self.maximum is not None and value > self.maximum:
                raise Invalid(f"must be at most {_number(self.maximum)}")
        if self.check is not None:
            self.check(value)
        return value


_ALLOWED_TEXT = {
    "slug": "lowercase letters, digits, '-' and '_', starting with a letter (at most 64)",
    "host": "an IPv4 or IPv6 address, or a host name",
    "ip_list": "a list of IPv4 or IPv6 addresses, one per node (ranges such as 10.0.0.11-10.0.0.74 allowed)",
    "hostfile": "the path of a hostfile: one IP per line, optionally slots=N, # for comments",
    "path": "an absolute path without quotes, '$', '`', braces or spaces",
    "version": "a release number such as 2.9.0 or 2.9.0.post6",
    "nic": "an interface name or HCCL_SOCKET_IFNAME pattern (e.g. eth0, =eth0, eth,enp, ^docker)",
    "relpath": "a folder path of letters, digits and ./_+@:- (no spaces or quotes)",
    "host_list": "a list of host names or addresses, one per node",
    "slurm_time": "a time limit as HH:MM:SS, D-HH:MM:SS or whole minutes, at most 365 days",
    "slurm_name": "a name of letters, digits and ._- (as Slurm shows it)",
    "gres": "a Slurm GRES such as gpu:910b:8 (letters, digits and ._:,-)",
    "image": "a container image reference such as registry.example.com/team/train:8.1 (no spaces or quotes)",
    "k8s_name": "a Kubernetes name: lowercase letters, digits and '-', starting and ending with a letter or digit "
    "(at most 63)",
    "labels": "label pairs key=value, separated by commas (in YAML, a mapping); keys may have a prefix/",
    "script": "a .py file inside the project, relative to it (empty: the generated train.py)",
    "args": "arguments as a list of strings (typed: one line, split as a shell splits it)",
    "bool": "true or false",
}

# Longest accepted text per kind: a value is read by people and shells, never megabytes.
_MAX_LENGTH = {
    "slug": 64,
    "host": 253,
    "nic": 255,
    "path": 1024,
    "relpath": 1024,
    "version": 32,
    "hostfile": 4096,
    "gres": 256,
    "image": 512,
    "slurm_time": 32,
    "script": 1024,
}
# A time limit Slurm and people read sensibly: a year at most (Slurm itself takes any count of minutes).
MAX_SLURM_SECONDS = 365 * 24 * 3600
# Integers and numbers as people write them: ASCII digits only (int() takes '1_0' and Arabic-Indic digits).
_INT = re.compile(r"[-+]?[0-9]+")
_FLOAT = re.compile(r"[-+]?(([0-9]+\.?[0-9]*|\.[0-9]+)(e[-+]?[0-9]+)?|nan|inf|infinity)", re.IGNORECASE)
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f\u2028\u2029]")
# An IPv6 zone id names an interface: Linux interface names are at most 15 of these characters.
_SLUG = re.compile(r"^[a-z][a-z0-9_-]{0,63}$")
_HOSTNAME = re.compile(
    r"^(?=.{1,253}$)[A-Za-z0-9]([A-Za-z0-9-]{0,62}[A-Za-z0-9])?(\.[A-Za-z0-9]([A-Za-z0-9-]{0,62}[A-Za-z0-9])?)*$"
)
_NIC = re.compile(r"^[\^=]?[A-Za-z0-9_.:-]+(,[A-Za-z0-9_.:-]+)*$")
_PATH = re.compile(r"^/[A-Za-z0-9_./+@:-]*$")
_RELPATH = re.compile(r"^[A-Za-z0-9_./+@:-]+$")
_SLURM_TIME = re.compile(r"(?:([0-9]{1,3})-)?([0-9]{1,4}):([0-5][0-9]):([0-5][0-9])")
_SLURM_NAME = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,63}$")
_GRES = re.compile(r"^[A-Za-z0-9_]+(:[A-Za-z0-9_.-]+)*(,[A-Za-z0-9_]+(:[A-Za-z0-9_.-]+)*)*$")
# A container image reference: [host[:port]/]path[:tag][@digest] (the distribution reference grammar, simplified).
_IMAGE = re.compile(
    r"^(?:[A-Za-z0-9](?:[A-Za-z0-9.-]*[A-Za-z0-9])?(?::[0-9]+)?/)?"
    r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*(?:/[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*)*"
    r"(?::[A-Za-z0-9_][A-Za-z0-9_.-]{0,127})?(?:@sha256:[a-f0-9]{64})?$"
)
_K8S_NAME = re.compile(r"^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$")
_LABEL_NAME = r"[A-Za-z0-9]([A-Za-z0-9_.-]{0,61}[A-Za-z0-9])?"
_LABEL_KEY = re.compile(rf"^([a-z0-9]([a-z0-9.-]{{0,251}}[a-z0-9])?/)?{_LABEL_NAME}$")
_LABEL_VALUE = re.compile(rf"^({_LABEL_NAME})?$")


def _parse_int(question: Question, raw: Any) -> int:
    if isinstance(raw, int) and not isinstance(raw, bool):
        return raw
    if not isinstance(raw, str):
        raise Invalid(f"must be {question.allowed()}")
    if not _INT.fullmatch(raw.strip()):
        raise Invalid(f"must be {question.allowed()}, written with the digits 0-9")
    return int(raw.strip(), 10)


def _parse_float(question: Question, raw: Any) -> float:
    if isinstance(raw, bool) or not isinstance(raw, int | float | str):
        raise Invalid(f"must be {question.allowed()}")
    if isinstance(raw, str) and not _FLOAT.fullmatch(raw.strip()):
        raise Invalid(f"must be {question.allowed()}, written with the digits 0-9")
    try:
        value = float(raw.strip() if isinstance(raw, str) else raw)
    except (ValueError, OverflowError):
        raise Invalid(f"must be {question.allowed()}") from None
    if value != value or value in (float("inf"), float("-inf")):
        raise Invalid("must be a finite number")
    return value


def _parse_choice(question: Question, raw: Any) -> str:
    # YAML 1.1 reads a bare `off` as false; take it as the word the user wrote.
    text = "off" if raw is False else ("on" if raw is True else str(raw).strip())
    if text not in {c.value for c in question.choices}:
        raise Invalid(f"must be {question.allowed()}")
    return text


_BOOL_WORDS = {"true": True, "yes": True, "on": True, "false": False, "no": False, "off": False}


def _parse_bool(question: Question, raw: Any) -> bool:
    # YAML reads true/yes/on as a bool already; typed text and template variables arrive as words
    if isinstance(raw, bool):
        return raw
    word = raw.strip().lower() if isinstance(raw, str) else None
    if word not in _BOOL_WORDS:
        raise Invalid(f"must be {question.allowed()}")
    return _BOOL_WORDS[word]


def _parse_choice_int(question: Question, raw: Any) -> int:
    text = str(raw).strip() if isinstance(raw, str | int) and not isinstance(raw, bool) else ""
    if text not in {c.value for c in question.choices}:
        raise Invalid(f"must be {question.allowed()}")
    return int(text)


def _parse_pattern(pattern: re.Pattern[str]) -> Callable[[Question, Any], str]:
    def parse(question: Question, raw: Any) -> str:
        text = str(raw).strip() if isinstance(raw, str | int) and not isinstance(raw, bool) else None
        if text is None or not pattern.fullmatch(text):
            raise Invalid(f"must be {question.allowed()}")
        return text

    return parse


def _parse_host(question: Question, raw: Any) -> str:
    text = str(raw).strip() if isinstance(raw, str) else ""
    if "%" in text and is_ip(text.split("%", 1)[0]):
        _check_zone(text)
    if is_ip(text) or _HOSTNAME.fullmatch(text):
        return text
    raise Invalid(f"must be {question.allowed()}")


def _check_zone(text: str) -> None:
    """Refuse an IPv6 zone id (after '%') that is not an interface name."""
    zone = text.split("%", 1)[1]
    if not ZONE.fullmatch(zone):
        raise Invalid("the zone id after '%' must be an interface name: [A-Za-z0-9_.:-], at most 15 characters")


def _parse_ip_list(question: Question, raw: Any) -> tuple[str, ...]:
    # text may be pasted: commas, spaces or newlines between addresses
    items = re.split(r"[,\s]+", raw.strip()) if isinstance(raw, str) else raw
    if not isinstance(items, list | tuple) or not items:
        raise Invalid(f"must be {question.allowed()}")
    items = _expand_ranges(items)
    for item in items:
        if isinstance(item, str) and "%" in item and is_ip(item.split("%", 1)[0]):
            _check_zone(item)
    bad = [str(item) for item in items if not isinstance(item, str) or not is_ip(item)]
    if bad:
        shown = ", ".join(shorten(item) for item in bad[:3]) + (f" and {len(bad) - 3} more" if len(bad) > 3 else "")
        raise Invalid(f"not an IPv4 or IPv6 address: {shown}")
    return tuple(str(ipaddress.ip_address(item)) for item in items)


def _parse_host_list(question: Question, raw: Any) -> tuple[str, ...]:
    items = [part.strip() for part in raw.split(",")] if isinstance(raw, str) else raw
    if not isinstance(items, list | tuple) or not items:
        raise Invalid(f"must be {question.allowed()}")
    for item in items:
        if isinstance(item, str):
            refuse_control_characters(item)
    bad = [str(item) for item in items if not isinstance(item, str) or not (is_ip(item) or _HOSTNAME.fullmatch(item))]
    if bad:
        shown = ", ".join(shorten(item) for item in bad[:3]) + (f" and {len(bad) - 3} more" if len(bad) > 3 else "")
        raise Invalid(f"not a host name or address: {shown}")
    return tuple(str(item) for item in items)


def _parse_slurm_time(question: Question, raw: Any) -> str:
    # A bare number is minutes, as Slurm reads --time=240 (240 and '240' alike): written out as HH:MM:SS.
    text = str(raw).strip() if isinstance(raw, str | int) and not isinstance(raw, bool) else ""
    if (isinstance(raw, int) and not isinstance(raw, bool)) or (text.isascii() and text.isdigit()):
        minutes = raw if isinstance(raw, int) else int(text)
        if minutes <= 0:
            raise Invalid(f"must be {question.allowed()}")
        if minutes * 60 > MAX_SLURM_SECONDS:
            raise Invalid(f"at most 365 days ({MAX_SLURM_SECONDS // 3600}:00:00 or 365-00:00:00)")
        return f"{minutes // 60:02d}:{minutes % 60:02d}:00"
    match = _SLURM_TIME.fullmatch(text)
    if match is None:
        raise Invalid(f"must be {question.allowed()}")
    days, hours, minutes, seconds = (int(part or 0) for part in match.groups())
    if match.group(1) is not None and hours > 23:
        raise Invalid("after the days (D-HH:MM:SS) the hours run from 00 to 23")
    if ((days * 24 + hours) * 60 + minutes) * 60 + seconds > MAX_SLURM_SECONDS:
        raise Invalid(f"at most 365 days ({MAX_SLURM_SECONDS // 3600}:00:00 or 365-00:00:00)")
    return text


def _expand_ranges(items: list[Any] | tuple[Any, ...]) -> list[Any]:
    """Items with each range FIRST-LAST replaced by its addresses."""
    from wizard.answers.hostfile import MAX_HOSTS, expand, is_range, size

    expanded: list[Any] = []
    for item in items:
        ranged = isinstance(item, str) and is_range(item)
        try:
            count = size(item) if ranged else 1  # counted before expanding: a few ranges may name millions
        except ValueError as error:
            raise Invalid(str(error)) from None
        if len(expanded) + count > MAX_HOSTS:
            raise Invalid(f"more than {MAX_HOSTS} addresses in all, the most nodes a job has")
        if ranged:
            expanded.extend(expand(item))
        else:
            expanded.append(item.strip() if isinstance(item, str) else item)
    return expanded


def _parse_hostfile(question: Question, raw: Any) -> str:
    from wizard.answers.hostfile import HostListError, read

    if not isinstance(raw, str):
        raise Invalid(f"must be {question.allowed()}")
    path = str(Path(raw.strip()).expanduser().absolute())
    try:
        read(path)
    except HostListError as error:
        raise Invalid(str(error)) from None
    return path


def _parse_labels(question: Question, raw: Any) -> tuple[tuple[str, str], ...]:
    """Label pairs from a YAML mapping or from `key=value, key=value` text, in the order given."""
    if isinstance(raw, str):
        pairs = []
        for part in (p.strip() for p in raw.split(",")):
            key, equals, value = part.partition("=")
            if not equals:
                raise Invalid(f"{part!r} is not key=value; must be {question.allowed()}")
            pairs.append((key.strip(), value.strip()))
    elif isinstance(raw, Mapping):
        pairs = [(key, "" if value is None else value) for key, value in raw.items()]
    elif isinstance(raw, tuple) and all(isinstance(pair, tuple) and len(pair) == 2 for pair in raw):
        pairs = list(raw)  # already parsed: answers given again as values parse to themselves
    else:
        raise Invalid(f"must be {question.allowed()}")
    for key, value in pairs:
        for text in (key, value):
            if isinstance(text, str):
                refuse_control_characters(text)
        if not isinstance(key, str) or not _LABEL_KEY.fullmatch(key):
            raise Invalid(f"not a label key: {key!r}")
        if isinstance(value, bool) or not isinstance(value, str | int) or not _LABEL_VALUE.fullmatch(str(value)):
            raise Invalid(f"not a label value for {key}: {value!r} (at most 63 letters, digits, '-', '_', '.')")
    return tuple((key, str(value)) for key, value in pairs)


def _parse_script(question: Question, raw: Any) -> str:
    try:
        return script.script_path(raw)
    except script.Invalid as invalid:
        raise Invalid(str(invalid)) from None


def _parse_args(question: Question, raw: Any) -> tuple[str, ...]:
    try:
        args = script.script_args(raw)
    except script.Invalid as invalid:
        raise Invalid(str(invalid)) from None
    for index, arg in enumerate(args, 1):
        try:
            refuse_control_characters(arg)
        except Invalid as invalid:
            raise Invalid(f"argument {index} {invalid}") from None
    return args


def _parse_version(question: Question, raw: Any) -> str:
    text = str(raw).strip() if isinstance(raw, str | int | float) and not isinstance(raw, bool) else ""
    if hardware.parse_version(text) is None:
        raise Invalid(f"must be {question.allowed()}")
    return text


_PARSERS: dict[str, Callable[[Question, Any], Any]] = {
    "int": _parse_int,
    "float": _parse_float,
    "choice": _parse_choice,
    "bool": _parse_bool,
    "slug": _parse_pattern(_SLUG),
    "nic": _parse_pattern(_NIC),
    "path": _parse_pattern(_PATH),
    "relpath": _parse_pattern(_RELPATH),
    "choice_int": _parse_choice_int,
    "host": _parse_host,
    "ip_list": _parse_ip_list,
    "host_list": _parse_host_list,
    "slurm_time": _parse_slurm_time,
    "slurm_name": _parse_pattern(_SLURM_NAME),
    "gres": _parse_pattern(_GRES),
    "hostfile": _parse_hostfile,
    "version": _parse_version,
    "image": _parse_pattern(_IMAGE),
    "k8s_name": _parse_pattern(_K8S_NAME),
    "labels": _parse_labels,
    "script": _parse_script,
    "args": _parse_args,
}


def _empty_list(raw: Any) -> bool:
    return isinstance(raw, list | tuple) and not raw


def refuse_control_characters(text: str) -> None:
    """Refuse text holding a control character: a newline or escape would survive into scripts and manifests."""
    found = _CONTROL.search(text)
    if found is not None:
        where = "at the end" if found.start() == len(text) - 1 else f"at character {found.start() + 1}"
        raise Invalid(f"holds a control character ({found.group()!r}) {where}; write it on one line")


def shorten(text: str, limit: int = 80) -> str:
    """`text` cut to about `limit` characters for a message, saying how long it was."""
    return text if len(text) <= limit else f"{text[:limit]}... ({len(text)} characters)"


def _number(bound: float) -> str:
    """A bound as people write it: 2147483647, 10, 0.5 (not 2.14748e+09)."""
    return str(int(bound)) if float(bound).is_integer() else f"{bound:g}"
