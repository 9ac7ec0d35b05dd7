"""A user's env:// DDP script that saves its own checkpoints and resumes from the newest one.

The launcher sets RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT (env://). Rank 0
saves {"model", "optimizer", "step"} every --save-every steps into --checkpoint-dir
(written aside, then renamed); at its start every rank loads the newest, and its
report.step calls go on from that step, which is how npu-wizard learns where it
resumed. --step-s slows each step, so that a test can act mid-run.
"""

import argparse
import os
import time
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP

from runtime import report


def newest(folder: Path) -> Path | None:
    saved = sorted(folder.glob("own-*.pt"), key=lambda path: int(path.stem.split("-")[1]))
    return saved[-1] if saved else None


def main() -> None:
    parser = argparse.ArgumentParser(description="a user's resuming DDP script")
    parser.add_argument("--steps", type=int, default=96)
    parser.add_argument("--save-every", type=int, default=8)
    parser.add_argument("--step-s", type=float, default=0.05)
    parser.add_argument("--checkpoint-dir", default="own-checkpoints")
    args = parser.parse_args()
    dist.init_process_group(backend="gloo")
    rank = dist.get_rank()
    folder = Path(args.checkpoint_dir)
    folder.mkdir(exist_ok=True)
    torch.manual_seed(0)
    model = DDP(torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4)))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    step = 0
    found = newest(folder)
    if found is not None:
        state = torch.load(found, weights_only=True)
        model.module.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        step = state["step"]
        print(f"[rank {rank}] resumed from {found} at step {step}", flush=True)
    while step < args.steps:
        inputs, targets = torch.randn(8, 16), torch.randint(0, 4, (8,))
        optimizer.zero_grad()
        loss = F.cross_entropy(model(inputs), targets)
        loss.backward()
        optimizer.step()
        step += 1
        report.step(step, loss=loss, samples=len(inputs), total_steps=args.steps)
        time.sleep(args.step_s)
        if rank == 0 and step % args.save_every == 0:
            path = folder / f"own-{step}.pt"
            aside = folder / f".own-{step}.pt.{os.getpid()}"
            torch.save({"model": model.module.state_dict(), "optimizer": optimizer.state_dict(), "step": step}, aside)
            aside.rename(path)
            report.checkpoint(step, path)
    report.flush()
    print(f"[rank {rank}] finished at step {step}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
