"""Secrets known by their shape in text, whatever names them.

`sshpass -p PASSWORD`, a URL's password (`https://user:PASSWORD@host`, a
proxy's too), an `Authorization: Bearer TOKEN` header, `mysql -pPASSWORD`
and the tokens of known services (Hugging Face's `hf_...`, GitHub's, GitLab's,
Slack's, an AWS access key) lose the secret and keep the rest. The ranks'
events go through `scrub` (runtime/events.py, runtime/provenance.py), and so
does every text the bundle keeps (wizard/bundle/redact.py). Standard library
only.
"""

from __future__ import annotations

import re

REDACTED = "<removed: secret>"
ARGUMENTS_LEFT_OUT = "<arguments not recorded>"
# where the runner's ssh client command comes from (wizard/run/engines/ssh.py): recorded as its program only
SSH_COMMAND_VARIABLE = "NPU_WIZARD_SSH_COMMAND"
MYSQL_CLIENTS = (
    r"mysql|mysqldump|mysqladmin|mysqlimport|mysqlshow|mysqlcheck|mariadb|mariadb-dump"
)
# each shape: the part to keep (if any), then the secret
SHAPES = (
    # scheme://user:PASSWORD@host; starts where a run of scheme characters starts (no quadratic retries)
    re.compile(
        r"(?P<keep>(?<![A-Za-z0-9+.-])[A-Za-z][A-Za-z0-9+.-]*://[^\s/@:'\"]*:)"
        r"(?P<secret>[^\s/@'\"]+)(?=@)"
    ),
    # Authorization: Bearer TOKEN (or Basic, Token, Digest), and a bearer token alone
    re.compile(
        r"(?P<keep>\b(?:authorization\s*[:=]\s*(?:(?:bearer|basic|token|digest)\s+)?|bearer\s+))"
        r"(?P<secret>[A-Za-z0-9._~+/=-]{8,})",
        re.IGNORECASE,
    ),
    # sshpass [its own options] -p PASSWORD (or -pPASSWORD); bounded scans keep a long line linear
    re.compile(
        r"(?P<keep>\bsshpass(?:\s+-[fdP]\s*\S+|\s+-[ehv]){0,6}\s+-p\s*)(?P<secret>[^\s'\"]+)"
    ),
    # mysql ... -pPASSWORD, within 300 characters: the password joined to -p (a -p alone asks)
    re.compile(
        rf"(?P<keep>\b(?:{MYSQL_CLIENTS})\b[^\n|;&]{{0,300}}?\s-p)(?P<secret>[^\s'\"]+)"
    ),
    re.compile(
        r"(?P<secret>\b(?:hf_[A-Za-z0-9]{30,}|gh[pousr]_[A-Za-z0-9]{36,}|github_pat_\w{40,}"
        r"|glpat-[\w-]{20,}|xox[abprs]-[A-Za-z0-9-]{10,}|AKIA[0-9A-Z]{16})\b)"
    ),
)


def scrub(text: str) -> str:
    """`text` with each secret of a known shape replaced by REDACTED."""
    for shape in SHAPES:
        text = shape.sub(_hidden, text)
    return text


def program_only(command: str) -> str:
    """A command line as recorded: its program, the arguments (where a password may be) left out."""
    words = command.split()
    if not words:
        return command
    program = REDACTED if "=" in words[0] else scrub(words[0])  # PASS=x sshpass ...
    return f"{program} {ARGUMENTS_LEFT_OUT}" if len(words) > 1 else program


def _hidden(match: re.Match[str]) -> str:
    secret = match.group("secret")
    if secret == REDACTED:
        return match.group(0)
    return (match.groupdict().get("keep") or "") + REDACTED
