"""The learning rate per step: the linear scaling rule with a gradual warmup.

Goyal et al. (2017, "Accurate, Large Minibatch SGD") scale the single-card
rate with the global batch and ramp up to it linearly over the first epochs
(5 in their ImageNet runs): a large global batch would otherwise start at many
times the rate the model was tuned for. The rate is a function of the step
alone, so a run resumed from a checkpoint continues on the same curve.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

GOYAL_WARMUP_EPOCHS = 5


@dataclass(frozen=True)
class LinearWarmup:
    """From `start_lr` at step 0 linearly to `target_lr` at `warmup_steps`, then flat."""

    start_lr: float
    target_lr: float
    warmup_steps: int

    @classmethod
    def scaled(
        cls, base_lr: float, target_lr: float, warmup_epochs: int, steps_per_epoch: int
    ) -> LinearWarmup:
        """Warm up from the single-card rate when scaling raised it; no warmup otherwise."""
        if target_lr <= base_lr or warmup_epochs <= 0:
            return cls(target_lr, target_lr, 0)
        return cls(base_lr, target_lr, warmup_epochs * steps_per_epoch)

    def lr_at(self, step: int) -> float:
        """The rate for the step after `step` steps have been taken."""
        if step >= self.warmup_steps:
            return self.target_lr
        return (
            self.start_lr + (self.target_lr - self.start_lr) * step / self.warmup_steps
        )

    def apply(self, optimizer: torch.optim.Optimizer, step: int) -> float:
        """Set the rate for the coming step on every parameter group; return it."""
        lr = self.lr_at(step)
        for group in optimizer.param_groups:
            group["lr"] = lr
        return lr

    def describe(self) -> str:
        """One line for the log: the ramp, or the constant rate."""
        if self.warmup_steps == 0:
            return f"learning rate {self.target_lr:g} from the first step (no warmup)"
        return (
            f"learning rate warmup: {self.start_lr:g} -> {self.target_lr:g} linearly over the "
            f"first {self.warmup_steps} steps (Goyal et al. 2017), then {self.target_lr:g}"
        )
