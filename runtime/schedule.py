"""The learning rate per step: the linear scaling rule with a gradual warmup, then flat or a cosine.

Goyal et al. (2017, "Accurate, Large Minibatch SGD") scale the single-card
rate with the global batch and ramp up to it linearly over the first epochs
(5 in their ImageNet runs): a large global batch would otherwise start at many
times the rate the model was tuned for. After the warmup the rate stays flat,
or falls along a half cosine to `min_lr` at the run's last step (Loshchilov and
Hutter 2017, SGDR; the usual schedule of language models). The rate is a
function of the step alone, so a run resumed from a checkpoint continues on the
same curve.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import torch

GOYAL_WARMUP_EPOCHS = 5


@dataclass(frozen=True)
class LinearWarmup:
    """From `start_lr` at step 0 linearly to `target_lr` at `warmup_steps`, then flat or a cosine to `min_lr`."""

    start_lr: float
    target_lr: float
    warmup_steps: int
    # the step the cosine reaches min_lr at; 0: no cosine, the rate stays flat
    cosine_until: int = 0
    min_lr: float = 0.0

    @classmethod
    def scaled(
        cls, base_lr: float, target_lr: float, warmup_epochs: int, steps_per_epoch: int
    ) -> LinearWarmup:
        """Warm up from the single-card rate when scaling raised it; no warmup otherwise."""
        if target_lr <= base_lr or warmup_epochs <= 0:
            return cls(target_lr, target_lr, 0)
        return cls(base_lr, target_lr, warmup_epochs * steps_per_epoch)

    def with_cosine(self, total_steps: int, min_lr: float) -> LinearWarmup:
        """The same warmup, then a half cosine from the target rate down to `min_lr` at `total_steps`."""
        return replace(self, cosine_until=total_steps, min_lr=min_lr)

    def lr_at(self, step: int) -> float:
        """The rate for the step after `step` steps have been taken."""
        if step >= self.warmup_steps and self.cosine_until > self.warmup_steps:
            done = min(step - self.warmup_steps, self.cosine_until - self.warmup_steps)
            progress = done / (self.cosine_until - self.warmup_steps)
            return self.min_lr + (self.target_lr - self.min_lr) * 0.5 * (
                1 + math.cos(math.pi * progress)
            )
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
        """One line for the log: the ramp, or the constant rate, and the cosine after it."""
        if self.cosine_until:
            ramp = (
                f"{self.start_lr:g} -> {self.target_lr:g} over {self.warmup_steps} steps, then "
                if self.warmup_steps
                else ""
            )
            return (
                f"learning rate {ramp}a cosine from {self.target_lr:g} down to {self.min_lr:g} "
                f"at step {self.cosine_until}"
            )
        if self.warmup_steps == 0:
            return f"learning rate {self.target_lr:g} from the first step (no warmup)"
        return (
            f"learning rate warmup: {self.start_lr:g} -> {self.target_lr:g} linearly over the "
            f"first {self.warmup_steps} steps (Goyal et al. 2017), then {self.target_lr:g}"
        )
