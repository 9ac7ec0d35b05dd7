"""Where this rank is now: every thread's Python stack and its last collectives.

`snapshot()` is what a rank answers when the runner asks why the job is stuck.
It runs on a thread of the runtime, not the training thread: a rank waiting in
a collective holds no GIL, so this thread can read the other threads' frames
(sys._current_frames) and the process group's flight recorder while the main
thread waits. Everything is bounded: MAX_THREADS threads, the MAX_FRAMES
innermost frames of each, the MAX_COLLECTIVES newest collectives.

The flight recorder is torch's record of each collective a process group ran
(sequence number, operation, sizes, dtypes, state). It records only when its
buffer is sized before the process group is made: `enable_recorder()` sets
TORCH_FR_BUFFER_SIZE to RECORDER_ENTRIES unless the user set it. With gloo it
records an entry when a collective is called and marks it `retired` when it
completes; with NCCL it also says scheduled / started / completed.

The record a snapshot returns (one JSON object; the runner writes it to
hang/rank-N.json and its text to hang/rank-N.txt):

    {"rank": 3, "pid": 4242, "time": 1790000000.0, "host": "node-1",
     "threads": [{"name": "MainThread", "main": true,
                  "frames": [{"file": ".../train.py", "line": 118,
                              "function": "load_batch", "code": "..."}, ...]},
                 ...],                      # main thread first, frames outermost first
     "collectives": {"source": "torch", "backend": "gloo",
                     "entries": [{"seq": 411, "op": "all_reduce", "group": "0",
                                  "sizes": [[1000]], "dtypes": ["Float"],
                                  "bytes": 4000, "state": "completed"}, ...],
                     "last_entered": 411, "last_completed": 411},
                    # or {"source": null, "why": "no process group"}
     "recorder_dump": "<the recorder's own JSON, at most MAX_DUMP_BYTES>"}

`install(run_dir, rank)`, called where a rank starts and before its process
group is made (the generated train.py, runtime/userscript.py), sizes the
recorder, has the rank answer the runner's "stacks" ask on the status stream
(runtime/status.py), and registers faulthandler on FAULT_SIGNAL (SIGUSR2:
SIGUSR1 is the preemption's "save and stop", SIGTERM and SIGINT stop, and no
launcher here uses SIGUSR2) to write every thread's C-level Python stack into
logs/rank-N.stacks.txt: the fallback for a rank that cannot answer because a
thread holds the GIL. A stopped process (SIGSTOP) runs the handler only once
it is continued.

With HCCL (backend "hccl", on NPUs) the record is torch_npu's own flight
recorder for ProcessGroupHCCL, read the same way into the same shape with
"source": "torch_npu" (checked in Ascend/pytorch, torch_npu/csrc/distributed/
TraceUtils.h, ProcessGroupHCCL.cpp and Init.cpp of each release branch):
- it exists from 2.1.0.post12 (the v2.1.0-7.0.0 branch, a pickle dump only:
  `torch_npu._C._distributed_c10d._dump_hccl_trace`), and from 2.1.0.post13,
  2.5.1.post1 and 2.6.0 on (the 7.1.0 branches and later, also
  `_dump_hccl_trace_json(includeCollectives, onlyActive)`, version "2.4");
  2.3.1, 2.4.0 and 2.5.1 (6.0.0 / 7.0.0 branches) have none;
- it records only with TORCH_HCCL_TRACE_BUFFER_SIZE > 0 in the environment
  before the process group is made: the launch script sets it for the releases
  that have it (templates' launch/run-node.sh), gated by the answers' release;
- its entries carry the keys torch's do (collective_seq_id, pg_id,
  input_sizes, input_dtypes, state, retired, is_p2p) but an empty
  profiling_name: torch_npu names no operation ("profiling is not supported",
  its test_flight_recorder.py), so "op" is UNKNOWN_OP, except a coalesced
  call ("hccl:all_reduce_coalesced"); "started" needs HCCL_DESYNC_DEBUG, so an
  entry is scheduled until the watchdog marks it completed.
"""

from __future__ import annotations

import errno
import faulthandler
import io
import json
import os
import pickle
import signal
import socket
import stat
import sys
import threading
import time
import traceback
from collections.abc import Mapping, MutableMapping
from pathlib import Path
from typing import IO, Any

from . import status

ENV_RECORDER = "TORCH_FR_BUFFER_SIZE"
ENV_HCCL_RECORDER = "TORCH_HCCL_TRACE_BUFFER_SIZE"
# torch_npu's recorder leaves profiling_name empty for a collective
UNKNOWN_OP = "unknown"
# collectives kept by torch's ring buffer, a few hundred bytes each
RECORDER_ENTRIES = 2000
# a project that shards runs about three collectives per block and step (fully_shard's
# all_gather in the forward and again in the backward, its reduce_scatter of the
# gradients): 8000 keep the last 40 or so steps of a 64-block model (about 3 MB)
RECORDER_ENTRIES_SHARDED = 8000
MAX_THREADS = 32
MAX_FRAMES = 48
MAX_COLLECTIVES = 32
MAX_DUMP_BYTES = 1 << 20
MAX_CODE_CHARS = 200
# bytes per element of the dtype names the recorder writes
DTYPE_BYTES = {
    "Float": 4, "Double": 8, "Half": 2, "BFloat16": 2, "Long": 8, "Int": 4,
    "Short": 2, "Char": 1, "Byte": 1, "Bool": 1,
}  # fmt: skip
# the states a recorder entry can be in, in order
SCHEDULED, STARTED, COMPLETED = "scheduled", "started", "completed"
ASK = "stacks"
DEFAULT_GROUP = "0"  # the recorder's pg_id of the default process group
FAULT_SIGNAL = signal.SIGUSR2
_fault_file: IO[str] | None = None  # kept open: faulthandler writes to its descriptor


def fault_path(run_dir: Path, rank: int) -> Path:
    """Where a rank's faulthandler writes its stacks on FAULT_SIGNAL."""
    return Path(run_dir) / "logs" / f"rank-{rank}.stacks.txt"


def install(run_dir: Path, rank: int, sharded: bool = False) -> None:
    """Make this rank able to say where it is: recorder on, the "stacks" ask answered, faulthandler on SIGUSR2.

    `sharded` (training.parallelism zero1 or fsdp2): a recorder sized for their collectives.
    """
    global _fault_file
    enable_recorder(entries=RECORDER_ENTRIES_SHARDED if sharded else RECORDER_ENTRIES)
    status.on_ask(ASK, lambda ask: snapshot(rank))
    path = fault_path(run_dir, rank)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        handle = path.open("a", encoding="utf-8")
    except OSError as error:  # the ask still works; only the fallback is missing
        print(
            f"npu-wizard: cannot open {path} for stack dumps ({error})", file=sys.stderr
        )
        return
    if _fault_file is not None:
        _fault_file.close()
    _fault_file = handle
    faulthandler.register(FAULT_SIGNAL, file=handle, all_threads=True, chain=False)


def enable_recorder(
    env: MutableMapping[str, str] = os.environ, entries: int = RECORDER_ENTRIES
) -> None:
    """Size torch's flight recorder buffer, unless the user chose a size (0 turns it off)."""
    env.setdefault(ENV_RECORDER, str(entries))


def snapshot(rank: int) -> dict[str, Any]:
    """This rank's threads and collectives now (see the module's text for the record)."""
    collectives, dump = recorder_entries()
    return {
        "rank": rank,
        "pid": os.getpid(),
        "time": time.time(),
        "host": socket.gethostname(),
        "threads": thread_stacks(),
        "collectives": collectives,
        "recorder_dump": dump,
    }


def thread_stacks() -> list[dict[str, Any]]:
    """Every thread's Python stack but this one's, the main thread first."""
    names = {thread.ident: thread.name for thread in threading.enumerate()}
    main = threading.main_thread().ident
    here = threading.get_ident()
    frames = sys._current_frames()
    order = sorted(frames, key=lambda ident: (ident != main, names.get(ident, "")))
    threads = []
    for ident in order:
        if ident == here:
            continue
        stack = traceback.extract_stack(frames[ident])[-MAX_FRAMES:]
        threads.append(
            {
                "name": names.get(ident, f"thread {ident}"),
                "main": ident == main,
                "frames": [_frame(frame) for frame in stack],
            }
        )
    return threads[:MAX_THREADS]


def _frame(frame: traceback.FrameSummary) -> dict[str, Any]:
    name = frame.filename
    # runpy runs a user's script by the path it was given: relative to the rank's folder
    if not name.startswith("<") and not os.path.isabs(name):
        name = os.path.join(os.getcwd(), name)
    return {
        "file": name,
        "line": frame.lineno,
        "function": frame.name,
        "code": (frame.line or "")[:MAX_CODE_CHARS],
    }


def recorder_entries() -> tuple[dict[str, Any], str | None]:
    """The newest collectives from the backend's flight recorder, and its own dump (bounded)."""
    torch = sys.modules.get("torch")
    if torch is None:
        return {"source": None, "why": "torch is not imported"}, None
    dist = getattr(
        torch, "distributed", None
    )  # absent while torch is still being imported
    if dist is None or not (dist.is_available() and dist.is_initialized()):
        return {"source": None, "why": "no process group"}, None
    backend = str(dist.get_backend())
    if backend == "hccl":
        return hccl_recorder_entries(sys.modules.get("torch_npu"))
    return torch_recorder_entries(torch, backend)


def torch_recorder_entries(
    torch: Any, backend: str
) -> tuple[dict[str, Any], str | None]:
    """torch's own flight recorder (gloo, NCCL), read through its JSON dump."""
    if not os.environ.get(ENV_RECORDER, "0").strip("0"):
        return {"source": None, "why": f"{ENV_RECORDER} is 0 or unset"}, None
    dump_json = getattr(torch._C._distributed_c10d, "_dump_fr_trace_json", None)
    if dump_json is None:
        return {"source": None, "why": "this torch has no flight recorder"}, None
    try:
        text = dump_json(True, False)
        # torch 2.14 hands the JSON over as bytes: written out as they are, they would be their repr
        text = text.decode() if isinstance(text, bytes) else str(text)
        dump = json.loads(text)
    except (RuntimeError, ValueError) as error:
        return {"source": None, "why": f"the flight recorder failed: {error}"}, None
    return read_dump(dump, backend=backend), bounded_dump(dump, text)


def hccl_recorder_entries(
    torch_npu: Any, env: Mapping[str, str] = os.environ
) -> tuple[dict[str, Any], str | None]:
    """The newest collectives from torch_npu's HCCL flight recorder, and its dump as JSON (bounded)."""
    if torch_npu is None:
        return {"source": None, "why": "torch_npu is not imported"}, None
    version = getattr(torch_npu, "__version__", "(version unknown)")
    c10d = getattr(getattr(torch_npu, "_C", None), "_distributed_c10d", None)
    dump_json = getattr(c10d, "_dump_hccl_trace_json", None)
    dump_pickle = getattr(c10d, "_dump_hccl_trace", None)
    if dump_json is None and dump_pickle is None:
        why = f"torch_npu {version} has no HCCL flight recorder"
        return {"source": None, "why": why}, None
    if not env.get(ENV_HCCL_RECORDER, "0").strip().strip("0"):
        why = f"{ENV_HCCL_RECORDER} is 0 or unset (the launch script sets it)"
        return {"source": None, "why": why}, None
    try:
        if dump_json is not None:
            dump = json.loads(dump_json(True, False))
        else:
            dump = plain_unpickle(dump_pickle(True, False, False))
    except (RuntimeError, ValueError, EOFError, pickle.UnpicklingError) as error:
        why = f"torch_npu's flight recorder failed: {error}"
        return {"source": None, "why": why}, None
    if not isinstance(dump, Mapping):
        why = "torch_npu's flight recorder gave no mapping"
        return {"source": None, "why": why}, None
    text = json.dumps(dump, default=str)
    return read_dump(dump, backend="hccl", source="torch_npu"), bounded_dump(dump, text)


def bounded_dump(dump: Mapping[str, Any], text: str) -> str:
    """The recorder's dump as JSON of at most MAX_DUMP_BYTES, its oldest entries left out as needed."""
    entries = list(dump.get("entries") or [])
    while len(text.encode()) > MAX_DUMP_BYTES and entries:
        entries = entries[len(entries) // 2 + 1 :]
        kept = {**dump, "entries": entries, "npu_wizard_oldest_entries_left_out": True}
        text = json.dumps(kept, default=str)
    return text if len(text.encode()) <= MAX_DUMP_BYTES else "{}"


def ask_hccl_dump(rank: int, env: Mapping[str, str] = os.environ) -> str:
    """Ask torch_npu to dump rank `rank`'s recorder to its file, through its pipe; say what was done.

    For a rank that cannot answer itself: torch_npu's monitor thread reads
    TORCH_HCCL_DEBUG_INFO_PIPE_FILE + rank + ".pipe" and, on any byte, writes
    TORCH_HCCL_DEBUG_INFO_TEMP_FILE + rank. That is no way round a held GIL:
    symbolizing the stacks takes the GIL, so a rank whose thread holds it may
    dump late or not at all. Never blocks: a pipe nobody reads is said to be so.
    """
    prefix = env.get("TORCH_HCCL_DEBUG_INFO_PIPE_FILE", "")
    if not prefix:
        return "TORCH_HCCL_DEBUG_INFO_PIPE_FILE is unset: torch_npu has no dump pipe"
    pipe = f"{prefix}{rank}.pipe"
    try:  # a link or a regular file in its place is never written
        handle = os.open(pipe, os.O_WRONLY | os.O_NONBLOCK | os.O_NOFOLLOW)
    except FileNotFoundError:
        return f"{pipe} does not exist (torch_npu's monitor did not start)"
    except OSError as error:  # ENXIO: a FIFO no process has open for reading
        if error.errno == errno.ELOOP:
            return f"{pipe} is a symbolic link, not a pipe: nothing written"
        return f"{pipe} cannot be written: {error.strerror or error}"
    try:
        if not stat.S_ISFIFO(os.fstat(handle).st_mode):
            return f"{pipe} is not a pipe: nothing written"
        os.write(handle, b"1\n")
    except OSError as error:
        return f"{pipe} cannot be written: {error.strerror or error}"
    finally:
        os.close(handle)
    written = env.get("TORCH_HCCL_DEBUG_INFO_TEMP_FILE", "/tmp/hccl_trace_rank_")
    return f"asked through {pipe}: torch_npu writes {written}{rank}"


class _PlainData(pickle.Unpickler):
    """An unpickler of plain data only: the recorder's dicts, lists, strings and numbers."""

    def find_class(self, module: str, name: str) -> Any:
        raise pickle.UnpicklingError(f"unexpected {module}.{name} in the dump")


def plain_unpickle(data: bytes) -> Any:
    """A pickled recorder dump as plain data; raise pickle.UnpicklingError where it names any code."""
    return _PlainData(io.BytesIO(data)).load()


def read_dump(
    dump: Mapping[str, Any], backend: str, source: str = "torch"
) -> dict[str, Any]:
    """The recorder's dump (torch's or torch_npu's) as the snapshot's `collectives`."""
    by_group: dict[str, list[dict[str, Any]]] = {}
    for entry in dump.get("entries") or []:
        read = _entry(entry)
        if read is not None:  # a group moves last each time it is named
            named = by_group.pop(read["group"], [])
            named.append(read)
            by_group[read["group"]] = named
    for entries in by_group.values():
        entries.sort(key=lambda entry: entry["seq"])
    default = by_group.get(DEFAULT_GROUP, [])
    completed = [entry["seq"] for entry in default if entry["state"] == COMPLETED]
    return {
        "source": source,
        "backend": backend,
        "entries": newest_of_each_group(by_group),
        "last_entered": max((entry["seq"] for entry in default), default=None),
        "last_completed": max(completed, default=None),
    }


def newest_of_each_group(
    by_group: Mapping[str, list[dict[str, Any]]],
) -> list[dict[str, Any]]:
    """MAX_COLLECTIVES entries at most, taken a newest one of each group in turn.

    The default group's come first, then those of the group the dump named last,
    and so on (a subgroup's many collectives never push the default group's
    out). Kept in order: the default group's, then the others', the group named
    last in the dump last.
    """
    default = [DEFAULT_GROUP] if DEFAULT_GROUP in by_group else []
    others = [group for group in by_group if group != DEFAULT_GROUP]
    taking = default + others[::-1]
    kept = dict.fromkeys(taking, 0)
    left = MAX_COLLECTIVES
    while left and any(kept[group] < len(by_group[group]) for group in taking):
        for group in taking:
            if left and kept[group] < len(by_group[group]):
                kept[group] += 1
                left -= 1
    return [
        entry
        for group in default + others
        for entry in by_group[group][len(by_group[group]) - kept[group] :]
    ]


def _entry(entry: Mapping[str, Any]) -> dict[str, Any] | None:
    seq = entry.get("collective_seq_id")
    if not isinstance(seq, int) or entry.get("is_p2p"):
        return None
    name = str(entry.get("profiling_name") or "")
    # a pickled dump (torch_npu 2.1.0.post12) gives shapes as tuples
    sizes = [
        list(shape) if isinstance(shape, (list, tuple)) else shape
        for shape in entry.get("input_sizes") or []
    ]
    dtypes = entry.get("input_dtypes") or []
    state = str(entry.get("state", SCHEDULED))
    # gloo leaves `scheduled` and retires the entry once it is done
    if entry.get("retired") and state != COMPLETED:
        state = COMPLETED
    return {
        "seq": seq,
        "op": name.rpartition(":")[2] or UNKNOWN_OP,
        "group": str(entry.get("pg_id", "")),
        "sizes": sizes,
        "dtypes": dtypes,
        "bytes": _bytes(sizes, dtypes),
        "state": state,
    }


def _bytes(sizes: list[Any], dtypes: list[Any]) -> int | None:
    total = 0
    for shape, dtype in zip(sizes, dtypes, strict=False):
        width = DTYPE_BYTES.get(str(dtype))
        if width is None or not isinstance(shape, list):
            return None
        count = 1
        for extent in shape:
            try:
                count *= int(extent)
            except (TypeError, ValueError, OverflowError):
                return None  # a size that is no number (None, a word): the bytes are unknown
        total += count * width
    return total


def as_text(record: Mapping[str, Any]) -> str:
    """A snapshot as the lines of hang/rank-N.txt: collectives first, then each thread."""
    lines = [
        f"rank {record.get('rank')} (pid {record.get('pid')} on {record.get('host')})"
    ]
    collectives = record.get("collectives") or {}
    if collectives.get("source"):
        lines.append(
            f"collectives ({collectives.get('backend')}): last entered "
            f"#{collectives.get('last_entered')}, last completed "
            f"#{collectives.get('last_completed')}"
        )
        for entry in collectives.get("entries", [])[-8:]:
            lines.append(
                f"  #{entry['seq']} {entry['op']} group {entry['group']} "
                f"{entry['sizes']} {entry['dtypes']} {entry['state']}"
            )
    else:
        lines.append(f"collectives: not recorded ({collectives.get('why')})")
    for thread in record.get("threads", []):
        main = " (main)" if thread.get("main") else ""
        lines.append(f"\nthread {thread.get('name')}{main}, innermost last:")
        for frame in thread.get("frames", []):
            lines.append(
                f'  File "{frame["file"]}", line {frame["line"]}, in {frame["function"]}'
            )
            if frame.get("code"):
                lines.append(f"    {frame['code']}")
    return "\n".join(lines) + "\n"
