"""The smoke test (`--smoke`): every rank of a 2-node CPU project does one all_reduce and one barrier.

Each launcher's scripts run for real, both nodes at once on loopback, with
`--smoke` passed through to train.py; the ranks must agree on the sum and
the per-rank report must say so. Two nodes of one process each show a
launcher's scripts passing --smoke on and its ranks meeting across nodes;
torchrun's smoke, started by `npu-wizard run --smoke`, has two processes a
node, and the per-rank report of all four (each launcher numbers two local
ranks a node as test_training_runs checks). A wrong sum is made for real
too: a rank told the world is bigger than its process group.
"""

from __future__ import annotations

import datetime
import io
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from runtime.distributed import RankInfo
from runtime.events import EventWriter, read_events
from runtime.smoke import SmokeError, expected_sum, run_smoke
from tests.runs import free_port, node_env, render_cpu, run_dirs, wait_nodes
from wizard.run.smoke import print_smoke_report, smoke_lines

# torchrun's is test_npu_wizard_run_smoke_prints_the_per_rank_report's run
LAUNCHERS = ("shell", "mp-spawn", "torch-launch", "torch-npu-run")


def start_smoke(project: Path, run_dir: Path) -> list[subprocess.Popen[bytes]]:
    """Start every node's launch script at once with --smoke."""
    return [
        subprocess.Popen(
            ["bash", str(script), "--smoke"],
            env=node_env(run_dir),
            start_new_session=True,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
        )
        for script in sorted((project / "launch").glob("node*.sh"))
    ]


def assert_every_rank_agreed(project: Path, run_dir: Path, output: str, per_node: int) -> None:
    """Both nodes' `per_node` ranks said and recorded the right sum; nothing trained; the report says ok."""
    world = 2 * per_node
    for rank in range(world):
        assert f"smoke rank {rank}/{world} (node {rank // per_node}," in output
    events = read_events(run_dir)
    smokes = {rank: [e for e in found if e["event"] == "smoke"] for rank, found in events.items()}
    assert sorted(smokes) == list(range(world))
    for rank, (event,) in smokes.items():
        want = expected_sum(world)
        assert (event["node"], event["expected"], event["got"], event["ok"]) == (rank // per_node, want, want, True)
        assert event["device"] == "cpu" and event["seconds"] >= 0
    assert not any(e["event"] == "step" for found in events.values() for e in found), "no training in a smoke run"
    assert not (project / "checkpoints").exists()
    lines, ok = smoke_lines(events, world)
    assert ok and lines[0].startswith(f"smoke ok: {world}/{world} ranks on 2 node(s) agree on the all_reduce")


@pytest.mark.slow
@pytest.mark.parametrize("launcher", LAUNCHERS)
def test_every_rank_of_two_nodes_agrees_on_the_all_reduce(launcher: str, tmp_path: Path) -> None:
    project = render_cpu(tmp_path, launcher, nodes=2, devices_per_node=1)
    run_dir = tmp_path / "run"
    results = wait_nodes(start_smoke(project, run_dir), timeout=120)
    for code, output in results:
        assert code == 0, output
    assert_every_rank_agreed(project, run_dir, "".join(out for _, out in results), per_node=1)


@pytest.mark.slow
def test_npu_wizard_run_smoke_prints_the_per_rank_report(tmp_path: Path) -> None:
    # torchrun's smoke of two nodes of two processes: the launch scripts run as `npu-wizard run` starts them
    project = render_cpu(tmp_path, "torchrun", nodes=2)
    result = subprocess.run(
        [sys.executable, "-m", "wizard", "run", str(project), "--smoke", "--interval", "5"],
        env=node_env(tmp_path / "unused"),
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "smoke ok: 4/4 ranks on 2 node(s)" in result.stdout
    for rank in range(4):
        assert f"  rank   {rank}  node {rank // 2}  " in result.stdout
    (run_dir,) = run_dirs(project)
    # each node's script writes what it printed (the ranks' smoke lines with it) into its log
    output = "".join((run_dir / "logs" / f"node-{node}.log").read_text() for node in (0, 1))
    assert_every_rank_agreed(project, run_dir, output, per_node=2)


def test_a_rank_that_disagrees_about_the_world_fails_with_the_sums(tmp_path: Path) -> None:
    # a real one-process gloo group, while the rank believes the world has two ranks
    dist.init_process_group(
        "gloo",
        init_method=f"tcp://127.0.0.1:{free_port()}",
        rank=0,
        world_size=1,
        timeout=datetime.timedelta(seconds=30),
    )
    believed = RankInfo(rank=0, local_rank=0, world_size=2, local_world_size=1, node_rank=0, launcher="shell")
    recorder = EventWriter(tmp_path, 0)
    try:
        with pytest.raises(SmokeError, match="gave 1, expected 3"):
            run_smoke(believed, torch.device("cpu"), recorder)
    finally:
        recorder.close()
        dist.destroy_process_group()
    (event,) = [e for e in read_events(tmp_path)[0] if e["event"] == "smoke"]
    assert (event["expected"], event["got"], event["ok"]) == (3, 1, False)
    out = io.StringIO()
    assert print_smoke_report(tmp_path, 2, out) is False
    assert out.getvalue().splitlines()[0].startswith("smoke FAILED: 0/2 ranks")
    assert "rank 1: no events here (other nodes keep their own)" in out.getvalue()


def test_the_expected_sum_is_rank_plus_one_over_the_world() -> None:
    assert [expected_sum(n) for n in (1, 2, 4, 128)] == [1, 3, 10, 8256]


def test_the_report_names_ranks_that_started_but_never_reported() -> None:
    events = {
        0: [{"event": "smoke", "node": 0, "host": "h", "device": "cpu", "expected": 3, "got": 3, "ok": True}],
        1: [{"event": "started"}],
    }
    lines, ok = smoke_lines(events, 2)
    assert not ok
    assert lines == [
        "smoke FAILED: 1/2 ranks on 1 node(s) agree on the all_reduce and passed the barrier (slowest 0.000s)",
        "  rank   0  node 0  h  cpu  all_reduce 3/3 ok  0.000s",
        "  rank 1: started but wrote no smoke result (see their logs)",
    ]
