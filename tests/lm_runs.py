"""Run folders of a language model and of an image model, written as the generated train.py writes them.

Both use runtime/events.py's EventWriter with the calls the generated train.py makes: for `training.model: gpt`
every rank's logging-interval `step_done` carries the job's `tokens_per_s` and `mfu`, and every rank writes the
same validation loss with `evaluated`; an image model's steps carry neither and it never evaluates.
"""

from __future__ import annotations

from pathlib import Path

from runtime.events import EventWriter

BLOCK_SIZE = 64
LOGGED_STEPS = (10, 20, 30)
# rank 0's windows: the first holds the start-up; rank 1 timed each window a little slower
TOKENS_PER_S = (20_000.0, 25_600.0, 25_800.0)
MFU = (0.30, 0.42, 0.43)
VAL_LOSS = (3.0, 2.5, 2.6)  # the best is not the last


def gpt_run(run_dir: Path, *, finished: bool = True) -> Path:
    """Two ranks of a GPT run that logged steps 10, 20 and 30 of 40 and evaluated at each."""
    for rank in (0, 1):
        writer = EventWriter(run_dir, rank)
        writer.started(local_rank=rank, node=0, device=f"npu:{rank}", world_size=2, total_steps=40)
        for index, step in enumerate(LOGGED_STEPS):
            tokens = TOKENS_PER_S[index] + 100 * rank
            writer.step_done(
                step=step,
                epoch=0,
                loss=3.2 - index / 10,
                samples_per_s=tokens / BLOCK_SIZE,
                lr=3e-4,
                data_s=0.001,
                forward_s=0.01,
                tokens_per_s=tokens,
                mfu=MFU[index] + rank / 1000,
            )
            writer.evaluated(step=step, val_loss=VAL_LOSS[index])
        if finished:
            writer.finished()
        writer.close()
    return run_dir


def image_run(run_dir: Path) -> Path:
    """Two ranks of an image model's run: the same steps, without tokens/s, MFU or evaluations."""
    for rank in (0, 1):
        writer = EventWriter(run_dir, rank)
        writer.started(local_rank=rank, node=0, device=f"npu:{rank}", world_size=2, total_steps=40)
        for index, step in enumerate(LOGGED_STEPS):
            writer.step_done(step=step, epoch=0, loss=1.0 - index / 10, samples_per_s=400.0, lr=0.1)
        writer.finished()
        writer.close()
    return run_dir
