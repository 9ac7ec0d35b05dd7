"""The npu-wizard command: `main(argv) -> int` is the only place errors become exit codes.

Exit codes: 0 success; 1 the user's input is wrong (answers, paths, overwrite
refused); 2 usage error; 3 the training run failed; 130 interrupted.
"""

from __future__ import annotations

import argparse
import math
import shlex
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

from wizard import __version__
from wizard.errors import WizardError

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
    where = parser.add_mutually_exclusive_group()
    where.add_argument(
        "-o",
        "--output",
        metavar="DIR",
        help="folder to create the project in, as DIR/<project_name> (default: the current folder)",
    )
    where.add_argument(
        "--into",
        metavar="REPO",
        help="add the project to your own repository REPO (which must exist) instead: every file goes into the "
        "one folder REPO/npu (see --folder): launch/, sysctl/, slurm/ or k8s/, runtime/, answers.yaml, the README "
        "as NPU-WIZARD.md, the requirements as requirements-npu-wizard.txt, .npu-wizard/. A file of yours in the "
        "way is never overwritten: each is named and nothing is written. With --force, only npu-wizard's own "
        "files of an earlier --into are replaced. Needs --answers; not with --clean or --edit",
    )
    parser.add_argument(
        "--folder",
        metavar="NAME",
        help="with --into REPO: the folder of REPO the project goes into (default: npu; made if missing; "
        "clashes are looked for there only); your script (training.script, a path from REPO) runs from REPO's "
        "root as under plain torchrun, and nothing of npu-wizard's is importable there by a name of yours. "
        "--folder . is the older layout: npu-wizard's files straight into REPO's root",
    )
    parser.add_argument(
        "--force",
        action="store_true",
        help="render an existing project folder again: the files npu-wizard generated there (its "
        ".npu-wizard/pristine.json.gz names them) are replaced, edits and all; everything else (your own files, "
        "its checkpoints/ and those --fresh set aside, runs/, a data folder inside it) moves into the new one "
        "(see --clean); --dry-run lists what is kept. Ctrl-C or SIGTERM on the way puts the old project back. "
        "Refused while a run of the project is alive, a mount point is inside it, its data folder is the project "
        "folder, holds it or is one the render makes, a file of yours is where the render writes, the folder was "
        "rendered --into, or it has no record of npu-wizard's files and holds others. "
        "With --into: only npu-wizard's own files of an earlier --into are replaced, never yours",
    )
    parser.add_argument(
        "--clean",
        action="store_true",
        help="with --force: drop the old checkpoints/, runs/ and data folder too (never your own files)",
    )
    parser.add_argument("--dry-run", action="store_true", help="list the files and warnings; write nothing")
    parser.add_argument("--edit", action="store_true", help="open the interactive wizard pre-filled from --answers")
    parser.epilog += (
        " Run a rendered project: npu-wizard run PROJECT; watch a run: npu-wizard monitor RUN; "
        "check a node first: npu-wizard doctor PROJECT; draw a run: npu-wizard report RUN; "
        "pack a run for support: npu-wizard bundle RUN; "
        "change the answers of a project and keep your edits: "
        "npu-wizard update PROJECT (see their --help)."
    )
    return parser


def build_run_parser() -> argparse.ArgumentParser:
    """The argument parser of `npu-wizard run`."""
    parser = argparse.ArgumentParser(
        prog="npu-wizard run",
        description="Start a rendered project's launch scripts and watch every rank (a live view on a terminal); "
        "on a failure, stop the whole job and name the rank that failed first.",
        epilog="One run of each node of a project at a time; refused while an update of it is at work or half done. "
        "Exit codes: 0 the job finished (whatever --restarts it took), 1 bad project or options (or a run of it "
        "alive), 3 the job failed or hung "
        "(root cause printed), 130 interrupted, 143 SIGTERM, 129 SIGHUP (every process of the job stopped). "
        "To rehearse a failure before a long job, set NPU_WIZARD_REHEARSE: hang:RANK:STEP[:sleep|barrier|data] "
        "hangs a rank (or * for every rank) at its STEP-th step, compile-fails makes the compiler fail, "
        "comma-separated (docs/rehearse.md). "
        "npu-wizard run PROJECT [OPTIONS] -- ARGS: ARGS go to every rank's script for this run only, last (after "
        "training.script_args, and training.resume_args where the start resumes). Every rank's environment says "
        "which start of the job it is (NPU_WIZARD_ATTEMPT, 1 for the first) and whether it resumes "
        "(NPU_WIZARD_RESUMING=1: a --restarts attempt, or a run after one that did not finish).",
    )
    parser.add_argument("project", help="the rendered project folder")
    where = parser.add_mutually_exclusive_group()
    where.add_argument("--node", type=int, help="start only this node's script (on node N of a real cluster)")
    where.add_argument(
        "--all-nodes",
        action="store_true",
        help="start every node's script on this host (the default when all host IPs are loopback)",
    )
    _add_watch_arguments(parser)
    parser.add_argument(
        "--max-restarts",
        type=_whole_number(0),
        default=0,
        metavar="N",
        help="let torchrun/torch-npu-run restart failed workers N times on the nodes still there, resuming from "
        "the last checkpoint (other launchers have no restart mechanism); see --restarts for the whole job's",
    )
    parser.add_argument(
        "--restarts",
        type=_whole_number(0),
        metavar="N",
        help="after a failure a restart can fix (a rank's error after the first step, a vanished rank, a lost node, "
        "a hang), stop every node, check the failed one, and start the whole job again from the newest checkpoint "
        "every rank can load, up to N times, with any launcher and engine (default: the answers' run.restarts, "
        "else 0). It acts when --max-restarts' own worker restarts are used up or cannot help (a node lost): "
        "each attempt is listed in the summary. Not retried: bad answers, a preflight or launch failure, a script "
        "failing before its first step, a checkpoint that does not fit",
    )
    parser.add_argument(
        "--save-grace",
        type=_whole_number(0),
        default=None,
        metavar="S",
        help="on Ctrl-C or SIGTERM, every rank is sent SIGTERM and saves a checkpoint at its next logged step; "
        "what is still running S seconds later is killed (default 60; 0: kill at once, as on a failure)",
    )
    parser.add_argument(
        "--abort-on-hang",
        action="store_true",
        help="stop the job when a rank is hung (see --hang-after) or missing at the start-up deadline",
    )
    parser.add_argument(
        "--start-timeout",
        type=_at_least_one,
        metavar="S",
        help="name the nodes and ranks that have not started after S seconds "
        "(default: the project's HCCL_CONNECT_TIMEOUT + 60)",
    )
    parser.add_argument(
        "--status-port",
        type=_port,
        metavar="PORT",
        help="port on the master where node 0's runner hears every rank (default: master_port + 1)",
    )
    parser.add_argument(
        "--smoke", action="store_true", help="only check the topology: one all_reduce and one barrier on every rank"
    )
    parser.add_argument(
        "--bandwidth",
        action="store_true",
        help="with --smoke (implied): then measure all_reduce and all_gather (and, where training.parallelism shards, "
        "reduce_scatter, both into one tensor as fully_shard runs them) with the job's backend over 4 KiB to "
        "256 MiB messages (16 MiB on the CPU; at most a quarter of a rank's free memory), algorithm and bus "
        "bandwidth per size as nccl-tests define them, and each local rank's link to the same local rank of the "
        "neighbouring nodes; prints a table, names a link slow in every round (its best more than 50%% below the "
        "median) with its node, local rank and device, and writes bandwidth.json into the run folder",
    )
    parser.add_argument(
        "--bandwidth-max-bytes",
        type=_message_size,
        metavar="BYTES",
        help="with --bandwidth: the collectives' largest message, in bytes (4096 or more), for a quicker check "
        "(the links keep messages of 4 MiB or more)",
    )
    parser.add_argument(
        "--epochs",
        type=_at_least_one,
        metavar="N",
        help="train N epochs in all (default: the project's), resuming from the checkpoint if there is one; "
        "the generated train.py only: refused for a script of your own (give it its own option in "
        "training.script_args)",
    )
    parser.add_argument(
        "--fresh",
        action="store_true",
        help="start from step 0: first move this project's checkpoint files on this node (the step-N.pt files "
        "the generated train.py writes) into a set-aside-<stamp> subfolder of the checkpoint folder (nothing else "
        "moves, nothing is deleted); a script of your own keeps its own checkpoints where it saves them: move "
        "those yourself",
    )
    parser.add_argument(
        "--profile",
        type=_profile_window,
        metavar="A:B",
        help="record the steps after step A up to step B (20:30: steps 21 to 30) with the device's profiler "
        "(torch_npu.profiler on an NPU, torch.profiler elsewhere) on the ranks of --profile-ranks; the traces go "
        "into RUN/profile, and npu-wizard report RUN sums them up. A script of your own is profiled through its "
        "report.step calls",
    )
    parser.add_argument(
        "--profile-ranks",
        type=_profile_ranks,
        metavar="RANKS",
        help="all (the default), rank numbers (0,3), or straggler: when the monitor flags a straggler, that rank "
        "and a median rank record the next B - A steps (10 without --profile), once per run (straggler:N: up to "
        "N times)",
    )
    parser.add_argument(
        "--dry-run",
        action="store_true",
        help="print exactly what would be submitted or executed (commands, batch script); start nothing",
    )
    parser.add_argument(
        "--report",
        action="store_true",
        help="when the job ends (finished, failed or interrupted), write report.html into its run folder "
        "(see npu-wizard report --help)",
    )
    return parser


def _whole_number(least: int, what: str = "a whole number") -> Callable[[str], int]:
    """An argparse type: a whole number of `least` or more, `what` saying what it counts."""

    def parse(value: str) -> int:
        try:
            number = int(value)
        except ValueError:
            number = least - 1
        if number < least:
            raise argparse.ArgumentTypeError(f"{value!r}: give {what}, {least} or more")
        return number

    return parse


_at_least_one = _whole_number(1)
_message_size = _whole_number(4096, "a whole number of bytes")  # 4 KiB: the smallest the check measures


def _profile_window(value: str) -> str:
    """An argparse type: a profile window A:B (runtime/profile_window.py)."""
    from runtime.profile_window import parse_window

    try:
        parse_window(value)
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from None
    return value


def _profile_ranks(value: str) -> str:
    """An argparse type: all, rank numbers (0,3), or straggler[:N]."""
    from runtime.profile_window import parse_ranks

    try:
        parse_ranks(value)
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from None
    return value


def _seconds(value: str) -> float:
    """An argparse type: a finite number of seconds above 0 (nan, inf and negative numbers are refused)."""
    try:
        number = float(value)
    except ValueError:
        number = math.nan
    if not (math.isfinite(number) and number > 0):
        raise argparse.ArgumentTypeError(f"{value!r}: give a number of seconds above 0")
    return number


def _port(value: str) -> int:
    """An argparse type: a TCP port, 1 to 65535."""
    try:
        number = int(value)
    except ValueError:
        number = 0
    if not 1 <= number <= 65535:
        raise argparse.ArgumentTypeError(f"{value!r}: give a port from 1 to 65535")
    return number


def build_monitor_parser() -> argparse.ArgumentParser:
    """The argument parser of `npu-wizard monitor`."""
    parser = argparse.ArgumentParser(
        prog="npu-wizard monitor",
        description="Attach to a run folder (runs/<stamp> of a project), live or finished: "
        "the same views as npu-wizard run; a summary for a finished run.",
    )
    parser.add_argument("run", help="the run folder (or a project folder: its newest run)")
    _add_watch_arguments(parser)
    parser.add_argument(
        "--stacks",
        action="store_true",
        help="ask the running `npu-wizard run` for every rank's stack and collectives now (into RUN/hang/), "
        "print where each rank is, and exit",
    )
    return parser


def build_report_parser() -> argparse.ArgumentParser:
    """The argument parser of `npu-wizard report`."""
    parser = argparse.ArgumentParser(
        prog="npu-wizard report",
        description="Draw a run: write report.html into the run folder, one self-contained page (opens without "
        "network access) with the loss per rank, the throughput per rank and per node, the compute-time spread "
        "with the stragglers the monitor found, restarts, checkpoints and the failure with its root cause. "
        "Works on finished, failed, interrupted and still-running runs.",
        epilog="Exit codes: 0 written (its path printed), 1 no such run folder, nothing to write to, or PNG "
        "files of the same names in DIR without --force (each named; nothing written).",
    )
    parser.add_argument("run", help="the run folder (or a project folder: its newest run)")
    parser.add_argument("--png", metavar="DIR", help="also write each plot as a PNG file into DIR (made if missing)")
    parser.add_argument(
        "--force", action="store_true", help="with --png: replace the PNG files of the same names already in DIR"
    )
    return parser


def build_bundle_parser() -> argparse.ArgumentParser:
    """The argument parser of `npu-wizard bundle`."""
    parser = argparse.ArgumentParser(
        prog="npu-wizard bundle",
        description="Pack a run into one file for whoever must help: run.json, summary.json, every rank's events, "
        "every node's and rank's logs, the hang stacks, bandwidth.json and report.html where present, the answers, "
        "the versions and HCCL_/ASCEND_/NPU_WIZARD_ variables each rank started with, doctor's output and, on an "
        "NPU host, the ranks' newest plog files and npu-smi / hccn_tool outputs; each bounded, MANIFEST.txt lists "
        "what is in and what is missing and why. The status token and every variable named *TOKEN*, *KEY*, "
        "*SECRET*, *PASSWORD* or *CREDENTIAL* are removed, and so are secrets of a known shape (sshpass -p, a URL's "
        "password, a bearer header, mysql -p, hf_ tokens); NPU_WIZARD_SSH_COMMAND keeps only its program.",
        epilog="Exit codes: 0 written (its path printed), 1 no such run folder, a file in it that is not a regular "
        "file, or FILE there already without --force (nothing written).",
    )
    parser.add_argument("run", help="the run folder (or a project folder: its newest run)")
    parser.add_argument(
        "-o", "--output", metavar="FILE", help="write the bundle here (default: RUN/bundle-<UTC time>.tar.gz)"
    )
    parser.add_argument("--force", action="store_true", help="replace FILE if it is there")
    return parser


def build_update_parser() -> argparse.ArgumentParser:
    """The argument parser of `npu-wizard update`."""
    parser = argparse.ArgumentParser(
        prog="npu-wizard update",
        description="Render a project again from changed answers and keep your edits: every file is merged "
        "three ways (the project as generated, your copy, the new render). Edit answers.yaml and run it, "
        "or give another answers file. In a folder rendered with --into, only npu-wizard's own files are "
        "merged; yours are never read, moved or deleted, and a new file that would land on one of yours is "
        "refused, naming it.",
        epilog="Exit codes: 0 updated (or nothing to do), 1 conflicts (each file and its lines named; nothing "
        "changed unless --write-conflicts), bad answers or project, or another update of it at work or a run of "
        "it alive (named).",
    )
    parser.add_argument("project", help="the rendered project folder")
    parser.add_argument("--answers", metavar="FILE", help="the new answers (default: the project's answers.yaml)")
    parser.add_argument("--dry-run", action="store_true", help="say what would change; write nothing")
    parser.add_argument(
        "--write-conflicts",
        action="store_true",
        help="on conflicts, write the merge anyway with <<<<<<< / ======= / >>>>>>> markers to resolve by hand",
    )
    parser.add_argument(
        "--rebase",
        action="store_true",
        help="when .npu-wizard/pristine.json.gz is missing or damaged: keep your files and put <<<<<<< markers "
        "around every difference from the new render (without the base nothing tells your edits from the "
        "generator's); the new render becomes the base",
    )
    return parser


def _add_watch_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--plain", action="store_true", help="plain progress lines, no live view (default off a TTY)")
    parser.add_argument("--interval", type=_seconds, default=2.0, help="seconds between progress lines (default 2)")
    parser.add_argument(
        "--hang-after",
        type=_seconds,
        default=30.0,
        metavar="S",
        help="flag a rank as hung after S seconds without a heartbeat or a step (default 30)",
    )


def main(argv: Sequence[str] | None = None) -> int:
    """Run npu-wizard with `argv`; return the exit code."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["doctor"]:
        from wizard.doctor import command as doctor

        return _guarded(lambda: doctor(argv[1:]))
    if argv[:1] == ["run"]:
        own, script_args = _split_script_args(argv[1:])
        return _guarded(lambda: _run(build_run_parser().parse_args(own), script_args))
    if argv[:1] == ["monitor"]:
        return _guarded(lambda: _monitor(build_monitor_parser().parse_args(argv[1:])))
    if argv[:1] == ["report"]:
        return _guarded(lambda: _report(build_report_parser().parse_args(argv[1:])))
    if argv[:1] == ["bundle"]:
        return _guarded(lambda: _bundle(build_bundle_parser().parse_args(argv[1:])))
    if argv[:1] == ["update"]:
        from wizard.render.update_command import update

        return _guarded(lambda: update(build_update_parser().parse_args(argv[1:])))
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.clean and not args.force:
        parser.error("--clean only goes with --force (it drops the old project's checkpoints/, runs/ and data folder)")
    if args.into is not None and args.clean:
        parser.error("--clean does not go with --into: npu-wizard never deletes anything of yours in your folder")
    if args.folder is not None and args.into is None:
        parser.error("--folder goes with --into REPO: it names the folder of the repository the project goes into")
    if args.folder is not None and not args.folder.strip("/"):
        parser.error("--folder needs a folder name inside the repository (npu by default; '.' for the older layout)")
    if args.into is not None and (args.answers is None or args.edit):
        parser.error("--into needs --answers FILE (without --edit): the interactive wizard renders with -o")
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
    except KeyboardInterrupt as stop:  # Ctrl-C, or SIGTERM and SIGHUP where a command hears them (StopSignal)
        print("npu-wizard: interrupted", file=sys.stderr)
        return 128 + getattr(stop, "signum", EXIT_INTERRUPTED - 128)


def _split_script_args(argv: list[str]) -> tuple[list[str], tuple[str, ...]]:
    """`run`'s own arguments, and those after `--`, which go to every rank's script."""
    if "--" not in argv:
        return argv, ()
    at = argv.index("--")
    return argv[:at], tuple(argv[at + 1 :])


def _run(args: argparse.Namespace, script_args: tuple[str, ...] = ()) -> int:
    from wizard.answers import script
    from wizard.run.command import run
    from wizard.run.launch import RunOptions

    train_args = _train_args(args)
    if script_args and (args.smoke or args.bandwidth):
        build_run_parser().error(
            f"-- {shlex.join(script_args)}: arguments after -- go to your training script, which --smoke and "
            "--bandwidth do not run (they run npu-wizard's own check)"
        )
    try:
        script.script_args(list(script_args))
    except script.Invalid as invalid:
        build_run_parser().error(f"the arguments after --: {invalid}")
    options = RunOptions(
        node=args.node,
        all_nodes=args.all_nodes,
        interval=args.interval,
        hang_after=args.hang_after,
        abort_on_hang=args.abort_on_hang,
        start_timeout=args.start_timeout,
        max_restarts=args.max_restarts,
        restarts=args.restarts,
        status_port=args.status_port,
        **({} if args.save_grace is None else {"save_grace": float(args.save_grace)}),
        train_args=train_args,
        extra_args=script_args,
        profile=args.profile,
        profile_ranks=args.profile_ranks,
    )
    closing = _closing(args.report)
    run(args.project, options, dry_run=args.dry_run, fresh=args.fresh, live=_live(args), closing=closing)
    return EXIT_OK


def _closing(report: bool) -> Callable[[Path, str | None], list[str]]:
    """What `run` prints once its job ended: the report (written first with --report), and after a failure or a
    hang the bundle command for whoever must help."""
    from wizard.bundle.command import bundle_line
    from wizard.run_page.command import report_at_end, report_line

    def lines(run_dir: Path, outcome: str | None) -> list[str]:
        said = [report_at_end(run_dir) if report else report_line(run_dir)]
        return said + [bundle_line(run_dir)] if outcome in ("failed", "hung") else said

    return lines


def _train_args(args: argparse.Namespace) -> tuple[str, ...]:
    """What `run` passes on to train.py: the smoke test (and network check), or the epochs."""
    if args.bandwidth_max_bytes is not None and not args.bandwidth:
        build_run_parser().error("--bandwidth-max-bytes only goes with --bandwidth")
    if (args.profile or args.profile_ranks) and (args.smoke or args.bandwidth):
        build_run_parser().error("--profile and --profile-ranks go with training, not with --smoke or --bandwidth")
    straggler = (args.profile_ranks or "").startswith("straggler")
    if args.profile_ranks and not straggler and not args.profile:
        build_run_parser().error(f"--profile-ranks {args.profile_ranks} needs --profile A:B (the steps to record)")
    if args.bandwidth:
        largest = ("--bandwidth-max-bytes", str(args.bandwidth_max_bytes)) if args.bandwidth_max_bytes else ()
        return ("--smoke", "--bandwidth", *largest)
    if args.smoke:
        return ("--smoke",)
    return ("--epochs", str(args.epochs)) if args.epochs else ()


def _monitor(args: argparse.Namespace) -> int:
    from wizard.monitor.attach import RunFolder, watch_plain

    folder = RunFolder.open(Path(args.run), hang_after=args.hang_after)
    if args.stacks:
        from wizard.monitor.ask_stacks import ask_stacks

        ask_stacks(folder, sys.stdout)
        return EXIT_OK
    if _live(args):
        from wizard.monitor.app import monitor_live

        monitor_live(folder)
    else:
        watch_plain(folder, interval=args.interval)
    from wizard.run_page.command import report_line

    print(report_line(folder.run_dir))
    return EXIT_OK


def _report(args: argparse.Namespace) -> int:
    from wizard.run_page.command import report

    written = report(Path(args.run), Path(args.png) if args.png else None, force=args.force)
    print(f"report: {written.page}")
    for png in written.pngs:
        print(f"plot: {png}")
    return EXIT_OK


def _bundle(args: argparse.Namespace) -> int:
    from wizard.bundle.command import bundle

    print(f"bundle: {bundle(Path(args.run), Path(args.output) if args.output else None, force=args.force)}")
    return EXIT_OK


def _live(args: argparse.Namespace) -> bool:
    """The live view, unless --plain or not on a terminal."""
    return not args.plain and sys.stdout.isatty() and sys.stdin.isatty()


def _render_from_file(args: argparse.Namespace) -> int:
    from wizard.render.command import render_from_file

    render_from_file(
        args.answers,
        Path(args.output or "."),
        force=args.force,
        dry_run=args.dry_run,
        clean=args.clean,
        into=None if args.into is None else Path(args.into),
        folder=_into_folder(args.folder),
    )
    return EXIT_OK


def _into_folder(folder: str | None) -> str:
    """The folder of the repository --into renders into: --folder NAME (a trailing '/' dropped), else npu."""
    from wizard.render.into import DEFAULT_FOLDER

    return DEFAULT_FOLDER if folder is None else folder.rstrip("/") or folder


def _interactive(args: argparse.Namespace) -> int:
    from wizard.answers.source import answers_to_edit
    from wizard.tui import create_app
    from wizard.tui.repository import is_repository

    raw, problems, path = answers_to_edit(args.answers) if args.edit else ({}, [], None)
    here = Path.cwd()
    repository = here if not args.edit and args.output is None and is_repository(here) else None
    app = create_app(raw, Path(args.output or "."), file_problems=problems, answers_path=path, repository=repository)
    app.run()
    return EXIT_OK
