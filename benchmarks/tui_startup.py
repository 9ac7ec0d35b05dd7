"""Time from a fresh interpreter to the wizard's first interactive screen, against a bare Textual app.

Each sample starts `python -c ...` that builds the app, runs it headless and
exits as soon as the first screen has been laid out and focused; the figure
is the whole wall time of that process, interpreter start included, so the
difference to the baseline (one Label) is what npu-wizard adds.

    python benchmarks/tui_startup.py [--runs 7]
    python benchmarks/tui_startup.py --smoke   # one run each, no warm-up, exit 0 whatever the time (smoke test)
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time

TARGET_S = 0.6

BASELINE = """
from textual.app import App
from textual.widgets import Label

class Bare(App):
    def compose(self):
        yield Label("hello")
    def on_mount(self):
        self.call_after_refresh(self.exit)

Bare().run(headless=True, size=(80, 24))
"""

WIZARD = """
from wizard.tui import create_app
from wizard.tui.screens import StepScreen

app = create_app()

def ready():
    if not isinstance(app.screen, StepScreen) or app.screen.focused is None:
        app.call_later(ready)  # not there yet: the first step is still being mounted
        return
    app.exit()

app.call_later(lambda: app.screen.call_after_refresh(ready))
app.run(headless=True, size=(80, 24))
"""


def sample(code: str) -> float:
    """Wall seconds of one fresh interpreter running `code`."""
    start = time.perf_counter()
    subprocess.run([sys.executable, "-c", code], check=True)
    return time.perf_counter() - start


def measure(code: str, runs: int, warm_up: bool = True) -> list[float]:
    """Several samples after one warm-up run (which fills the OS file cache)."""
    if warm_up:
        sample(code)
    return [sample(code) for _ in range(runs)]


def main() -> int:
    """Print the figures; exit 1 when the wizard's best run misses the target."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=9)
    parser.add_argument("--smoke", action="store_true", help="tiny sizes: checks that it runs and prints (seconds)")
    args = parser.parse_args()
    if args.smoke:
        args.runs = 1
    # --smoke: no warm-up runs (2 interpreters fewer), the figures of a smoke run mean nothing
    baseline = measure(BASELINE, args.runs, warm_up=not args.smoke)
    wizard = measure(WIZARD, args.runs, warm_up=not args.smoke)
    for name, times in (("bare Textual app (1 Label)", baseline), ("npu-wizard first screen", wizard)):
        print(
            f"{name:28} median {statistics.median(times):.3f} s  "
            f"min {min(times):.3f} s  max {max(times):.3f} s  ({len(times)} runs)"
        )
    # The best of several runs is the figure least disturbed by other load (as timeit advises);
    # the median is printed beside it for a loaded machine.
    added = min(wizard) - min(baseline)
    verdict = "ok" if min(wizard) < TARGET_S else "MISSED"
    print(f"npu-wizard adds {added:.3f} s to a bare app (best runs); target < {TARGET_S} s: {verdict}")
    return 0 if verdict == "ok" or args.smoke else 1


if __name__ == "__main__":
    sys.exit(main())
