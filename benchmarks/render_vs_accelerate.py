"""Time `npu-wizard --answers` against `accelerate config default`, in one run.

Both are run as a user runs them: a fresh process each time, writing into a
fresh temporary folder, the commands taking turns so that a busy machine slows
them alike. Prints the median of each, the ratio, and the target (npu-wizard at
least 6x faster). npu-wizard is timed with its compiled-template cache warm
(the untimed first round fills it) and without it. `--against REV` also times
the same render by an earlier npu-wizard (a temporary git worktree of REV), so
a change can show it made the render no slower.

    python benchmarks/render_vs_accelerate.py [--repeat 7] [--example examples/cpu-demo.yaml] [--against REV]
    python benchmarks/render_vs_accelerate.py --smoke   # one round, no warm-up; npu-wizard alone without accelerate
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TARGET_RATIO = 6.0


@dataclass(frozen=True)
class Command:
    """One command to time: what it is called in the report, its argv ({tmp}: a fresh folder), where and how."""

    label: str
    argv: list[str]
    cwd: Path | None = None
    env: dict[str, str] | None = None


def time_interleaved(commands: list[Command], repeat: int, warm_up: bool = True) -> dict[str, list[float]]:
    """Wall-clock seconds of `repeat` fresh runs of each command, taking turns so load drift hits all alike.

    An extra first round (`warm_up`) warms the disk cache (and npu-wizard's template cache) and is not counted.
    """
    timings: dict[str, list[float]] = {command.label: [] for command in commands}
    for attempt in range(0 if warm_up else 1, repeat + 1):
        for command in commands:
            with tempfile.TemporaryDirectory() as scratch:
                filled = [part.replace("{tmp}", scratch) for part in command.argv]
                start = time.perf_counter()
                subprocess.run(filled, check=True, capture_output=True, cwd=command.cwd, env=command.env)
                if attempt:
                    timings[command.label].append(time.perf_counter() - start)
    return timings


def main() -> int:
    """Run the comparison and print the figures."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=7)
    parser.add_argument("--example", default=str(ROOT / "examples" / "cpu-demo.yaml"))
    parser.add_argument("--against", metavar="REV", help="also time the render of this earlier git revision")
    parser.add_argument(
        "--smoke", action="store_true", help="one round; without accelerate, npu-wizard's side alone (no ratio)"
    )
    args = parser.parse_args()
    if args.smoke:
        args.repeat = 1
    accelerate = shutil.which("accelerate", path=str(Path(sys.executable).parent)) or shutil.which("accelerate")
    if accelerate is None and not args.smoke:
        print("accelerate is not installed: pip install -e '.[bench]'", file=sys.stderr)
        return 1
    render = [sys.executable, "-m", "wizard", "--answers", str(Path(args.example).resolve()), "-o", "{tmp}"]
    commands = [
        Command("ours", render, ROOT),
        Command("uncached", render, ROOT, {**os.environ, "NPU_WIZARD_CACHE_DIR": ""}),
    ]
    if accelerate is not None:
        commands.append(Command("accelerate", [accelerate, "config", "default", "--config_file", "{tmp}/config.yaml"]))
    with contextlib.ExitStack() as stack:
        if args.against:
            tree = stack.enter_context(worktree(args.against))
            commands.append(Command("earlier", render, tree, {**os.environ, "NPU_WIZARD_CACHE_DIR": ""}))
        timings = time_interleaved(commands, args.repeat, warm_up=not args.smoke)  # smoke: figures mean nothing
    medians = {label: statistics.median(times) * 1000 for label, times in timings.items()}
    runs = len(timings["ours"])
    print(f"npu-wizard --answers {Path(args.example).name}: median {medians['ours']:7.1f} ms over {runs} runs")
    print(f"  without its template cache (a first render):  {medians['uncached']:7.1f} ms")
    if accelerate is None:
        print("accelerate config default: not timed, accelerate is not installed (pip install -e '.[bench]'): no ratio")
    else:
        ratio = medians["accelerate"] / medians["ours"]
        print(f"accelerate config default:            median {medians['accelerate']:7.1f} ms over {runs} runs")
        verdict = "meets" if ratio >= TARGET_RATIO else "MISSES"
        print(f"ratio: npu-wizard is {ratio:.1f}x faster ({verdict} the {TARGET_RATIO:g}x target)")
    if args.against:
        print(f"npu-wizard at {args.against} (no template cache then): median {medians['earlier']:7.1f} ms")
        for label, name in (("ours", "with its cache"), ("uncached", "without")):
            change = (medians[label] / medians["earlier"] - 1) * 100
            print(f"this version {name} against {args.against}: {change:+.1f}% render time")
    print("runs took turns, one of each command per round")
    return 0


@contextlib.contextmanager
def worktree(revision: str) -> Iterator[Path]:
    """A temporary git worktree of `revision`: run there, its own wizard package comes first on the path."""
    with tempfile.TemporaryDirectory() as scratch:
        tree = Path(scratch) / "tree"
        subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "-q", "--detach", str(tree), revision], check=True)
        try:
            yield tree
        finally:
            subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(tree)], check=True)


if __name__ == "__main__":
    sys.exit(main())
