"""A user's env:// DDP script shaped like nanoGPT's train.py: it resumes only when told to.

It knows nothing of npu-wizard (no report hook). Rank 0 saves {"model", "step"} to
--out-dir/ckpt.pt every --save-every steps (written aside, then renamed). With
--init_from=resume every rank loads that file and goes on from its step; without it
the script starts from step 0 whatever is there, as nanoGPT's does. Each rank prints
its arguments and NPU_WIZARD_ATTEMPT / NPU_WIZARD_RESUMING at its start.
"""

import argparse
import os
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP


def main() -> None:
    parser = argparse.ArgumentParser(description="a nanoGPT-shaped DDP script")
    parser.add_argument("--init_from", choices=("scratch", "resume"), default="scratch")
    parser.add_argument("--steps", type=int, default=64)
    parser.add_argument("--save-every", type=int, default=8)
    parser.add_argument("--step-s", type=float, default=0.05)
    parser.add_argument("--out-dir", default="out")
    parser.add_argument("--tag", default="")
    args = parser.parse_args()
    dist.init_process_group(backend="gloo")
    rank = dist.get_rank()
    attempt, resuming = os.environ.get("NPU_WIZARD_ATTEMPT"), os.environ.get("NPU_WIZARD_RESUMING")
    print(f"[rank {rank}] argv {sys.argv[1:]} attempt {attempt} resuming {resuming}", flush=True)
    out = Path(args.out_dir)
    out.mkdir(exist_ok=True)
    torch.manual_seed(0)
    model = DDP(torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4)))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    step = 0
    if args.init_from == "resume":
        state = torch.load(out / "ckpt.pt", weights_only=True)
        model.module.load_state_dict(state["model"])
        step = state["step"]
        print(f"[rank {rank}] resumed at step {step}", flush=True)
    while step < args.steps:
        inputs, targets = torch.randn(8, 16), torch.randint(0, 4, (8,))
        optimizer.zero_grad()
        F.cross_entropy(model(inputs), targets).backward()
        optimizer.step()
        step += 1
        time.sleep(args.step_s)
        if rank == 0 and step % args.save_every == 0:
            aside = out / f".ckpt.pt.{os.getpid()}"
            torch.save({"model": model.module.state_dict(), "step": step}, aside)
            aside.rename(out / "ckpt.pt")
    print(f"[rank {rank}] finished at step {step}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
