"""`npu-wizard update PROJECT`: what it prints and when it writes (the merge is wizard.render.update)."""

from __future__ import annotations

import argparse
import shlex
import sys
from pathlib import Path

from wizard.answers.model import Answers, load_text
from wizard.answers.source import answers_base, print_warnings, read_answers_text
from wizard.errors import ConflictError, TargetError, shown
from wizard.render import journal, pristine
from wizard.render.conflict_markers import record_conflicts, refuse_unresolved
from wizard.render.older_layout import move_note
from wizard.render.project_locks import refuse_live_run, update_lock
from wizard.render.update import ANSWERS_FILE, UpdatePlan, plan_update


def update(args: argparse.Namespace) -> int:
    """Merge the new answers' render into the project; 0 when done, ConflictError on conflicts."""
    project = Path(args.project)
    if not project.is_dir():
        raise TargetError(f"{project} is not a folder; name a project rendered by npu-wizard")
    with update_lock(project, _command_line(args), optional=args.dry_run) as unlocked:
        if unlocked:
            print(f"warning: {unlocked}", file=sys.stderr, flush=True)
        code = _update_locked(project, args)
    # a repository of the older layout: how to move it into npu/ (once the update itself went through)
    note = move_note(project, args.project) if code == 0 else ""
    if note:
        print(f"\n{note}")
    return code


def _command_line(args: argparse.Namespace) -> str:
    """The update as a command line, for whoever finds the lock taken."""
    words = ["npu-wizard", "update", args.project]
    words += ["--answers", args.answers] if args.answers else []
    words += ["--dry-run"] * args.dry_run + ["--write-conflicts"] * args.write_conflicts + ["--rebase"] * args.rebase
    return shlex.join(words)


def _update_locked(project: Path, args: argparse.Namespace) -> int:
    """`update` while holding the project's update lock."""
    if not args.dry_run:  # a run that starts from now on finds the update lock taken and waits for none
        refuse_live_run(project, "the update")
    if journal.pending(project):
        if args.dry_run:
            raise TargetError(
                f"an update of {project} was interrupted; run npu-wizard update without --dry-run to finish it"
            )
        kept = journal.roll_forward(project)
        print(f"finished the interrupted update of {project} first")
        for name in kept:
            print(f"  kept     {shown(name)} (changed since that update began: not removed)")
    source = args.answers or str(project / ANSWERS_FILE)
    refuse_unresolved(project, f"run npu-wizard update {project} again")
    answers = load_text(read_answers_text(source, plain_file_only=args.answers is None), answers_base(source))
    plan = plan_update(project, answers, keep_answers_file=args.answers is None, rebase=args.rebase)
    print_warnings(plan.warnings)
    # --rebase: every difference from the new render is a conflict, written with markers as --write-conflicts does
    return report_and_apply(
        plan, answers, source, dry_run=args.dry_run, write_conflicts=args.write_conflicts or args.rebase
    )


def report_and_apply(plan: UpdatePlan, answers: Answers, source: str, *, dry_run: bool, write_conflicts: bool) -> int:
    """Print what the update changes; write it unless a dry run or a conflict forbids."""
    project = plan.project
    journal.check_targets(project, plan.writes, plan.removes)  # a dry run names them too
    if not plan.changes:
        if not dry_run and not pristine.same_copy(plan.old_pristine, plan.new_pristine):
            write(plan)  # the pristine copy follows the answers even when no file changes
        print(f"{project} already matches {source}: nothing to change")
        return 0
    print(f"{'would update' if dry_run else 'update'} {project} from {source} ({answers.world_size} ranks):")
    for change in plan.changes:
        print(f"  {change.describe()}")
    if plan.conflicts:
        names = ", ".join(shown(change.path) for change in plan.conflicts)
        if write_conflicts and not dry_run:
            write(plan)
            raise ConflictError(
                f"{len(plan.conflicts)} file(s) with conflicts written with <<<<<<< markers: {names}; "
                "keep what you want between the markers, delete the markers, and the update is done"
            )
        raise ConflictError(
            f"{len(plan.conflicts)} file(s) conflict, so nothing was changed: {names}; edit those lines to agree "
            "with the new answers, or run again with --write-conflicts to resolve them in the files"
        )
    if dry_run:
        print("dry run: nothing was written")
        return 0
    write(plan)
    print(f"updated {project}: {len(plan.changes)} file(s)")
    return 0


def write(plan: UpdatePlan) -> None:
    """Write the plan's files and its new pristine copy as one step."""
    from wizard.render.pristine import PRISTINE

    writes: dict[str, str | bytes] = {**plan.writes, PRISTINE: plan.new_pristine}
    # The record changes only once apply will not refuse for the targets or a pending journal (--edit never
    # finishes one): a refused update leaves it as it was.
    journal.check_targets(plan.project, writes, plan.removes)
    journal.refuse_pending(plan.project)
    record_conflicts(plan.project, [change.path for change in plan.conflicts])  # where run, doctor and update look
    journal.apply(plan.project, writes, plan.removes, plan.executable)
