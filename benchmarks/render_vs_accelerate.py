"""Time `npu-wizard --answers` against `accelerate config default`, in one run.

Both are run as a user runs them: a fresh process each time, writing into a
fresh temporary folder. Prints the median of each, the ratio, and the target
(npu-wizard at least 6x faster). npu-wizard is timed with its compiled-template
cache warm (the untimed first run fills it) and without it. `--against REV` also times the same render
by an earlier npu-wizard (a temporary git worktree of REV), so a change can
show it made the render no slower.

    python benchmarks/render_vs_accelerate.py [--repeat 7] [--example examples/cpu-demo.yaml] [--against REV]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TARGET_RATIO = 6.0


def time_command(
    command: list[str], repeat: int, cwd: Path | None = None, env: dict[str, str] | None = None
) -> list[float]:
    """Wall-clock seconds of `repeat` fresh runs of `command` (an extra first run warms the disk cache)."""
    timings = []
    for attempt in range(repeat + 1):
        with tempfile.TemporaryDirectory() as scratch:
            filled = [part.replace("{tmp}", scratch) for part in command]
            start = time.perf_counter()
            subprocess.run(filled, check=True, capture_output=True, cwd=cwd, env=env)
            if attempt:
                timings.append(time.perf_counter() - start)
    return timings


def main() -> int:
    """Run the comparison and print the figures."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=7)
    parser.add_argument("--example", default=str(ROOT / "examples" / "cpu-demo.yaml"))
    parser.add_argument("--against", metavar="REV", help="also time the render of this earlier git revision")
    args = parser.parse_args()
    accelerate = shutil.which("accelerate", path=str(Path(sys.executable).parent)) or shutil.which("accelerate")
    if accelerate is None:
        print("accelerate is not installed: pip install -e '.[bench]'", file=sys.stderr)
        return 1
    render = [sys.executable, "-m", "wizard", "--answers", str(Path(args.example).resolve()), "-o", "{tmp}"]
    ours = time_command(render, args.repeat, cwd=ROOT)
    uncached = time_command(render, args.repeat, cwd=ROOT, env={**os.environ, "NPU_WIZARD_CACHE_DIR": ""})
    theirs = time_command([accelerate, "config", "default", "--config_file", "{tmp}/config.yaml"], args.repeat)
    earlier = time_earlier(args.against, render, args.repeat) if args.against else None
    ours_median, theirs_median = statistics.median(ours), statistics.median(theirs)
    ratio = theirs_median / ours_median
    print(f"npu-wizard --answers {Path(args.example).name}: median {ours_median * 1000:7.1f} ms over {len(ours)} runs")
    print(
        f"  the same without its template cache: median {statistics.median(uncached) * 1000:7.1f} ms "
        "(a first render, or NPU_WIZARD_CACHE_DIR='')"
    )
    print(f"accelerate config default:            median {theirs_median * 1000:7.1f} ms over {len(theirs)} runs")
    verdict = "meets" if ratio >= TARGET_RATIO else "MISSES"
    print(f"ratio: npu-wizard is {ratio:.1f}x faster ({verdict} the {TARGET_RATIO:g}x target)")
    if earlier is not None:
        earlier_median = statistics.median(earlier)
        change = (ours_median / earlier_median - 1) * 100
        print(f"npu-wizard at {args.against}: median {earlier_median * 1000:7.1f} ms over {len(earlier)} runs")
        print(f"this version against {args.against}: {change:+.1f}% render time")
    return 0


def time_earlier(revision: str, render: list[str], repeat: int) -> list[float]:
    """`render` timed in a temporary worktree of `revision` (its own wizard package comes first on the path)."""
    with tempfile.TemporaryDirectory() as scratch:
        tree = Path(scratch) / "tree"
        subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "-q", "--detach", str(tree), revision], check=True)
        try:
            return time_command(render, repeat, cwd=tree)
        finally:
            subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(tree)], check=True)


if __name__ == "__main__":
    sys.exit(main())
