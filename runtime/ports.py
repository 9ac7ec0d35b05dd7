"""The first free slot of a port range on this host, for a one-node Slurm job (standard library only).

launch/entry.sh takes a job's master port and HCCL slot from its job id, so that every
node of a job computes the same ones without talking to the others. A job with one node
has no one to agree with: it may move past a slot that another job on the node already
holds. `python -m runtime.ports START SLOTS BASE WIDTH` prints the first slot, from
START and wrapping around SLOTS, whose WIDTH ports from BASE + slot x WIDTH are all free
to listen on; START itself when none is (the preflight then names the clash).
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

from .preflight import port_error


def slot_is_free(base: int, width: int, slot: int, host: str = "") -> bool:
    """Whether every port of `slot` can be listened on now, on every address (`host` '')."""
    first = base + slot * width
    return all(port_error(host, port) is None for port in range(first, first + width))


def free_slot(start: int, slots: int, base: int, width: int, host: str = "") -> int:
    """The first slot from `start` (wrapping around `slots`) whose ports are free; `start` when none is."""
    for step in range(slots):
        slot = (start + step) % slots
        if slot_is_free(base, width, slot, host):
            return slot
    return start


def main(argv: Sequence[str] | None = None) -> int:
    """Print the free slot for START SLOTS BASE WIDTH; exit 2 on bad arguments."""
    args = list(sys.argv[1:] if argv is None else argv)
    try:
        start, slots, base, width = (int(arg) for arg in args)
    except ValueError:
        print(
            "usage: python -m runtime.ports START SLOTS BASE WIDTH (whole numbers)",
            file=sys.stderr,
        )
        return 2
    if not (
        0 <= start < slots
        and width > 0
        and base > 0
        and base + slots * width - 1 <= 65535
    ):
        print(
            f"runtime.ports: slot {start} of {slots} x {width} ports from {base} is not a port range",
            file=sys.stderr,
        )
        return 2
    print(free_slot(start, slots, base, width))
    return 0


if __name__ == "__main__":
    sys.exit(main())
