"""A language model's own figures, folded from its events: tokens per second, MFU and the validation loss.

The generated train.py of `training.model: gpt` adds to each logging-interval step event `tokens_per_s` (the
job's tokens per second, as that rank timed the window) and, where the device's peak is known, `mfu` (model
FLOPs utilisation, a fraction of the peak); every `training.eval_every` steps it writes an `eval` event with
the validation loss, already averaged over the ranks. Every rank writes the same figures, so one rank is
followed: the lowest that sent them (a lower one met later takes over). Runs of other models and users'
scripts send none: then nothing here is shown, said or written.

Memory is bounded, as the rest of the monitor's model: the newest WINDOWS_KEPT windows, the newest
EVALUATIONS_KEPT evaluations, and the best evaluation of the whole run.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from statistics import median
from typing import Any

from wizard.monitor.values import is_step, number

WINDOWS_KEPT = 4096  # logging windows whose tokens/s and MFU the summary's medians are taken over
EVALUATIONS_KEPT = 4096  # validation losses kept for the report's plot


@dataclass(frozen=True)
class Evaluation:
    """One validation loss, after `step` optimizer steps; `time` is when the rank wrote it (its own clock)."""

    step: int
    val_loss: float
    time: float

    def as_dict(self) -> dict[str, Any]:
        """The step and the loss, as summary.json keeps them."""
        return {"step": self.step, "val_loss": self.val_loss}


class LanguageModelFigures:
    """The job's tokens per second, MFU and validation losses; empty for a run that sends none."""

    def __init__(self) -> None:
        self.tokens_per_s: float | None = None  # the newest window's: the whole job's tokens per second
        self.mfu: float | None = None  # the newest window's, a fraction of one device's peak
        self.best: Evaluation | None = None  # the lowest validation loss of the run
        self._tokens: deque[float] = deque(maxlen=WINDOWS_KEPT)
        self._mfus: deque[float] = deque(maxlen=WINDOWS_KEPT)
        self._evaluations: deque[Evaluation] = deque(maxlen=EVALUATIONS_KEPT)
        self._window_rank: int | None = None  # the rank whose windows are kept
        self._window_step: object = None  # the step of its newest window, as the event said it
        self._eval_rank: int | None = None  # the rank whose evaluations are kept

    def step_done(self, event: dict) -> None:
        """Keep a step event's tokens_per_s and mfu, when it has them and comes from the rank followed."""
        rank, tokens, step = _rank(event), number(event.get("tokens_per_s")), event.get("step")
        if rank is None or tokens is None or tokens < 0 or _above(rank, self._window_rank):
            return
        if rank != self._window_rank:  # the lowest rank yet: its windows alone count from now
            self._window_rank = rank
            self._tokens.clear()
            self._mfus.clear()
        elif is_step(step) and step == self._window_step:
            return  # the newest window again (the report reads a rank's last step twice)
        self._window_step = step
        mfu = number(event.get("mfu"))
        self.tokens_per_s, self.mfu = tokens, mfu if mfu is not None and mfu >= 0 else None
        self._tokens.append(tokens)
        if self.mfu is not None:
            self._mfus.append(self.mfu)

    def evaluated(self, event: dict) -> None:
        """Keep an eval event's validation loss, when it is a finite number from the rank followed."""
        rank, step, val_loss, at = (
            _rank(event),
            event.get("step"),
            number(event.get("val_loss")),
            number(event.get("time")),
        )
        if rank is None or not is_step(step) or val_loss is None or at is None or _above(rank, self._eval_rank):
            return
        if rank != self._eval_rank:  # the lowest rank yet: its evaluations alone count from now
            self._eval_rank = rank
            self._evaluations.clear()
            self.best = None
        evaluation = Evaluation(step, val_loss, at)  # type: ignore[arg-type]  # is_step: an int
        self._evaluations.append(evaluation)
        if self.best is None or val_loss < self.best.val_loss:
            self.best = evaluation

    @property
    def last_eval(self) -> Evaluation | None:
        """The newest validation loss, or None before the first."""
        return self._evaluations[-1] if self._evaluations else None

    def evaluations(self) -> list[Evaluation]:
        """The validation losses kept, oldest first."""
        return list(self._evaluations)

    def summary(self) -> dict[str, Any] | None:
        """summary.json's `language_model`: median tokens/s and MFU, the last and best validation loss; else None."""
        if not self._tokens and not self._evaluations:
            return None
        last, best = self.last_eval, self.best
        return {
            "tokens_per_s": median(self._tokens) if self._tokens else None,
            "mfu": median(self._mfus) if self._mfus else None,
            "windows": len(self._tokens),
            "last_eval": None if last is None else last.as_dict(),
            "best_eval": None if best is None else best.as_dict(),
        }


def _rank(event: dict) -> int | None:
    """The rank an event names, where it is one."""
    rank = event.get("rank")
    return rank if is_step(rank) and rank >= 0 else None  # type: ignore[operator]


def _above(rank: int, followed: int | None) -> bool:
    """Whether `rank` is above the rank followed: its figures repeat that rank's, and are passed over."""
    return followed is not None and rank > followed


def rate_words(figures: LanguageModelFigures) -> list[str]:
    """`25,600 tokens/s` and `MFU 42.0%` of the newest window, those the run sent."""
    said = []
    if figures.tokens_per_s is not None:
        said.append(f"{figures.tokens_per_s:,.0f} tokens/s")
    if figures.mfu is not None:
        said.append(f"MFU {figures.mfu:.1%}")
    return said


def evaluation_words(figures: LanguageModelFigures) -> str | None:
    """`val loss 2.3456 at step 400` for the newest validation loss; None before the first."""
    last = figures.last_eval
    return None if last is None else f"val loss {last.val_loss:.4f} at step {last.step}"


def median_words(windows: int | None) -> str:
    """What the summary's tokens/s and MFU are: `median of 12 logged windows`."""
    if windows == 1:
        return "its one logged window"
    return f"median of {windows} logged windows" if windows else "median of the logged windows"


def summary_lines(language_model: dict[str, Any] | None) -> list[str]:
    """The end summary's lines for summary.json's `language_model` (none for a run without it)."""
    if not language_model:
        return []
    lines = []
    tokens, mfu, windows = (language_model.get(key) for key in ("tokens_per_s", "mfu", "windows"))
    if tokens is not None:
        lines.append(f"tokens/s {tokens:,.0f} ({median_words(windows)})" + ("" if mfu is None else f", MFU {mfu:.1%}"))
    last, best = language_model.get("last_eval"), language_model.get("best_eval")
    if last:
        line = f"validation loss {last['val_loss']:.4f} at step {last['step']}"
        if best and best != last:
            line += f", best {best['val_loss']:.4f} at step {best['step']}"
        lines.append(line)
    return lines
