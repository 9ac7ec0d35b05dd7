"""Validation on a held-out split for the datasets without val.bin (issue 38), in a real 1 x 2 CPU run.

The synthetic dataset with training.eval_every: a seeded tenth of its samples
is held out, never trained on, and every eval_every steps each rank measures
the loss on its part of them; the ranks report one averaged figure through the
same eval events as the gpt's val.bin loss.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.runs import events_of, kinds, render_cpu, run_project

pytestmark = pytest.mark.slow

EVAL_EVERY = 8


def test_the_synthetic_dataset_validates_on_its_held_out_tenth_every_eval_every_steps(tmp_path: Path) -> None:
    # 1024 samples: 102 held out (51 a rank, 3 batches of 16), 922 trained on (28 batches a rank, 2 epochs)
    project = render_cpu(tmp_path, "torchrun", eval_every=EVAL_EVERY)
    for node, (code, output) in enumerate(run_project(project, tmp_path / "run")):
        assert code == 0, f"node {node} exited {code}:\n{output[-3000:]}"
    found = events_of(tmp_path / "run")
    steps = kinds(found[0], "step")
    assert steps[-1]["step"] == 56 and kinds(found[0], "started")[0]["total_steps"] == 56  # not 64: a tenth held out
    evals = {rank: [(event["step"], event["val_loss"]) for event in kinds(found[rank], "eval")] for rank in (0, 1)}
    assert [step for step, _ in evals[0]] == list(range(EVAL_EVERY, 57, EVAL_EVERY))
    assert evals[0] == evals[1]  # one figure, averaged over both ranks' parts
    assert evals[0][-1][1] < evals[0][0][1]  # the model generalises to samples it never saw
    log = (tmp_path / "run" / "logs" / "rank-0.log").read_text()
    assert f"step {EVAL_EVERY}: validation loss" in log
    assert "VAL_FRACTION = 0.1" in (project / "train.py").read_text()
