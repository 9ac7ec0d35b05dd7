"""`npu-wizard run --profile 20:30 --profile-ranks all` for real: 1 x 2 CPU ranks (gloo), a trace per rank.

One run of the generated train.py and one of a user's script that calls
report.step (tests/user_scripts/profiled_report.py), each shared by the
tests that only read it. Every rank profiles itself: two ranks of one node
show it as four of two would, and each is one torch process less to start
(the shell launcher too: torchrun's agent would import torch once more).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from tests.runs import RunEnded, free_port, render_cpu, run_to_its_end
from wizard.answers.model import resolve
from wizard.render.render import render

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("profile_runs")]

SCRIPTS = Path(__file__).resolve().parent / "user_scripts"
WINDOW = ("--profile", "20:30", "--profile-ranks", "all")
RUN_S = 600  # torch processes on a loaded two-core machine, and their profilers
RANKS = 2


def render_own(
    tmp_path: Path, script: str, args: list[str], nodes: int = 2, launcher: str = "torchrun", **raw: Any
) -> Path:
    """`nodes` x 2 ranks on the CPU (gloo) running the user's `script` (from tests/user_scripts)."""
    answers: dict[str, Any] = {
        "project_name": "own-profiled",
        "device": "cpu",
        "nodes": nodes,
        "devices_per_node": 2,
        "launcher": launcher,
        "amp": "off",
        "network.host_ips": ["127.0.0.1"] * nodes,
        "network.master_port": free_port(),
        "training.script": f"src/{script}",
        "training.script_args": args,
        **raw,
    }
    project = render(resolve(answers), tmp_path).project_dir
    (project / "src").mkdir()
    shutil.copyfile(SCRIPTS / script, project / "src" / script)
    return project


@pytest.fixture(scope="module")
def generated_run(tmp_path_factory: pytest.TempPathFactory) -> RunEnded:
    """The generated train.py, 32 steps, steps 21 to 30 profiled on every rank, the report written at the end."""
    project = render_cpu(tmp_path_factory.mktemp("profiled"), "shell")
    return run_to_its_end(project, *WINDOW, "--report", timeout=RUN_S)


@pytest.fixture(scope="module")
def own_script_run(tmp_path_factory: pytest.TempPathFactory) -> RunEnded:
    """A user's script that calls report.step, 34 steps, the same window."""
    project = render_own(
        tmp_path_factory.mktemp("own-profiled"), "profiled_report.py", ["--steps", "34"], nodes=1, launcher="shell"
    )
    return run_to_its_end(project, *WINDOW, timeout=RUN_S)


def traces(run: RunEnded) -> dict[int, list[Path]]:
    return {rank: sorted((run.run_dir / "profile" / f"rank-{rank}").glob("*.pt.trace.json")) for rank in range(RANKS)}


def recorded_steps(trace: Path) -> int:
    """The ProfilerStep spans of a chrome trace, opened with json.load as Perfetto's and TensorBoard's loaders do."""
    with trace.open() as handle:
        document = json.load(handle)
    return sum(1 for event in document["traceEvents"] if str(event.get("name")).startswith("ProfilerStep#"))


@pytest.mark.parametrize("which", ["generated_run", "own_script_run"])
def test_every_rank_writes_one_trace_of_the_ten_steps(which: str, request: pytest.FixtureRequest) -> None:
    run: RunEnded = request.getfixturevalue(which)
    assert run.code == 0, run.stdout + run.stderr
    for rank, found in traces(run).items():
        assert len(found) == 1, (rank, found)
        assert recorded_steps(found[0]) == 10, rank


@pytest.mark.parametrize("which", ["generated_run", "own_script_run"])
def test_the_summary_says_where_the_traces_are(which: str, request: pytest.FixtureRequest) -> None:
    run: RunEnded = request.getfixturevalue(which)
    line = f"profile: rank 0, 1 recorded steps 21-30; traces in {run.run_dir / 'profile'} "
    assert line in run.stdout
    summary = json.loads((run.run_dir / "summary.json").read_text())
    windows = summary["profile"]["windows"]
    assert sorted((w["rank"], w["first"], w["last"], w["outcome"]) for w in windows) == [
        (rank, 20, 30, "recorded") for rank in range(RANKS)
    ]


def test_the_report_sums_up_each_profiled_rank(generated_run: RunEnded) -> None:
    page = (generated_run.run_dir / "report.html").read_text()
    section = page[page.index("<h2>Profile</h2>") :]
    for rank in range(RANKS):
        assert f"<h3>Rank {rank}</h3>" in section
    assert section.count('<p class="meta">10 step(s) recorded') == RANKS
    for category in ("compute", "communication", "data wait", "idle"):
        assert f"<tr><td>{category}</td>" in section
    assert "top 10 operators by self time" in section and "aten::" in section
