"""Test double of torch_npu (installed as `torch_npu` by tests/doubles/torch_npu_double.py).

No NPU exists on the test machine. This package stands in for one torch_npu
release (release.json beside it) and records every call it gets, one JSON
line per call, under $TORCH_NPU_DOUBLE_RECORD.
"""

from __future__ import annotations

import importlib.util
import json
import os
import pickle
import sys
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

RELEASE: dict[str, Any] = json.loads(Path(__file__).with_name("release.json").read_text())
__version__ = RELEASE["version"]


def _record(name: str, entry: dict[str, Any]) -> None:
    folder = os.environ.get("TORCH_NPU_DOUBLE_RECORD")
    if folder:
        with open(Path(folder) / f"{name}.jsonl", "a") as file:
            file.write(json.dumps(entry, default=repr) + "\n")


class GradScaler:
    """torch_npu.npu.amp.GradScaler's interface and state, recording each call (CPU tensors only)."""

    def __init__(
        self,
        init_scale: float = 2.0**16,
        growth_factor: float = 2.0,
        backoff_factor: float = 0.5,
        growth_interval: int = 2000,
        dynamic: bool = True,
        enabled: bool = True,
    ) -> None:
        self.calls: list[dict[str, Any]] = []
        self._enabled = enabled
        self._scale = float(init_scale)
        self._growth_factor = growth_factor
        self._backoff_factor = backoff_factor
        self._growth_interval = growth_interval
        self._dynamic = dynamic
        self._growth_tracker = 0
        self._found_inf = False
        self._ask(
            "__init__",
            init_scale=init_scale,
            growth_factor=growth_factor,
            backoff_factor=backoff_factor,
            growth_interval=growth_interval,
            dynamic=dynamic,
            enabled=enabled,
        )

    def _ask(self, call: str, **arguments: Any) -> None:
        entry = {"call": call, **arguments}
        self.calls.append(entry)
        _record("grad_scaler", entry)

    def is_enabled(self) -> bool:
        """Whether scaling is on."""
        return self._enabled

    def get_scale(self) -> float:
        """The current loss scale (1.0 when disabled)."""
        return self._scale if self._enabled else 1.0

    def scale(self, outputs: Any) -> Any:
        """The loss times the current scale."""
        self._ask("scale")
        return outputs * self._scale if self._enabled else outputs

    def unscale_(self, optimizer: Any) -> None:
        """Divide the gradients by the scale; note whether any is inf or nan."""
        self._ask("unscale_")
        if not self._enabled:
            return
        for group in optimizer.param_groups:
            for parameter in group["params"]:
                if parameter.grad is not None:
                    parameter.grad.div_(self._scale)
                    if not bool(parameter.grad.isfinite().all()):
                        self._found_inf = True

    def step(self, optimizer: Any) -> None:
        """Unscale, then step unless an overflow was found."""
        self._ask("step")
        if not self._enabled:
            optimizer.step()
            return
        self.unscale_(optimizer)
        if not self._found_inf:
            optimizer.step()

    def update(self) -> None:
        """Lower the scale after an overflow, raise it after growth_interval clean steps."""
        self._ask("update", found_inf=self._found_inf)
        if not (self._enabled and self._dynamic):
            self._found_inf = False
            return
        if self._found_inf:
            self._scale *= self._backoff_factor
            self._growth_tracker = 0
        else:
            self._growth_tracker += 1
            if self._growth_tracker == self._growth_interval:
                self._scale *= self._growth_factor
                self._growth_tracker = 0
        self._found_inf = False

    def state_dict(self) -> dict[str, Any]:
        """The real scaler's state keys, `dynamic` included; empty when disabled."""
        self._ask("state_dict")
        if not self._enabled:
            return {}
        return {
            "scale": self._scale,
            "growth_factor": self._growth_factor,
            "backoff_factor": self._backoff_factor,
            "growth_interval": self._growth_interval,
            "_growth_tracker": self._growth_tracker,
            "dynamic": self._dynamic,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore a state_dict(); like the real one, it needs `dynamic` and refuses an empty state."""
        self._ask("load_state_dict", state=state)
        if not self._enabled:
            return
        if not state:
            raise RuntimeError("The source state dict is empty, possibly because it was saved from a disabled instance")
        self._scale = float(state["scale"])
        self._growth_factor = state["growth_factor"]
        self._backoff_factor = state["backoff_factor"]
        self._growth_interval = state["growth_interval"]
        self._growth_tracker = state["_growth_tracker"]
        self._dynamic = state["dynamic"]


def _devices() -> int:
    return int(os.environ.get("TORCH_NPU_DOUBLE_DEVICES", "8"))


def _set_device(index: int) -> None:
    _record("npu", {"call": "set_device", "index": index})


def _set_compile_mode(jit_compile: bool) -> None:
    _record("npu", {"call": "set_compile_mode", "jit_compile": jit_compile})


class Event:
    """torch_npu.npu.Event's timing interface, recording each call: `record` notes the host clock.

    `elapsed_time` gives the milliseconds between two recorded events, and
    refuses, as the real one does, events made without enable_timing or never
    recorded. No device exists, so the host clock stands in for the stream's.
    """

    def __init__(self, enable_timing: bool = False, blocking: bool = False, interprocess: bool = False) -> None:
        self.enable_timing = enable_timing
        self.recorded_at: float | None = None
        _record("npu_event", {"call": "Event", "enable_timing": enable_timing})

    def record(self, stream: Any = None) -> None:
        """Note when the event was recorded."""
        self.recorded_at = time.perf_counter()
        _record("npu_event", {"call": "record"})

    def elapsed_time(self, end: Event) -> float:
        """Milliseconds from this event to `end`."""
        _record("npu_event", {"call": "elapsed_time"})
        if not (self.enable_timing and end.enable_timing):
            raise RuntimeError("Both events must be created with argument 'enable_timing=True'.")
        if self.recorded_at is None or end.recorded_at is None:
            raise RuntimeError("Both events must be recorded before calculating elapsed time.")
        return (end.recorded_at - self.recorded_at) * 1000

    def synchronize(self) -> None:
        """Wait for the event (recorded: a test can check that nobody waits)."""
        _record("npu_event", {"call": "synchronize"})

    def query(self) -> bool:
        """Whether the event completed (recorded: a test can check that nobody polls)."""
        _record("npu_event", {"call": "query"})
        return True


def _synchronize(device: Any = None) -> None:
    _record("npu", {"call": "synchronize"})


npu = SimpleNamespace(
    Event=Event,
    synchronize=_synchronize,
    is_available=lambda: _devices() > 0,
    device_count=_devices,
    set_device=_set_device,
    set_compile_mode=_set_compile_mode,
    is_bf16_supported=lambda: os.environ.get("TORCH_NPU_DOUBLE_BF16", "1") == "1",
    amp=SimpleNamespace(GradScaler=GradScaler),
)


class _Profile:
    """torch_npu.profiler.profile: records its calls; hands itself to on_trace_ready at its schedule's end."""

    def __init__(
        self,
        *,
        activities: Any = None,
        schedule: Any = None,
        on_trace_ready: Any = None,
        record_shapes: bool = False,
        profile_memory: bool = False,
        with_stack: bool = False,
        with_flops: bool = False,
        with_modules: bool = False,
        experimental_config: Any = None,
    ) -> None:
        self.schedule, self.on_trace_ready, self.steps = schedule, on_trace_ready, 0
        config = getattr(experimental_config, "arguments", None)
        _record("profiler", {"call": "profile", "activities": list(activities or []), "experimental_config": config})

    def start(self) -> None:
        _record("profiler", {"call": "start"})

    def step(self) -> None:
        self.steps += 1
        _record("profiler", {"call": "step", "n": self.steps})
        plan = self.schedule.arguments if self.schedule is not None else {}
        if self.steps == plan.get("wait", 0) + plan.get("warmup", 0) + plan.get("active", 0):
            self.on_trace_ready(self)

    def stop(self) -> None:
        _record("profiler", {"call": "stop"})


class _Arguments:
    """A call's keyword arguments, kept (schedule, _ExperimentalConfig)."""

    def __init__(self, name: str, **arguments: Any) -> None:
        self.arguments = arguments
        _record("profiler", {"call": name, **arguments})


def _schedule(wait: int, active: int, warmup: int = 0, repeat: int = 0, skip_first: int = 0) -> _Arguments:
    return _Arguments("schedule", wait=wait, active=active, warmup=warmup, repeat=repeat, skip_first=skip_first)


def _experimental_config(
    profiler_level: str = "Level0",
    aic_metrics: str = "ACL_AICORE_NONE",
    l2_cache: bool = False,
    msprof_tx: bool = False,
    data_simplification: bool = True,
    record_op_args: bool = False,
    op_attr: bool = False,
    gc_detect_threshold: float | None = None,
    export_type: str = "text",
) -> _Arguments:
    # the arguments of the oldest offered release (v2.1.0-6.0.0); later ones add more
    return _Arguments(
        "_ExperimentalConfig",
        profiler_level=profiler_level,
        aic_metrics=aic_metrics,
        export_type=export_type,
        data_simplification=data_simplification,
    )


def _trace_handler(
    dir_name: str | None = None, worker_name: str | None = None, analyse_flag: bool = True, **more: Any
) -> Any:
    if more and (set(more) != {"async_mode"} or not RELEASE["profiler_async_parse"]):
        raise TypeError(f"tensorboard_trace_handler() got an unexpected keyword argument {sorted(more)[0]!r}")
    _record("profiler", {"call": "tensorboard_trace_handler", "dir_name": dir_name, "worker_name": worker_name, **more})

    def handler(profile: _Profile) -> None:
        _record("profiler", {"call": "analyse", **more})

    return handler


profiler = SimpleNamespace(
    profile=_Profile,
    schedule=_schedule,
    tensorboard_trace_handler=_trace_handler,
    _ExperimentalConfig=_experimental_config,
    ProfilerActivity=SimpleNamespace(CPU="CPU", NPU="NPU"),
    ProfilerLevel=SimpleNamespace(Level0="Level0", Level1="Level1", Level2="Level2"),
    AiCMetrics=SimpleNamespace(PipeUtilization="ACL_AICORE_PIPE_UTILIZATION"),
    ExportType=SimpleNamespace(Text="text", Db="db"),
)


HCCL_BUFFER = "TORCH_HCCL_TRACE_BUFFER_SIZE"


def _hccl_buffer_size() -> int:
    try:
        return max(0, int(os.environ.get(HCCL_BUFFER, "0")))
    except ValueError:
        return 0


def _register_hccl_on_gloo() -> None:
    """The "hccl" backend, as torch_npu registers it, made of a gloo process group on the CPU."""
    import torch.distributed as dist

    if not dist.is_available() or "hccl" in dist.Backend.backend_list:
        return

    def new_group(store: Any, rank: int, size: int, timeout: Any) -> Any:
        # the real recorder is sized when the process group is made: torch's, which the double reads, too.
        # Not at import: a test that loads the double in its own process would leave TORCH_FR_BUFFER_SIZE=0
        # to every process it starts later (a Slurm job's ranks then recorded nothing).
        os.environ.setdefault("TORCH_FR_BUFFER_SIZE", str(_hccl_buffer_size()))
        return dist.ProcessGroupGloo(store, rank, size, timeout)

    dist.Backend.register_backend("hccl", new_group, devices=["cpu"])


def _hccl_entries(with_frames: bool) -> list[dict[str, Any]]:
    """torch's recorder entries of the gloo collectives, as torch_npu's recorder writes them."""
    size = _hccl_buffer_size()
    dump_json = getattr(sys.modules["torch"]._C._distributed_c10d, "_dump_fr_trace_json", None)
    if size == 0 or dump_json is None:
        return []
    entries = []
    for entry in json.loads(dump_json(True, False)).get("entries") or []:
        done = bool(entry.get("retired"))
        shaped = {
            "record_id": entry.get("record_id"),
            "pg_id": entry.get("pg_id"),
            "process_group": tuple(entry.get("process_group") or ("", "")),
            "collective_seq_id": entry.get("collective_seq_id"),
            "p2p_seq_id": entry.get("p2p_seq_id", 0),
            "op_id": entry.get("op_id"),
            "profiling_name": "",  # torch_npu records none for a collective
            "time_created_ns": entry.get("time_created_ns"),
            "input_sizes": entry.get("input_sizes"),
            "input_dtypes": entry.get("input_dtypes"),
            "output_sizes": entry.get("output_sizes"),
            "output_dtypes": entry.get("output_dtypes"),
            "state": "completed" if done else "scheduled",
            "time_discovered_started_ns": 0,
            "time_discovered_completed_ns": time.time_ns() if done else 0,
            "retired": done,
            "timeout_ms": entry.get("timeout_ms", 0),
            "is_p2p": bool(entry.get("is_p2p")),
        }
        if with_frames:
            shaped["frames"] = entry.get("frames", [])
        entries.append(shaped)
    return entries[-size:]


def _hccl_dump(version: str, entries: list[dict[str, Any]]) -> dict[str, Any]:
    seqs = [entry["collective_seq_id"] for entry in entries if entry["pg_id"] == 0]
    done = [entry["collective_seq_id"] for entry in entries if entry["pg_id"] == 0 and entry["retired"]]
    dump: dict[str, Any] = {
        "version": version,
        "pg_config": {"0": {"name": "0", "desc": "default_pg", "ranks": "[0]"}},
        "pg_status": {
            "0": {
                "last_enqueued_collective": str(max(seqs, default=-1)),
                "last_started_collective": "-1",
                "last_completed_collective": str(max(done, default=-1)),
            }
        },
    }
    if entries:  # torch_npu leaves the key out when there is none
        dump["entries"] = entries
    return dump


def _dump_hccl_trace_json(includeCollectives: bool | None = None, onlyActive: bool | None = None) -> bytes:  # noqa: N803
    """The recorder as JSON bytes (7.1.0 branches on)."""
    _record("hccl_trace", {"call": "_dump_hccl_trace_json", "args": [includeCollectives, onlyActive]})
    entries = _hccl_entries(with_frames=False) if includeCollectives in (None, True) else []
    if onlyActive:
        entries = [entry for entry in entries if not entry["retired"]]
    return json.dumps(_hccl_dump("2.4", entries)).encode()


def _dump_hccl_trace(
    includeCollectives: bool | None = None,  # noqa: N803
    includeStackTraces: bool | None = None,  # noqa: N803
    onlyActive: bool | None = None,  # noqa: N803
) -> bytes:
    """The recorder pickled (every release with it); shapes are tuples, as torch's pickler writes them."""
    _record("hccl_trace", {"call": "_dump_hccl_trace", "args": [includeCollectives, includeStackTraces, onlyActive]})
    frames = includeStackTraces in (None, True)
    entries = _hccl_entries(with_frames=frames) if includeCollectives in (None, True) else []
    if onlyActive:
        entries = [entry for entry in entries if not entry["retired"]]
    for entry in entries:
        entry["input_sizes"] = tuple(tuple(shape) for shape in entry["input_sizes"] or [])
        entry["output_sizes"] = tuple(tuple(shape) for shape in entry["output_sizes"] or [])
    dump = _hccl_dump("2.1" if RELEASE["hccl_recorder"] == "pickle" else "2.4", entries)
    if RELEASE["hccl_recorder"] == "pickle":
        del dump["pg_status"]  # version 2.1 has no pg_status
    return pickle.dumps(dump, protocol=2)


_c10d = SimpleNamespace()
if RELEASE.get("hccl_recorder"):
    _c10d._dump_hccl_trace = _dump_hccl_trace
if RELEASE.get("hccl_recorder") == "json":
    _c10d._dump_hccl_trace_json = _dump_hccl_trace_json
_C = SimpleNamespace(_distributed_c10d=_c10d)
if importlib.util.find_spec("torch") is not None:
    _register_hccl_on_gloo()
