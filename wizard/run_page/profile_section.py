"""The report's section on the profile windows: per rank, and a straggler beside its median rank."""

from __future__ import annotations

from html import escape
from pathlib import Path
from typing import Any

from wizard.run_page.profiles import (
    CATEGORIES,
    EVENT_CAP,
    OPERATOR_CAP,
    OTHER_OPERATORS,
    RankProfile,
    differences,
    find_all_traces,
    read_profile,
    traces_of_asks,
)


def profile_section(run_dir: Path, summary: dict[str, Any], cap: int = EVENT_CAP) -> str:
    """HTML for every profiled rank of the run; '' where none was profiled."""
    every = find_all_traces(run_dir)
    asked = [pair for pair in (summary.get("profile") or {}).get("asked", []) if isinstance(pair, dict)]
    if not every and not asked:
        return ""
    read: dict[Path, RankProfile] = {}

    def profile_of(rank: int, path: Path) -> RankProfile:
        if path not in read:
            read[path] = read_profile(rank, path, cap)
        return read[path]

    profiles = {rank: profile_of(rank, paths[-1]) for rank, paths in every.items()}  # each rank's newest
    parts = [
        "<h2>Profile</h2>",
        f'<p class="meta">traces in {escape(str(run_dir / "profile"))}: open a rank-N/*.pt.trace.json in '
        "Perfetto (ui.perfetto.dev) or chrome://tracing, or run tensorboard --logdir on that folder "
        "(the profile plugin); an NPU's are in profile/ascend, for msprof-analyze -d. Time is per recorded step; "
        "by category on the thread that ran the steps.</p>",
    ]
    for pair, traces in zip(asked, traces_of_asks(asked, every), strict=True):
        parts.append(_comparison(pair, {rank: profile_of(rank, path) for rank, path in traces.items()}))
    parts.extend(_rank(profile) for profile in profiles.values())
    return "\n".join(parts)


def _comparison(pair: dict[str, Any], profiles: dict[int, RankProfile]) -> str:
    slow, median = pair.get("straggler"), pair.get("median")
    title = f"Straggler rank {escape(str(slow))} beside median rank {escape(str(median))}"
    if slow not in profiles or median not in profiles:
        missing = [str(rank) for rank in (slow, median) if rank not in profiles]
        return f'<div class="box"><h3>{title}</h3><p class="missing">no trace of rank {", ".join(missing)}</p></div>'
    a, b = profiles[slow], profiles[median]
    traces = f'<p class="meta">traces {escape(str(a.trace))} and {escape(str(b.trace))}</p>'
    rows = "".join(
        f"<tr><td>{escape(name)}</td><td>{mine:.2f}</td><td>{theirs:.2f}</td><td>{mine - theirs:+.2f}</td></tr>"
        for name, mine, theirs in differences(a, b)
    )
    times = "".join(
        f"<tr><td>{category}</td><td>{a.per_step_ms(a.categories.get(category, 0.0)):.2f}</td>"
        f"<td>{b.per_step_ms(b.categories.get(category, 0.0)):.2f}</td></tr>"
        for category in CATEGORIES
    )
    return (
        f'<div class="box"><h3>{title}</h3>{traces}'
        f"<table><tr><th>category</th><th>rank {slow} ms/step</th><th>rank {median} ms/step</th></tr>{times}</table>"
        "<p>operators whose time differs most, either way (+: the straggler spends more, -: the median rank does):</p>"
        f"<table><tr><th>operator</th><th>rank {slow} ms/step</th><th>rank {median} ms/step</th>"
        f"<th>difference</th></tr>{rows}</table></div>"
    )


def _rank(profile: RankProfile) -> str:
    times = "".join(
        f"<tr><td>{category}</td><td>{profile.per_step_ms(profile.categories.get(category, 0.0)):.2f}</td>"
        f"<td>{_share(profile, category)}</td></tr>"
        for category in CATEGORIES
    )
    top = "".join(
        f"<tr><td>{escape(name)}</td><td>{ms:.3f}</td><td>{calls}</td></tr>" for name, ms, calls in profile.top()
    )
    notes = []
    reading = profile.reading
    if reading.capped:
        objects = "" if reading.elements == reading.events else f" ({reading.events:,} of them events)"
        notes.append(f"capped: only the first {reading.elements:,} events of the trace were read{objects}")
    if profile.odd_threads:
        notes.append(f"{profile.odd_threads:,} events left out: their pid or tid is no number or string")
    if profile.odd_times:
        notes.append(f"{profile.odd_times:,} events left out: their ts or dur is no finite number")
    if profile.folded:
        notes.append(
            f"{profile.folded:,} events of operators past the first {OPERATOR_CAP:,} names are counted as "
            f"{OTHER_OPERATORS}"
        )
    if profile.reading.broken:
        notes.append(f"the trace could not be read to its end: {profile.reading.broken}")
    if not profile.steps:
        notes.append("no ProfilerStep spans in the trace: the time by category is empty")
    said = "".join(f'<p class="missing">{escape(note)}</p>' for note in notes)
    return (
        f'<div class="box"><h3>Rank {profile.rank}</h3>'
        f'<p class="meta">{profile.steps} step(s) recorded, {profile.per_step_ms(profile.step_us):.2f} ms a step; '
        f"trace {escape(str(profile.trace))}</p>{said}"
        f"<table><tr><th>category</th><th>ms/step</th><th>share</th></tr>{times}</table>"
        f"<p>top {len(profile.top())} operators by self time:</p>"
        f"<table><tr><th>operator</th><th>self ms/step</th><th>calls</th></tr>{top}</table></div>"
    )


def _share(profile: RankProfile, category: str) -> str:
    if profile.step_us <= 0:
        return ""
    return f"{100 * profile.categories.get(category, 0.0) / profile.step_us:.0f}%"
