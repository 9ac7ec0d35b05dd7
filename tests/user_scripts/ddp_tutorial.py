"""A user's own DDP training script, written as the PyTorch DDP tutorial teaches (no npu-wizard import).

The launcher sets RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT (env://); the
script builds its model, data and loop itself. `--fail-rank R` makes rank R
raise after its first epoch, as a bug in a user's code would. `--end-with os._exit`
ends every rank with os._exit(0) after its last step, as scripts do that must
not wait for their data workers or a library's exit handlers; `--end-with
libc._exit` with the C library's _exit(0), as native code may, which no Python
code sees.
"""

import argparse
import ctypes
import os

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler


def ddp_setup() -> None:
    dist.init_process_group(backend="gloo")


class Trainer:
    def __init__(self, model: torch.nn.Module, loader: DataLoader, rank: int) -> None:
        self.rank = rank
        self.loader = loader
        self.model = DDP(model)
        self.optimizer = torch.optim.SGD(self.model.parameters(), lr=0.1)

    def _run_batch(self, inputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        self.optimizer.zero_grad()
        loss = F.cross_entropy(self.model(inputs), targets)
        loss.backward()
        self.optimizer.step()
        return loss

    def _run_epoch(self, epoch: int) -> float:
        self.loader.sampler.set_epoch(epoch)
        for inputs, targets in self.loader:
            loss = self._run_batch(inputs, targets)
        return loss.item()

    def train(self, epochs: int, fail_rank: int) -> None:
        for epoch in range(epochs):
            loss = self._run_epoch(epoch)
            print(f"[rank {self.rank}] epoch {epoch} loss {loss:.4f}", flush=True)
            if self.rank == fail_rank:
                raise RuntimeError(f"rank {self.rank}: the loss went wrong after epoch {epoch}")


def main() -> None:
    parser = argparse.ArgumentParser(description="a user's DDP script")
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--fail-rank", type=int, default=-1)
    parser.add_argument("--end-with", choices=["return", "os._exit", "libc._exit"], default="return")
    args = parser.parse_args()
    ddp_setup()
    rank = dist.get_rank()
    torch.manual_seed(0)
    dataset = TensorDataset(torch.randn(256, 32), torch.randint(0, 4, (256,)))
    loader = DataLoader(dataset, batch_size=16, sampler=DistributedSampler(dataset))
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 4))
    Trainer(model, loader, rank).train(args.epochs, args.fail_rank)
    dist.destroy_process_group()
    if args.end_with == "os._exit":
        os._exit(0)
    if args.end_with == "libc._exit":
        ctypes.CDLL(None)._exit(0)


if __name__ == "__main__":
    main()
