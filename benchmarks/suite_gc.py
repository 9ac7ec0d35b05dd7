"""What the test processes' garbage-collector settings (tests/gc_tuning.py) save, against Python's defaults.

The same test files run in one pytest process (no xdist), taking turns: with `-p no:tests.gc_tuning` (the
baseline: this Python's thresholds, nothing frozen) and with the plugin. A small plugin of this script's own
(loaded in both) adds up the time the collector took, from `gc.callbacks`. The figures are the child's CPU
seconds (user + system), its wall seconds and its seconds in the collector, medians over the rounds. The
default files are where a test-fast worker's own CPU goes: the wizard under Pilot.

    python benchmarks/suite_gc.py [--rounds 3] [tests/test_tui_flow.py ...]
    python benchmarks/suite_gc.py --smoke   # one round, one small test file
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.gc_tuning import YOUNG_THRESHOLD  # noqa: E402  (the repository's root first)

DEFAULT_FILES = ["tests/test_tui_flow.py", "tests/test_tui_behaviour.py", "tests/test_tui_into_folder.py"]
SMOKE_FILES = ["tests/test_answers.py"]

GC_CLOCK = '''
"""Adds up the collector's time in this pytest process and writes it where GC_CLOCK_OUT says, at the end."""
import gc, json, os, time

_started = []
_spent = {"seconds": 0.0, "collections": 0, "full": 0}


def _clock(phase, info):
    if phase == "start":
        _started.append(time.process_time())
    elif _started:
        _spent["seconds"] += time.process_time() - _started.pop()
        _spent["collections"] += 1
        _spent["full"] += info["generation"] == 2


gc.callbacks.append(_clock)


def pytest_unconfigure(config):
    with open(os.environ["GC_CLOCK_OUT"], "w") as out:
        json.dump({**_spent, "threshold": gc.get_threshold(), "frozen": gc.get_freeze_count()}, out)
'''


def python_defaults() -> list[int]:
    """The collector thresholds a fresh interpreter of this Python starts with."""
    done = subprocess.run(
        [sys.executable, "-c", "import gc; print(*gc.get_threshold())"], capture_output=True, text=True
    )
    return [int(value) for value in done.stdout.split()]


def clean_environment(scratch: Path, out: Path) -> dict[str, str]:
    """This process's environment for a pytest of its own: none of an outer pytest's xdist or cost recording."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_") and k != "NPU_WIZARD_TEST_COSTS"}
    return {**env, "PYTHONPATH": os.pathsep.join([str(scratch), str(ROOT)]), "GC_CLOCK_OUT": str(out)}


def run_once(files: list[str], tuned: bool, scratch: Path, defaults: list[int]) -> dict[str, float]:
    """One pytest process over `files`; its CPU, wall and collector seconds."""
    out = scratch / "gc.json"
    env = clean_environment(scratch, out)
    command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:xdist", "-p", "gc_clock"]
    if not tuned:
        command += ["-p", "no:tests.gc_tuning"]
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    began = time.perf_counter()
    done = subprocess.run([*command, *files], cwd=ROOT, env=env, capture_output=True, text=True, timeout=1800)
    wall = time.perf_counter() - began
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode != 0:
        raise SystemExit(f"the tests failed ({'tuned' if tuned else 'baseline'}):\n{done.stdout[-3000:]}")
    spent = json.loads(out.read_text())
    expected = [YOUNG_THRESHOLD, *defaults[1:]] if tuned else defaults
    if spent["threshold"] != expected:
        raise SystemExit(f"the {'tuned' if tuned else 'baseline'} run had the thresholds {spent['threshold']}")
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return {"cpu": cpu, "wall": wall, "gc": spent["seconds"], "full": spent["full"], "frozen": spent["frozen"]}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("files", nargs="*", help=f"test files (default: {' '.join(DEFAULT_FILES)})")
    parser.add_argument("--rounds", type=int, default=3, help="runs of each kind, taking turns (default 3)")
    parser.add_argument("--smoke", action="store_true", help="one round of one small test file")
    args = parser.parse_args(argv)
    files = args.files or (SMOKE_FILES if args.smoke else DEFAULT_FILES)
    rounds = 1 if args.smoke else args.rounds
    figures: dict[str, list[dict[str, float]]] = {"baseline": [], "tuned": []}
    with tempfile.TemporaryDirectory(prefix="npu-wizard-gc-") as folder:
        scratch = Path(folder)
        (scratch / "gc_clock.py").write_text(GC_CLOCK)
        defaults = python_defaults()
        for round_ in range(rounds):
            order = ("baseline", "tuned") if round_ % 2 == 0 else ("tuned", "baseline")
            for kind in order:
                figures[kind].append(run_once(files, kind == "tuned", scratch, defaults))
                last = figures[kind][-1]
                print(
                    f"round {round_ + 1}: {kind:<8} {last['cpu']:6.1f} CPU s, {last['wall']:6.1f} wall s, "
                    f"{last['gc']:5.2f} s in the collector ({last['full']:.0f} full collections)",
                    flush=True,
                )
    median = {kind: {key: statistics.median(r[key] for r in runs) for key in runs[0]} for kind, runs in figures.items()}
    base, tuned = median["baseline"], median["tuned"]
    print(f"\n{' '.join(files)}, median of {rounds} round(s)")
    thresholds = "/".join(map(str, defaults))
    print(f"baseline (Python's defaults, {thresholds}): {base['cpu']:.1f} CPU s, {base['gc']:.2f} s in the collector")
    print(
        f"tests/gc_tuning.py ({tuned['frozen']:.0f} objects frozen): {tuned['cpu']:.1f} CPU s, "
        f"{tuned['gc']:.2f} s in the collector"
    )
    saved = base["cpu"] - tuned["cpu"]
    print(f"CPU s saved: {saved:+.1f} ({saved / base['cpu']:.0%}); in the collector: {base['gc'] - tuned['gc']:+.2f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
