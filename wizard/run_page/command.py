"""`npu-wizard report RUN`: write report.html into a run folder, and the plots as PNG files on request."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from wizard.atomic_files import write_atomically
from wizard.errors import TargetError, WizardError
from wizard.monitor.attach import run_folder_path

REPORT_FILE = "report.html"


@dataclass(frozen=True)
class Written:
    """What a report wrote: the page and the PNG files."""

    page: Path
    pngs: list[Path]


def write_report(run_dir: Path, png_dir: Path | None = None, *, force: bool = False) -> Written:
    """Read the run folder `run_dir`, write `report.html` in it (and each plot into `png_dir`); return the paths.

    report.html is the run folder's own and is replaced; a PNG file already in `png_dir` only with `force`.
    """
    if png_dir is not None and png_dir.exists() and not png_dir.is_dir():
        raise TargetError(f"--png {png_dir}: that is a file; give a folder for the PNG files")
    try:
        from wizard.run_page.inferred import effective_summary
        from wizard.run_page.page import render_page
        from wizard.run_page.plots import draw_all
    except ImportError as error:  # matplotlib is a dependency; a broken install says which part is missing
        raise TargetError(f"the report needs matplotlib ({error}): pip install matplotlib") from error
    from wizard.run_page.record import read_run

    try:
        record = read_run(run_dir)
    except OSError as error:
        raise TargetError(f"cannot read the run folder {run_dir}: {error}") from error
    summary = effective_summary(record)
    plots = draw_all(record, summary)
    drawn = [(png_dir / f"{plot.name}.png", plot.png) for plot in plots if png_dir is not None and plot.png]
    taken = [path.name for path, _ in drawn if path.is_symlink() or path.exists()]
    if taken and not force:
        raise TargetError(
            f"--png {png_dir}: {_names(taken)} {'is' if len(taken) == 1 else 'are'} there already; nothing was "
            f"written (add --force to replace {'it' if len(taken) == 1 else 'them'}, or give another folder)"
        )
    page = run_dir / REPORT_FILE
    _write(page, render_page(record, plots, summary).encode())
    if png_dir is not None:
        try:
            png_dir.mkdir(parents=True, exist_ok=True)
        except OSError as error:
            raise TargetError(f"--png {png_dir}: cannot make that folder ({error.strerror or error})") from error
    for path, png in drawn:
        _write(path, png)
    return Written(page, [path for path, _ in drawn])


def report(path: Path, png_dir: Path | None = None, *, force: bool = False) -> Written:
    """The report of the run folder at `path`, or of the newest run of the project at `path`."""
    return write_report(run_folder_path(path), png_dir, force=force)


def report_line(run_dir: Path) -> str:
    """The last line of `run` and `monitor`: the report's path where one was written, else how to write one."""
    page = run_dir / REPORT_FILE
    return f"report: {page}" if page.is_file() else f"draw this run: npu-wizard report {run_dir}"


def report_at_end(run_dir: Path) -> str:
    """Write the report of a run that just ended (`run --report`); a report that fails says so, never raises."""
    try:
        write_report(run_dir)
    except Exception as error:  # whatever drawing met, the run's own outcome, root cause and exit code stand
        said = str(error) if isinstance(error, WizardError) else f"{type(error).__name__}: {error}"
        return f"warning: report not written ({(said.splitlines() or [''])[0]})"
    return report_line(run_dir)


def _names(names: list[str]) -> str:
    return names[0] if len(names) == 1 else f"{', '.join(names[:-1])} and {names[-1]}"


def _write(path: Path, data: bytes) -> None:
    try:
        write_atomically(path, data)
    except OSError as error:
        raise TargetError(
            f"cannot write {path}: {error.strerror or error} (make {path.parent} writable, or move what is in the way)"
        ) from error
