"""Starting a run: the options, the project's answers, the nodes, the run folder and what the engine is given.

`dry_run` and `manual_steps` print what a run would submit without starting anything; `Job` (job.py) starts it.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

from runtime.events import ENV_HEARTBEAT
from runtime.folders import keep_out_of_git
from runtime.profile_window import ENV_PROFILE, ENV_PROFILE_RANKS
from runtime.status import ENV_STATUS_ADDR, ENV_STATUS_TOKEN
from wizard.answers.model import Answers, load_text
from wizard.answers.source import read_answers_text
from wizard.errors import TargetError, write_advice
from wizard.monitor.state import DEFAULT_HANG_AFTER
from wizard.run.engines import Launch, engine_for
from wizard.run.engines.interpreter import ENV_PYTHON, interpreter
from wizard.run.resuming import attempt_env, unfinished_run

GRACE_SECONDS = 4.0
# a stopped run's ranks (Ctrl-C, SIGTERM) get this long to reach their next logged step and save
SAVE_GRACE_SECONDS = 60.0
RESTARTING_LAUNCHERS = ("torchrun", "torch-npu-run")


@dataclass(frozen=True)
class RunOptions:
    """How to run and watch the job; the defaults suit a first run."""

    node: int | None = None
    all_nodes: bool = False
    interval: float = 2.0
    hang_after: float = DEFAULT_HANG_AFTER
    start_timeout: float | None = None  # None: HCCL_CONNECT_TIMEOUT + START_MARGIN_S
    abort_on_hang: bool = False
    max_restarts: int = 0
    restarts: int | None = None  # the whole job's (wizard/run/attempts.py); None: the answers' run.restarts
    heartbeat: float = 2.0
    status_port: int | None = None
    grace: float = GRACE_SECONDS
    save_grace: float = SAVE_GRACE_SECONDS
    train_args: tuple[str, ...] = ()  # what npu-wizard asks of the script: --smoke, --epochs N
    extra_args: tuple[str, ...] = ()  # run PROJECT -- ARGS: one-off arguments for every rank's script, last
    env: dict[str, str] = field(default_factory=dict)
    profile: str | None = None  # --profile A:B (runtime/profile_window.py)
    profile_ranks: str | None = None  # --profile-ranks all | 0,3 | straggler[:N]


def load_project(project: Path) -> Answers:
    """The answers a rendered project was made from."""
    answers_file = project / "answers.yaml"
    if not answers_file.exists():
        raise TargetError(f"{project} is not an npu-wizard project (no answers.yaml); render one with --answers")
    return load_text(read_answers_text(str(answers_file), plain_file_only=True))


def nodes_to_start(answers: Answers, node: int | None, all_nodes: bool = False) -> list[int]:
    """The nodes a run of this project starts from here, as its engine decides."""
    return list(engine_for(answers).nodes_to_start(answers, node, all_nodes))


def restart_note(launcher: str, max_restarts: int) -> str | None:
    """What --max-restarts does with this launcher, when it cannot do what was asked."""
    if max_restarts > 0 and launcher not in RESTARTING_LAUNCHERS:
        return (
            f"note: the {launcher} launcher has no restart mechanism, so --max-restarts {max_restarts} is ignored: "
            "a failure stops the job; run again to resume from the last checkpoint "
            "(torchrun and torch-npu-run restart failed workers themselves)"
        )
    return None


def new_run_dir(project: Path) -> Path:
    """A fresh run folder under the project's runs/, which git is told to leave out (runs/.gitignore)."""
    stamp = time.strftime("%Y%m%d-%H%M%S")
    for suffix in range(1000):
        candidate = project / "runs" / (stamp if suffix == 0 else f"{stamp}-{suffix}")
        try:
            candidate.mkdir(parents=True)
        except FileExistsError:
            continue
        except OSError as error:
            raise TargetError(
                f"cannot make a run folder under {project / 'runs'} ({error.strerror}), so nothing was started: "
                f"{write_advice(error)}, then run again"
            ) from None
        # runs/.gitignore keeps the run out of git status; a disk too full for it fails at run.json next,
        # where the run folder is removed again and the reason said
        with contextlib.suppress(OSError):
            keep_out_of_git(candidate.parent)
        return candidate
    raise TargetError(f"cannot make a run folder under {project / 'runs'}")


def launch_for(
    project: Path, answers: Answers, nodes: Sequence[int], run_dir: Path, options: RunOptions, *, resuming: bool
) -> Launch:
    """What the engine is asked to start (the first attempt): the nodes, the run folder, the ranks' extra
    environment (the interpreter, the attempt, whether it resumes) and the script's arguments."""
    env = {
        **options.env,
        ENV_PYTHON: interpreter(answers, options.env),
        **attempt_env(1, resuming),
        "NPU_WIZARD_RUN_DIR": str(run_dir),
        "NPU_WIZARD_MAX_RESTARTS": str(options.max_restarts),
        # how long launch/run-node.sh lets its ranks save after a stop signal before it kills them
        "NPU_WIZARD_SAVE_GRACE": str(round(options.save_grace)),
    }
    env.setdefault(ENV_HEARTBEAT, os.environ.get(ENV_HEARTBEAT, str(options.heartbeat)))
    if options.profile:
        env[ENV_PROFILE] = options.profile
    if options.profile or options.profile_ranks:
        env[ENV_PROFILE_RANKS] = options.profile_ranks or "all"
    args = (*options.train_args, *options.extra_args)
    return Launch(project, answers, tuple(nodes), run_dir, env, args, options.grace)


def resumes(project: Path, options: RunOptions, *, fresh: bool = False) -> bool:
    """Whether a run's first attempt resumes: the project's last training run did not finish (not --smoke, --fresh)."""
    return not fresh and "--smoke" not in options.train_args and unfinished_run(project) is not None


def dry_run(project: Path, options: RunOptions, *, fresh: bool = False) -> str:
    """Exactly what a run would submit or execute (commands, batch script), without creating or starting anything."""
    project = project.resolve()
    answers = load_project(project)
    engine = engine_for(answers)
    nodes = engine.nodes_to_start(answers, options.node, options.all_nodes)
    run_dir = project / "runs" / time.strftime("%Y%m%d-%H%M%S")
    launch = launch_for(project, answers, nodes, run_dir, options, resuming=resumes(project, options, fresh=fresh))
    plan = engine.status_plan(launch, options.status_port)
    host = f"[{plan.advertise}]" if ":" in plan.advertise else plan.advertise
    port = str(plan.port) if plan.port else "<a free port, chosen at start>"
    token = "<this run's token>"
    launch = replace(launch, env={**launch.env, ENV_STATUS_ADDR: f"{host}:{port}", ENV_STATUS_TOKEN: token})
    return engine.dry_run(launch)


def manual_steps(project: Path, options: RunOptions, *, fresh: bool = False) -> str | None:
    """The commands to run by hand where this machine cannot submit the job (no kubectl); None where it can."""
    project = project.resolve()
    answers = load_project(project)
    engine = engine_for(answers)
    nodes = engine.nodes_to_start(answers, options.node, options.all_nodes)
    run_dir = project / "runs" / time.strftime("%Y%m%d-%H%M%S")
    launch = launch_for(project, answers, nodes, run_dir, options, resuming=resumes(project, options, fresh=fresh))
    return engine.manual_steps(launch)


def address(host: str, port: int) -> str:
    """host:port, an IPv6 host in brackets."""
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
