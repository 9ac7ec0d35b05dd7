"""Every benchmark in benchmarks/ runs for real at tiny sizes (`--smoke`), so that none can rot unseen.

Each script is started as a subprocess, as a user starts it, and must exit 0
printing its figures and the line that compares them with its baseline or
target. The figures of a tiny run mean nothing; that they are printed at all
is the point. benchmarks/cluster_deepspeed.py is no script of its own: it is
the DeepSpeed line of cluster_start.py, which says why it skipped that line
where DeepSpeed or pdsh is missing. render_vs_accelerate.py times
`accelerate` only where the `bench` extra installed it; without it the smoke
run covers npu-wizard's side and says that no ratio was taken.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.slurm_cluster import have_slurm
from tests.ssh_hosts import have_ssh_hosts

ROOT = Path(__file__).resolve().parent.parent
BENCHMARKS = ROOT / "benchmarks"
LIBRARIES = {"cluster_deepspeed.py"}
"""Modules other benchmarks import, smoke-run through them."""
RUN_BY = {"baseline_huawei_ddp_sample.py": "training_throughput.py"}
"""Scripts another benchmark's smoke run runs to the end: training_throughput.py runs the baseline with 2
processes and with 1, checks its exit code and reads the times it printed (too few fail the run). A smoke
run of its own repeated that (an mp.spawn job of two workers, each with a DataLoader worker: 290 s of a
loaded suite)."""

SMOKE_RUNS: dict[str, tuple[list[str], list[str]]] = {
    "training_throughput.py": (
        ["--smoke"],
        [
            "generated project (torchrun), 2 proc",
            "Huawei DDP sample (mp.spawn), 2 proc",
            "bare loop (the ceiling), 1 proc",
            "generated / sample, 2 processes",
            "generated / sample, 1 process",
            "time inside the recorder calls, in the loop",
        ],
    ),
    "compile_throughput.py": (
        ["--smoke"],
        [
            "first epoch of generated loop, compile default:",
            "bare eager loop (the baseline):",
            "generated loop, compile off:",
            "generated loop, compile default:",
            "x bare eager",
        ],
    ),
    "gpt_throughput.py": (
        ["--smoke"],
        [
            "generated loop (train.py Trainer)",
            "bare loop (same model, AdamW)",
            "generated / bare, ratio of medians",
            "at least 0.97x: ",
        ],
    ),
    "monitor_overhead.py": (
        ["--smoke"],
        ["throughput without monitor:", "throughput with monitor:", "target >= 98%", "monitor (npu-wizard run):"],
    ),
    "report_hook_overhead.py": (
        ["--smoke"],
        ["CPU demo step, bare loop:", "report.step per call", "the < 2% target", "A/A noise floor"],
    ),
    "render_scale.py": (["--smoke"], ["baseline: the 8-node render", "bytes per added node:", "16 nodes: "]),
    "render_vs_accelerate.py": (["--smoke"], ["npu-wizard --answers cpu-demo.yaml: median", "without its template"]),
    "status_stream_scale.py": (
        ["--smoke"],
        ["baseline: unbounded history", "bounded history (256 points)", "bounded phase: none lost"],
    ),
    "report_scale.py": (["--smoke"], ["report wall", "peak RSS", "32 ranks under 10 s and 200 MiB:"]),
    "profile_overhead.py": (
        ["--smoke"],
        ["trace per window:", "steps after the window: off", "the step that writes the trace", "outside the window:"],
    ),
    "straggler_timing_cost.py": (
        ["--smoke"],
        ["timer's own calls per step (CPU time)", "the < 1% goal", "A/B, CPU time, median of pairs", "A/B, wall time"],
    ),
    "recorder_cost.py": (
        ["--smoke"],
        ["step, recorder off (median, CPU time)", "collectives recorded per trial (on)", "A/B, CPU time, median"],
    ),
    "straggler_uniform_runs.py": (["--smoke"], ["run 1: ", "rank-windows >= 15% above", "uniform runs with a flag:"]),
    "bandwidth_quiet_runs.py": (["--smoke"], ["run 1: slowest node ", "quiet loopback runs that named a slow link: "]),
    "preemption_flag.py": (
        ["--smoke"],
        ["window with the stop check", "window without it", "the check alone (all_reduce)"],
    ),
    "suite_bytecode.py": (
        ["--smoke"],
        ["a render in a fresh process: baseline (no bytecode)", "a collection (not slow): baseline", "CPU s saved"],
    ),
    "cli_forks.py": (
        ["--smoke"],
        ["3 renders of examples/cpu-demo.yaml", "subprocess", "forked from the server: ", "CPU s saved: "],
    ),
    "suite_gc.py": (
        ["--smoke"],
        ["round 1: baseline", "round 1: tuned", "baseline (Python's defaults, ", "objects frozen", "CPU s saved: "],
    ),
    "suite_costs.py": (
        ["--smoke"],
        ["tests, ", "test-seconds of wall time", "in the test processes", "costliest files", "test_port_docs.py"],
    ),
    "tui_startup.py": (["--smoke"], ["bare Textual app (1 Label)", "npu-wizard first screen", "to a bare app"]),
    "ssh_copy_history.py": (
        ["--smoke"],
        ["before (whole folder, .git included", "after (what a rank needs", "after / before: "],
    ),
    "restart_time.py": (
        ["--smoke"],
        [
            "npu-wizard run --restarts 1 (manual engine): ",
            "by hand with torchrun (stop, find the checkpoint",
            "--restarts / by hand (manual engine): ",
        ],
    ),
    "cluster_start.py": (
        ["--smoke"],
        ["vs manual engine (1 host)", "ssh engine vs deepspeed pdsh: skipped: ", "vs plain sbatch"],
    ),
}


def test_every_benchmark_has_a_smoke_run() -> None:
    scripts = {path.name for path in BENCHMARKS.glob("*.py")} - LIBRARIES - set(RUN_BY)
    assert scripts == set(SMOKE_RUNS)
    for script, runner in RUN_BY.items():
        assert runner in SMOKE_RUNS and f'"{script}"' in (BENCHMARKS / runner).read_text(), (script, runner)


def smoke(script: str) -> str:
    """Run one benchmark at its tiny size; its output, after checking that it exited 0."""
    arguments, _ = SMOKE_RUNS[script]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    result = subprocess.run(
        [sys.executable, str(BENCHMARKS / script), *arguments],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=1500,
    )
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-6000:]
    return output


ON_HOSTS = {"cluster_start.py", "ssh_copy_history.py"}
"""Benchmarks that need the ssh hosts (root, sshd): smoke-run below, skipped without them."""


@pytest.mark.slow  # most start training processes; all of them run for seconds to minutes
@pytest.mark.parametrize("script", sorted(set(SMOKE_RUNS) - ON_HOSTS - {"render_vs_accelerate.py"}))
def test_the_benchmark_runs_and_prints_its_figures(script: str) -> None:
    output = smoke(script)
    for figure in SMOKE_RUNS[script][1]:
        assert figure in output, output[-6000:]


def test_render_vs_accelerate_times_npu_wizard_and_compares_where_accelerate_is() -> None:
    output = smoke("render_vs_accelerate.py")
    for figure in SMOKE_RUNS["render_vs_accelerate.py"][1]:
        assert figure in output, output
    if shutil.which("accelerate", path=str(Path(sys.executable).parent)) or shutil.which("accelerate"):
        assert "ratio: npu-wizard is " in output, output
    else:
        assert "accelerate config default: not timed, accelerate is not installed" in output, output


@pytest.mark.slow
@pytest.mark.skipif(
    not (have_ssh_hosts() and have_slurm()),
    reason="needs root, sshd, ssh, rsync, ip, slurm-wlm and munge (.ci/run installs them)",
)
def test_cluster_start_runs_on_the_ssh_hosts_and_the_slurm_cluster() -> None:
    output = smoke("cluster_start.py")
    for figure in SMOKE_RUNS["cluster_start.py"][1]:
        assert figure in output, output


@pytest.mark.slow
@pytest.mark.skipif(not have_ssh_hosts(), reason="needs root, sshd, ssh, rsync and ip (.ci/run installs them)")
def test_the_copy_with_a_big_history_is_timed_before_and_after_on_the_ssh_hosts() -> None:
    output = smoke("ssh_copy_history.py")
    for figure in SMOKE_RUNS["ssh_copy_history.py"][1]:
        assert figure in output, output
