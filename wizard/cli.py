"""The npu-wizard command: `main(argv) -> int` is the only place errors become exit codes.

Exit codes: 0 success; 1 the user's input is wrong (answers, paths, overwrite
refused); 2 usage error; 3 the training run failed; 130 interrupted.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

from wizard import __version__
from wizard.errors import Problem, WizardError

EXIT_OK, EXIT_INPUT, EXIT_USAGE, EXIT_RUN_FAILED, EXIT_INTERRUPTED = 0, 1, 2, 3, 130


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of the top-level command."""
    parser = argparse.ArgumentParser(
        prog="npu-wizard",
        description="Render a ready-to-run PyTorch DDP project for Ascend NPUs. "
        "Without --answers, the interactive wizard asks the questions.",
        epilog="Exit codes: 0 success, 1 bad input (every problem listed, nothing written), "
        "2 usage error, 3 training run failed, 130 interrupted.",
    )
    parser.add_argument("--version", action="version", version=f"npu-wizard {__version__}")
    parser.add_argument(
        "--answers", metavar="FILE", help="answers file (YAML) to render from without questions; '-' reads stdin"
    )
    parser.add_argument(
        "-o",
        "--output",
        metavar="DIR",
        default=".",
        help="folder to create the project in (default: the current folder)",
    )
    parser.add_argument("--force", action="store_true", help="replace an existing project folder whole")
    parser.add_argument("--dry-run", action="store_true", help="list the files and warnings; write nothing")
    parser.add_argument("--edit", action="store_true", help="open the interactive wizard pre-filled from --answers")
    parser.epilog += " Run a rendered project: npu-wizard run PROJECT (see npu-wizard run --help)."
    return parser


def build_run_parser() -> argparse.ArgumentParser:
    """The argument parser of `npu-wizard run`."""
    parser = argparse.ArgumentParser(
        prog="npu-wizard run",
        description="Start a rendered project's launch scripts and follow every rank; "
        "on a failure, stop the job and name the rank that failed first.",
    )
    parser.add_argument("project", help="the rendered project folder")
    parser.add_argument("--node", type=int, help="start only this node's script (default: every node simulated here)")
    parser.add_argument("--interval", type=float, default=2.0, help="seconds between progress lines (default 2)")
    parser.add_argument(
        "--smoke", action="store_true", help="only check the topology: one all_reduce and one barrier on every rank"
    )
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run npu-wizard with `argv`; return the exit code."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["doctor"]:
        from wizard.doctor import command as doctor

        return _guarded(lambda: doctor(argv[1:]))
    if argv[:1] == ["run"]:
        return _guarded(lambda: _run(build_run_parser().parse_args(argv[1:])))
    args = build_parser().parse_args(argv)
    return _guarded(
        lambda: _render_from_file(args) if args.answers is not None and not args.edit else _interactive(args)
    )


def _guarded(command: Callable[[], int]) -> int:
    """Run a command, turning npu-wizard's errors and Ctrl-C into exit codes."""
    try:
        return command()
    except WizardError as error:
        print(f"npu-wizard: {error}", file=sys.stderr)
        return error.exit_code
    except KeyboardInterrupt:
        print("npu-wizard: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED


def _run(args: argparse.Namespace) -> int:
    from wizard.run import run_project

    train_args = ["--smoke"] if args.smoke else []
    run_project(Path(args.project), node=args.node, interval=args.interval, train_args=train_args)
    return EXIT_OK


def _read_answers_text(source: str) -> str:
    from wizard.errors import TargetError

    if source == "-":
        return sys.stdin.read()
    path = Path(source)
    try:
        return path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise TargetError(f"answers file {source} does not exist") from None
    except (IsADirectoryError, PermissionError, UnicodeDecodeError) as error:
        raise TargetError(f"cannot read answers file {source}: {error}") from None


def _print_warnings(warnings: Sequence[Problem]) -> None:
    for warning in warnings:
        print(f"warning: {warning}", file=sys.stderr)


def _render_from_file(args: argparse.Namespace) -> int:
    from wizard.answers import load_text
    from wizard.render import render

    answers = load_text(_read_answers_text(args.answers))
    result = render(answers, Path(args.output), force=args.force, dry_run=args.dry_run)
    _print_warnings(result.warnings)
    if args.dry_run:
        verb = "would replace" if result.replaced else "would create"
        print(f"{verb} {result.project_dir} with {len(result.files)} files:")
        for name in result.files:
            print(f"  {name}")
        return EXIT_OK
    action = "replaced" if result.replaced else "created"
    print(f"{action} {result.project_dir} ({len(result.files)} files)")
    print(f"next: read {result.project_dir / 'README.md'} for what to run on each node")
    return EXIT_OK


def _interactive(args: argparse.Namespace) -> int:
    from wizard.tui import create_app

    raw, problems, path = _edit_source(args) if args.edit else ({}, [], None)
    app = create_app(raw, Path(args.output), file_problems=problems, answers_path=path)
    app.run()
    return EXIT_OK


def _edit_source(args: argparse.Namespace) -> tuple[dict[str, object], list[Problem], Path]:
    """Raw answers to pre-fill from; problems in them are shown in the wizard, not refused."""
    import yaml

    from wizard.answers import flatten
    from wizard.errors import MISSING, AnswersError, TargetError

    if args.answers in (None, "-"):
        raise TargetError("--edit needs an answers file to start from: npu-wizard --answers FILE --edit")
    try:
        document = yaml.safe_load(_read_answers_text(args.answers)) or {}
    except yaml.YAMLError as error:
        raise AnswersError([Problem("(file)", MISSING, f"not valid YAML: {error}")]) from None
    if not isinstance(document, dict):
        raise AnswersError([Problem("(file)", MISSING, "must be a mapping of answers (key: value)")])
    raw, problems = flatten(document)
    return raw, problems, Path(args.answers)
