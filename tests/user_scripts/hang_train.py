"""A tiny gloo job whose ranks put themselves where a hang leaves them (tests/hang_ranks.py starts it).

Each rank runs STEPS all_reduces, then does what its role (argv) says: `reduce` (all_reduce 1000 floats),
`reduce_big` (2000 floats, once the ranks named in AFTER have written their records), `barrier`, `late`
(waits in load_batch, never entering the next collective), `load` (every such rank waits in load_batch) or
`gil` (stuck in load_batch holding the GIL, so it cannot answer: faulthandler dumps its stack on SIGUSR2).
A thread of the runtime answers as it would at a hang: once the main thread is where its role puts it
(read from the flight recorder and the stack, polled: no fixed sleep), it writes runtime.stacks.snapshot()
to OUT/rank-N.json and leaves the rank where it is; the test kills the job.
"""

import faulthandler
import json
import os
import re
import signal
import sys
import threading
import time
from pathlib import Path

import torch
import torch.distributed as dist

from runtime import stacks

STEPS = 3
NEVER = threading.Event()


def load_batch(step: int, role: str) -> torch.Tensor:
    """The batch of `step`; a `late` or `load` rank waits here for ever."""
    if role in ("late", "load"):
        NEVER.wait()  # hang: the data-loading line
    if role == "gil":
        re.match(r"(a+)+$", "a" * 64 + "b")  # hang: a regular expression that backtracks for ever, holding the GIL
    return torch.ones(1000)


def collective(role: str, batch: torch.Tensor, out: Path, after: list[int]) -> None:
    """The collective of the step, as the role has it."""
    if role == "barrier":
        dist.barrier()  # hang: a barrier where the others all_reduce
    elif role == "reduce_big":
        while not all((out / f"rank-{rank}.json").exists() for rank in after):
            time.sleep(0.02)
        dist.all_reduce(torch.ones(2000))  # hang: twice the others' size
    else:
        dist.all_reduce(batch)  # hang: the collective the others wait in


def where_it_waits(record: dict, role: str) -> bool:
    """Whether the record shows the main thread where the role leaves it."""
    if role == "gil":
        return False  # it never answers: its main thread holds the GIL
    frames = record["threads"][0]["frames"] if record["threads"] else []
    if role in ("late", "load"):
        return bool(frames) and any(frame["function"] == "load_batch" for frame in frames)
    called = [frame["function"] for frame in frames]
    in_torch = "collective" in called and any(name in ("all_reduce", "barrier") for name in called)
    found = record["collectives"]
    if not found.get("source"):
        return in_torch
    return in_torch and found.get("last_entered") == STEPS + 1 and found.get("last_completed") == STEPS


def answer(rank: int, role: str, out: Path) -> None:
    """Write this rank's record once it waits where its role says."""
    while True:
        record = stacks.snapshot(rank)
        if where_it_waits(record, role):
            break
        time.sleep(0.02)
    dump = record.get("recorder_dump")
    if isinstance(dump, bytes):  # torch 2.14's _dump_fr_trace_json returns bytes; snapshot() hands them on
        record["recorder_dump"] = dump.decode(errors="replace")
    part = out / f".rank-{rank}.json.part"
    part.write_text(json.dumps({**record, "answered": True}))
    part.rename(out / f"rank-{rank}.json")
    (out / f"rank-{rank}.txt").write_text(stacks.as_text(record))


def main() -> None:
    rank, world, role, out = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], Path(sys.argv[4])
    after = [int(r) for r in os.environ.get("AFTER", "").split(",") if r]
    if role == "gil":
        dump = (out / f"rank-{rank}.faulthandler").open("w")
        faulthandler.register(signal.SIGUSR2, file=dump, all_threads=True)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    threading.Thread(target=answer, args=(rank, role, out), daemon=True).start()
    for _ in range(STEPS):
        dist.all_reduce(torch.ones(10))
    batch = load_batch(STEPS, role)
    collective(role, batch, out, after)
    NEVER.wait()  # a rank whose collective returned (the others mismatched) stays, as a hung rank would


if __name__ == "__main__":
    main()
