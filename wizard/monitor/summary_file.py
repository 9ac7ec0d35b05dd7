"""summary.json as read back by `monitor` and `report`: each figure of the kind it is read as, else left out.

The runner writes it (wizard.monitor.summary_text.summarize), but a run folder is anyone's to write into: a
duration that is a string, a rank list that is a number, a failure that is a list are no figures, and must
not end the monitor or the report in a TypeError. Every reader of the file takes it through `checked`.
"""

from __future__ import annotations

from typing import Any

from wizard.monitor.values import is_rank_key, is_step, is_time, number

TEXT_SHOWN = 16 * 1024  # characters of one text of the file kept (a message, a hint, a log line)
LIST_SHOWN = 65_536  # entries of one list of the file kept (ranks never reported, warnings, log lines)


def checked(summary: dict[str, Any]) -> dict[str, Any]:
    """summary.json with each value the views read of the kind they read it as; a value of another kind is none."""
    ranks, warnings, stragglers = (summary.get(key) for key in ("ranks", "warnings", "stragglers"))
    failure, saved = summary.get("failure"), summary.get("checkpoint")
    return {
        **{key: _time(summary.get(key)) for key in ("started_at", "ended_at", "wall_s", "time_to_first_step_s")},
        **{key: _finite(summary.get(key)) for key in ("samples_per_s", "final_loss")},
        "outcome": _outcome(summary.get("outcome")),
        "world_size": _whole(summary.get("world_size")),
        "steps": _whole(summary.get("steps")),
        "restarts": _whole(summary.get("restarts")) or 0,
        "job_restarts": _whole(summary.get("job_restarts")) or 0,
        "attempts": [_checked_attempt(a) for a in _list(summary.get("attempts")) if isinstance(a, dict)],
        "checkpoint": _checked_checkpoint(saved) if isinstance(saved, dict) else None,
        "preempted": _checked_preempted(summary.get("preempted")),
        "failure": _checked_failure(failure) if isinstance(failure, dict) else None,
        "ranks": {
            str(int(key)): _checked_rank(info)
            for key, info in (ranks.items() if isinstance(ranks, dict) else ())
            if is_rank_key(key) and isinstance(info, dict)
        },
        "warnings": [
            {"ranks": [r for r in _list(w.get("ranks")) if is_step(r)], "message": _text(w.get("message")) or ""}
            for w in _list(warnings)
            if isinstance(w, dict)
        ],
        "stragglers": None
        if stragglers is None
        else [_checked_straggler(s) for s in _list(stragglers) if isinstance(s, dict) and is_time(s.get("start"))],
        "stragglers_not_judged": _text(summary.get("stragglers_not_judged")),
        "never_reported": [rank for rank in _list(summary.get("never_reported")) if is_step(rank)],
        "inferred": summary.get("inferred") is True,
        "hang": _checked_hang(summary.get("hang")),
        "profile": _checked_profile(summary.get("profile")),
        "language_model": _checked_language_model(summary.get("language_model")),
    }


def _checked_language_model(figures: object) -> dict[str, Any] | None:
    """A language model's median tokens/s and MFU and its last and best validation loss, each of its kind."""
    if not isinstance(figures, dict):
        return None
    kept = {
        "tokens_per_s": _finite(figures.get("tokens_per_s")),
        "mfu": _finite(figures.get("mfu")),
        "windows": _count(figures.get("windows")),
        "last_eval": _checked_eval(figures.get("last_eval")),
        "best_eval": _checked_eval(figures.get("best_eval")),
    }
    return kept if any(kept[key] is not None for key in ("tokens_per_s", "mfu", "last_eval")) else None


def _checked_eval(evaluation: object) -> dict[str, Any] | None:
    """One validation loss: a step and a finite loss, else none."""
    if (
        not isinstance(evaluation, dict)
        or not is_step(evaluation.get("step"))
        or _finite(evaluation.get("val_loss")) is None
    ):
        return None
    return {"step": evaluation["step"], "val_loss": evaluation["val_loss"]}


def _checked_profile(profile: Any) -> dict[str, Any] | None:
    """The profile windows recorded and asked for, each with whole step and rank numbers, else left out."""
    if not isinstance(profile, dict):
        return None
    windows = [
        {**{key: window[key] for key in ("rank", "first", "last")}, "path": _text(window.get("path"))}
        for window in _list(profile.get("windows"))
        if isinstance(window, dict) and all(is_step(window.get(key)) for key in ("rank", "first", "last"))
    ]
    asked = [
        {**{key: ask[key] for key in ("straggler", "median", "steps")}, "at": _time(ask.get("at"))}
        for ask in _list(profile.get("asked"))
        if isinstance(ask, dict) and all(is_step(ask.get(key)) for key in ("straggler", "median", "steps"))
    ]
    no_straggler = profile.get("no_straggler") is True
    if not (windows or asked or no_straggler):
        return None
    return {"windows": windows, "asked": asked, **({"no_straggler": True} if no_straggler else {})}


def _checked_hang(hang: object) -> dict[str, Any] | None:
    """The hang verdict (wizard/monitor/hang_verdict.py): its text, groups and files, each of its kind."""
    if not isinstance(hang, dict) or not _text(hang.get("text")):
        return None
    groups = [g for g in _list(hang.get("groups")) if isinstance(g, dict)]
    return {
        "text": _text(hang.get("text")),
        "time": _time(hang.get("time")),
        "folder": _text(hang.get("folder")),
        "recorder": _text(hang.get("recorder")),
        "odd_ones_out": [r for r in _list(hang.get("odd_ones_out")) if is_step(r)],
        "did_not_answer": [r for r in _list(hang.get("did_not_answer")) if is_step(r)],
        "problems": [str(_text(line)) for line in _list(hang.get("problems")) if _text(line)],
        "groups": [
            {
                "ranks": [r for r in _list(g.get("ranks")) if is_step(r)],
                "kind": str(_text(g.get("kind"))),
                "words": _text(g.get("words")) or "",
                "state": _text(g.get("state")),
                "last_collective": _whole(g.get("last_collective")),
                "collective": _plain(g.get("collective"), ("op", "group", "backend"), ("seq", "bytes")),
                "place": _plain(g.get("place"), ("file", "function", "code"), ("line",)),
            }
            for g in groups
        ],
    }


def _plain(value: object, texts: tuple[str, ...], wholes: tuple[str, ...]) -> dict[str, Any] | None:
    if not isinstance(value, dict):
        return None
    return {**{key: _text(value.get(key)) for key in texts}, **{key: _whole(value.get(key)) for key in wholes}}


def _checked_rank(info: dict[str, Any]) -> dict[str, Any]:
    return {
        "node": _whole(info.get("node")),
        "state": _text(info.get("state")) or "?",
        "step": _whole(info.get("step")),
        "loss": _finite(info.get("loss")),
        "samples_per_s": _finite(info.get("samples_per_s")),
        "restarts": _whole(info.get("restarts")) or 0,
        "exit_code": _whole(info.get("exit_code")),
        "steps_reported": info.get("steps_reported") if isinstance(info.get("steps_reported"), bool) else None,
        "printed_s_before_end": _time(info.get("printed_s_before_end")),
    }


def _checked_checkpoint(saved: dict[str, Any]) -> dict[str, Any]:
    return {"rank": _whole(saved.get("rank")), "step": _whole(saved.get("step")), "path": _text(saved.get("path"))}


def _checked_failure(failure: dict[str, Any]) -> dict[str, Any]:
    return {
        "rank": _whole(failure.get("rank")),
        "node": _whole(failure.get("node")),
        "kind": str(_text(failure.get("kind"))),
        "summary": str(_text(failure.get("summary"))),
        "time": _time(failure.get("time")),
        "hint": _text(failure.get("hint")) or None,
        "log_tail": [_text(line) or "" for line in _list(failure.get("log_tail"))],
    }


def _checked_attempt(attempt: dict[str, Any]) -> dict[str, Any]:
    """One attempt of a job run with --restarts (wizard/run/attempts.py)."""
    wholes = ("attempt", "failed_at_step", "resumed_from_step", "steps_lost")
    return {
        **{key: _count(attempt.get(key)) for key in wholes},
        **{key: _text(attempt.get(key)) for key in ("outcome", "cause", "kind", "refused")},
        "failure_to_first_step_s": _time(attempt.get("failure_to_first_step_s")),
    }


def _checked_straggler(entry: dict[str, Any]) -> dict[str, Any]:
    return {
        "rank": _whole(entry.get("rank")),
        "node": _whole(entry.get("node")),
        "phase": str(_text(entry.get("phase"))),
        **{key: _time(entry.get(key)) for key in ("start", "end")},
        **{key: _finite(entry.get(key)) or 0.0 for key in ("gap_pct", "lost_pct")},
    }


def _checked_preempted(value: object) -> dict[str, Any] | None:
    """The step every rank saved at on a stop signal, and the signal's name; None unless the step is a step."""
    if not isinstance(value, dict) or not is_step(value.get("step")):
        return None
    return {"step": value["step"], "signal": _text(value.get("signal"))}


def _outcome(value: object) -> str:
    """One of the runner's words (finished, failed, ...): a text; anything else is "unknown"."""
    return value[:TEXT_SHOWN] if isinstance(value, str) and value.strip() else "unknown"


def _whole(value: object) -> int | None:
    return value if is_step(value) else None


def _count(value: object) -> int | None:
    return value if is_step(value) and value >= 0 else None  # type: ignore[operator]


def _finite(value: object) -> float | None:
    return value if number(value) is not None else None  # type: ignore[return-value]


def _time(value: object) -> float | None:
    return value if is_time(value) else None  # type: ignore[return-value]


def _text(value: object) -> str | None:
    """A text of the file, cut to TEXT_SHOWN characters; None where it is none (None, a number shown as written)."""
    if value is None or isinstance(value, (dict, list)):
        return None
    return str(value)[:TEXT_SHOWN]


def _list(value: object) -> list[Any]:
    return value[:LIST_SHOWN] if isinstance(value, list) else []
