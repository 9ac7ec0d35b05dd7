"""ddp_tutorial.py with the report calls a user adds for steps, loss and checkpoints in npu-wizard's monitor.

The launcher sets RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT (env://); the
script builds its model, data and loop itself. `--fail-rank R` makes rank R
raise after its first epoch, as a bug in a user's code would.
"""

import argparse

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler

from runtime import report


def ddp_setup() -> None:
    dist.init_process_group(backend="gloo")


class Trainer:
    def __init__(self, model: torch.nn.Module, loader: DataLoader, rank: int, checkpoint_dir: str) -> None:
        self.rank = rank
        self.checkpoint_dir = checkpoint_dir
        self.loader = loader
        self.model = DDP(model)
        self.step = 0
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
            self.step += 1
            report.step(self.step, loss=loss, samples=len(inputs), total_steps=len(self.loader) * self.epochs)
        return loss.item()

    def train(self, epochs: int, fail_rank: int) -> None:
        self.epochs = epochs
        for epoch in range(epochs):
            loss = self._run_epoch(epoch)
            if self.rank == 0:
                path = f"{self.checkpoint_dir}/epoch-{epoch}.pt"
                torch.save(self.model.module.state_dict(), path)
                report.checkpoint(self.step, path)
            print(f"[rank {self.rank}] epoch {epoch} loss {loss:.4f}", flush=True)
            if self.rank == fail_rank:
                raise RuntimeError(f"rank {self.rank}: the loss went wrong after epoch {epoch}")


def main() -> None:
    parser = argparse.ArgumentParser(description="a user's DDP script")
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--fail-rank", type=int, default=-1)
    parser.add_argument("--checkpoint-dir", default=".")
    args = parser.parse_args()
    ddp_setup()
    rank = dist.get_rank()
    torch.manual_seed(0)
    dataset = TensorDataset(torch.randn(256, 32), torch.randint(0, 4, (256,)))
    loader = DataLoader(dataset, batch_size=16, sampler=DistributedSampler(dataset))
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 4))
    Trainer(model, loader, rank, args.checkpoint_dir).train(args.epochs, args.fail_rank)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
