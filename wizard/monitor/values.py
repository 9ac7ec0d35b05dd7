"""The checks every time, step, figure and rank key read from a run folder or the status stream goes through.

An events file, run.json and summary.json may say anything; the monitor and the report take a value only
through these checks, and pass over one that fails them as they pass over a value of the wrong type.

JSON carries whole numbers of any length: one of 400 digits is past any float, one of 5000 past what `int()`
reads, and 1e300 seconds past any date; each is no value here, as a string is none.
"""

from __future__ import annotations

import math

TIME_LIMIT = 1e15  # seconds either side of 1970: some 30 million years, still a date that gmtime can show
STEP_LIMIT = 2**62  # a step or count that a 64-bit column holds, with room for a difference of two
RANK_KEY_DIGITS = 7  # a rank as summary.json's key: ranks go to a few thousand


def number(value: object) -> float | None:
    """`value` as a finite float; None for a bool, a string, NaN, Infinity or a whole number past any float."""
    if type(value) is float:
        return value if math.isfinite(value) else None
    if type(value) is not int:
        return None
    try:
        return float(value)
    except OverflowError:
        return None


def is_time(value: object) -> bool:
    """Whether `value` is a time or a span in seconds: a finite number within ±1e15."""
    seconds = number(value)
    return seconds is not None and -TIME_LIMIT <= seconds <= TIME_LIMIT


def is_step(value: object) -> bool:
    """Whether `value` is a step, rank or count: a whole number (not a bool) within ±2**62."""
    return type(value) is int and -STEP_LIMIT <= value <= STEP_LIMIT


def is_rank_key(value: object) -> bool:
    """Whether `value` is a rank as a JSON object's key: a short string of digits."""
    return isinstance(value, str) and 0 < len(value) <= RANK_KEY_DIGITS and value.isdecimal()
