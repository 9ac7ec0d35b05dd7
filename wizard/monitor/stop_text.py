"""What `npu-wizard run` says when it stops a job: what SIGTERM does to the ranks of this script, truly.

The generated train.py always saves a checkpoint at its next logged step on SIGTERM. A user's own script
does only where it asks `report.should_stop()` (runtime/preemption.py): a rank says so once, with a
`stop_asked` event, the first time its script asks; a script that never asks gets the signal as it would
without npu-wizard (preemption.install leaves a handler of the script's own in place): it ends on it unless it
saves on SIGTERM itself.
"""

from __future__ import annotations

from wizard.monitor.hang_verdict import ranks_text
from wizard.monitor.state import JobState


def stop_words(state: JobState, *, own_script: bool, grace: float) -> str:
    """The line said as every rank is sent SIGTERM with `grace` seconds to save and exit."""
    then = f"what still runs in {grace:g} s is killed (--save-grace S; Ctrl-C again kills it now)"
    if not own_script:
        return f"stopping: every rank was sent SIGTERM to save a checkpoint at its next logged step; {then}"
    asking = sorted(rank for rank, view in state.ranks.items() if view.asks_stop)
    if not asking:
        return (
            "stopping: every rank was sent SIGTERM, which reaches your script as it would without npu-wizard: it "
            "never asked report.should_stop(), so no checkpoint is saved on the way unless your script saves on "
            f"SIGTERM itself; {then}"
        )
    if len(asking) == len(state.ranks):
        return (
            "stopping: every rank was sent SIGTERM; your script asks report.should_stop(), so each rank saves when "
            f"it next asks and exits; {then}"
        )
    return (
        f"stopping: every rank was sent SIGTERM; {ranks_text(asking)} asked report.should_stop() and save when they "
        f"next ask, the others never asked and end on the signal unless your script saves on SIGTERM itself; {then}"
    )
