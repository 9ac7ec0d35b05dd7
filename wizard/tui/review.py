"""The review page (answers, warnings, files, previews, output folder) and the page after rendering."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from rich.text import Text
from textual import on, work
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, ScrollableContainer, VerticalScroll
from textual.screen import Screen
from textual.widgets import Checkbox, Header, Input, Label, Static, TabbedContent, TabPane

from wizard.answers.questions import QUESTIONS, STEP_TITLES, STEPS
from wizard.errors import Problem, TargetError, WizardError
from wizard.tui.footer import KeysFooter
from wizard.tui.host import WizardHost
from wizard.tui.into_folder import into_target, problem_of
from wizard.tui.preview import RENDER_LOCK, Preview, build_preview, file_tree
from wizard.tui.screens import ConfirmScreen
from wizard.tui.state import as_text

if TYPE_CHECKING:
    from textual.timer import Timer

    from wizard.render.render import RenderResult

PAUSE_S = 0.4  # the folder's preview waits for a pause in typing (a dry-run render per key would lag)


def answers_text(values: dict[str, object], problems: list[Problem]) -> Text:
    """The answers step by step, then every error and warning."""
    text = Text()
    errors = [p for p in problems if p.severity == "error"]
    warnings = [p for p in problems if p.severity != "error"]
    for problem in errors:
        text.append(f"x {problem}\n", style="bold red")
    for problem in warnings:
        text.append(f"! {problem}\n", style="yellow")
    if problems:
        text.append("\n")
    memory = memory_text(values)
    if memory is not None:
        text.append_text(memory)
        text.append("\n\n")
    step = None
    # step by step as the wizard asked them (the engine is asked after the topology)
    for question in sorted(QUESTIONS, key=lambda q: STEPS.index(q.step)):
        if question.name not in values:
            continue
        if question.step != step:
            step = question.step
            text.append(f"{STEP_TITLES[step]}\n", style="bold")
        text.append(f"  {question.prompt}: ", style="dim")
        text.append(as_text(question, values[question.name]) or "(empty)")
        text.append("\n")
    return text


def memory_text(values: dict[str, object]) -> Text | None:
    """The estimated memory per rank against one device (the series' card on an NPU), and what fits if not.

    The review page cannot see the machines, so a CPU or auto project is weighed against nothing here:
    npu-wizard doctor on the node weighs it against that host or its GPU.
    """
    from wizard.answers.script import is_foreign
    from wizard.memory.estimate import ModelUnknown, gib
    from wizard.memory.fit import advise, breakdown, fits_words, npu_capacity

    if is_foreign(values.get("training.script")) or "training.batch_size" not in values:
        return None
    capacity = npu_capacity(str(values.get("hardware"))) if values.get("device") == "npu" else None
    try:
        advice = advise(values, capacity)
    except ModelUnknown as error:
        return Text(f"Memory per rank: not estimated here ({error}); npu-wizard doctor estimates it on the node")
    said = f"Memory per rank (estimate): {breakdown(advice.chosen)}"
    if capacity is None:
        return Text(said + "; npu-wizard doctor weighs it against the node's memory")
    said += f", of {gib(capacity.bytes)} ({capacity.what})"
    if advice.fits:
        return Text(said)
    return Text(f"! {said}: does not fit; would fit: {fits_words(advice)}", style="yellow")


class ReviewScreen(Screen[None]):
    """Everything that will be written, before it is; Render writes it."""

    BINDINGS = [
        Binding("ctrl+r", "render", "Render"),
        Binding("escape", "back", "Back"),
    ]

    app: WizardHost  # the WizardApp (wizard.tui.app), as wizard.tui.host describes it

    def compose(self) -> ComposeResult:
        """The output folder, then tabs of answers, files and previews."""
        yield Header()
        with Horizontal(id="output-row"):
            yield Label("Output folder", classes="prompt")
            yield Input(str(self.app.output_dir), id="output")
        yield Checkbox("Into this folder itself (your repository, as --into)", self.app.into, id="into")
        with Horizontal(id="folder-row"):
            yield Label("Folder in the repository", classes="prompt")
            yield Input(self.app.state.folder, id="folder")
        yield Static("", id="target")
        with TabbedContent(id="tabs"):
            with TabPane("Answers", id="tab-answers"), VerticalScroll():
                yield Static("", id="answers")
            with TabPane("Files", id="tab-files"), VerticalScroll():
                yield Static("working out the files...", id="files")
            if self.app.state.values.get("cluster.engine") == "slurm":
                with TabPane("slurm/job.sbatch", id="tab-sbatch"), ScrollableContainer():
                    yield Static("", id="sbatch", classes="source")
            with TabPane("launch/run-node.sh", id="tab-launch"), ScrollableContainer():
                yield Static("", id="launch", classes="source")
            with TabPane("sysctl snippet", id="tab-sysctl"), ScrollableContainer():
                yield Static("", id="sysctl", classes="source")
        yield KeysFooter()

    def on_mount(self) -> None:
        """Show the answers and start working out the previews."""
        self.sub_title = "Review: nothing is written before ^r"
        self.query_one("#output", Input).cursor_blink = self.app.blink
        self.query_one("#folder", Input).cursor_blink = self.app.blink
        self.query_one("#folder-row").display = self.app.into
        self.folder_timer: Timer | None = None
        state = self.app.state
        self.query_one("#answers", Static).update(answers_text(state.values, [*state.file_problems, *state.problems]))
        self.show_target()
        self.preview()

    @on(Input.Changed, "#output")
    def output_changed(self, event: Input.Changed) -> None:
        """A new folder: say again what rendering there would do."""
        self.app.output_dir = Path(event.value.strip() or ".")
        self.show_target()

    @on(Checkbox.Changed, "#into")
    def into_changed(self, event: Checkbox.Changed) -> None:
        """Into the folder itself, or a new project folder in it: say again what rendering would do."""
        self.app.into = event.value
        self.query_one("#folder-row").display = event.value
        self.show_target()
        self.preview()

    @on(Input.Changed, "#folder")
    def folder_changed(self, event: Input.Changed) -> None:
        """Another folder of the repository: say so now, preview it once typing pauses."""
        self.app.state.folder = event.value.strip().rstrip("/") or event.value.strip()
        self.show_target()
        if self.folder_timer is not None:
            self.folder_timer.stop()
        self.folder_timer = self.set_timer(PAUSE_S, self.preview)

    def target(self) -> Path:
        """The folder the render writes: the project's folder of the output folder (into), else its <project_name>
        folder."""
        if self.app.into:
            return into_target(self.app.output_dir, self.app.state.folder)
        return self.app.output_dir / self.app.state.values["project_name"]

    def show_target(self) -> None:
        """Whether rendering creates the project folder or replaces one (after asking)."""
        state = self.app.state
        if state.errors():
            step = STEP_TITLES[state.first_step_with_errors() or "project"]
            self.show_blocked(f"fix the errors first (step {step}); esc goes back")
            return
        if self.app.into and problem_of(self.app.state.folder):
            self.show_blocked(problem_of(self.app.state.folder))
            return
        target = self.target()
        exists = target.exists() and not self.app.into
        verb = "replaces (asks first)" if exists else "creates"
        if self.app.into:
            verb = "adds npu-wizard's files to"
        if self.updates(target):
            verb = "updates (a three-way merge that keeps your edits)"
        self.query_one("#target", Static).update(Text(f"{verb} {target}", style="yellow" if exists else ""))

    @on(Input.Submitted, "#output")
    def output_submitted(self) -> None:
        """Enter in the folder field renders."""
        self.action_render()

    @work(thread=True, exclusive=True, group="preview")
    def preview(self) -> None:
        """Dry-run the render in a thread and show what it would write."""
        state = self.app.state
        if state.errors():
            return
        with RENDER_LOCK:
            try:
                preview = build_preview(state.answers(), self.app.output_dir)
                if self.app.into and not self.updates(self.target()):  # the files as --into names them, or why not
                    preview = self.into_preview(preview)
            except WizardError as error:
                self.app.call_from_thread(self.show_blocked, str(error))
                return
        self.app.call_from_thread(self.show_preview, preview)

    def into_preview(self, preview: Preview) -> Preview:
        """The preview with the files a render into the output folder writes; TargetError as --into refuses."""
        from dataclasses import replace

        from wizard.render.into import render_into

        folder = self.app.state.folder
        if problem_of(folder):
            raise TargetError(problem_of(folder))
        result = render_into(self.app.state.answers(), self.app.output_dir, dry_run=True, subfolder=folder)
        return replace(preview, target=result.project_dir, files=result.files)

    def show_blocked(self, message: str) -> None:
        """Say why nothing can be previewed or rendered."""
        self.query_one("#target", Static).update(Text("x " + message, style="bold red"))
        for name in ("files", "launch", "sysctl"):
            self.query_one("#" + name, Static).update(Text(message))
        for sbatch in self.query("#sbatch").results(Static):
            sbatch.update(Text(message))

    def show_preview(self, preview: Preview) -> None:
        """Show the file tree and the previews."""
        folder = self.app.state.folder.strip().rstrip("/")
        root = folder if self.app.into and folder != "." and preview.target != self.app.output_dir else None
        self.query_one("#files", Static).update(Text(file_tree(root or preview.target.name, preview.files)))
        self.query_one("#launch", Static).update(Text(preview.launch_script))
        self.query_one("#sysctl", Static).update(Text(preview.sysctl_snippet))
        for sbatch in self.query("#sbatch").results(Static):
            sbatch.update(Text(preview.sbatch or ""))

    def action_back(self) -> None:
        """Back to the last step."""
        self.app.pop_screen()

    def action_render(self) -> None:
        """Render, asking first when the project folder exists."""
        state = self.app.state
        if state.errors():
            first = state.errors()[0]
            self.notify(f"{first.field}: {first.message}", title="Cannot render yet", severity="error")
            return
        target = self.target()
        if self.updates(target):
            self.update(target)
        elif self.app.into:
            self.write(force=False)
        elif target.exists():
            self.show_target()  # the folder may have appeared since the page was drawn
            question = f"{target} already exists.\nReplace npu-wizard's files in it? Yours are kept."
            self.app.push_screen(ConfirmScreen(question), self.confirmed)
        else:
            self.write(force=False)

    def confirmed(self, replace: bool | None) -> None:
        """Render over the folder only on an explicit yes."""
        if replace:
            self.write(force=True)
        else:
            self.notify("Nothing was written; choose another output folder or project name.")

    @work(thread=True, exclusive=True, group="render")
    def write(self, force: bool) -> None:
        """Render with the same function as --answers, in a thread."""
        from wizard.render.into import render_into
        from wizard.render.render import render

        try:
            with RENDER_LOCK:
                if self.app.into:  # the same checks and refusals as --into
                    folder = self.app.state.folder
                    if problem_of(folder):
                        raise TargetError(problem_of(folder))
                    result = render_into(self.app.state.answers(), self.app.output_dir, subfolder=folder)
                else:
                    result = render(self.app.state.answers(), self.app.output_dir, force=force)
        except WizardError as error:
            self.app.call_from_thread(self.notify, str(error), title="Not rendered", severity="error")
            return
        self.app.call_from_thread(self.app.rendered, result)

    def updates(self, target: Path) -> bool:
        """Whether rendering updates `target`: --edit of a project npu-wizard rendered."""
        from wizard.render.pristine import PRISTINE

        return self.app.answers_path is not None and (target / PRISTINE).is_file()

    @work(thread=True, exclusive=True, group="render")
    def update(self, target: Path) -> None:
        """Merge the edited answers into the project as `npu-wizard update` does; change nothing on a conflict."""
        from wizard.render.conflict_markers import refuse_unresolved
        from wizard.render.project_locks import update_lock
        from wizard.render.render import RenderResult
        from wizard.render.update import plan_update
        from wizard.render.update_command import write

        try:
            with RENDER_LOCK, update_lock(target, "npu-wizard --edit (the wizard)"):
                plan = plan_update(target, self.app.state.answers(), keep_answers_file=False)
                refuse_unresolved(target, "render again")  # markers of an earlier update --write-conflicts
                if not plan.conflicts:
                    write(plan)
        except WizardError as error:
            self.app.call_from_thread(self.notify, str(error), title="Not updated", severity="error")
            return
        if plan.conflicts:
            where = "\n".join(change.describe() for change in plan.conflicts)
            message = (
                f"Nothing was written: your edits and the new answers change the same lines:\n{where}\n"
                f"Resolve them in the files with: npu-wizard update {target} --answers FILE --write-conflicts"
            )
            self.app.call_from_thread(self.notify, message, title="Not updated", severity="error", timeout=30)
            return
        result = RenderResult(target, tuple(change.path for change in plan.changes), plan.warnings, True)
        headline = f"Updated {target}: {len(plan.changes)} file(s) changed, your edits kept."
        self.app.call_from_thread(self.app.rendered, result, headline)


class DoneScreen(Screen[None]):
    """What was written, the command to run it, and saving the answers file."""

    BINDINGS = [
        Binding("ctrl+s", "save", "Save answers"),
        Binding("escape", "back", "Back"),
    ]

    app: WizardHost  # the WizardApp (wizard.tui.app), as wizard.tui.host describes it

    def __init__(self, result: RenderResult, headline: str | None = None) -> None:
        super().__init__()
        self.result = result
        self.headline = headline

    def compose(self) -> ComposeResult:
        """The outcome, the next commands and the answers file field."""
        project = self.result.project_dir
        yield Header()
        with VerticalScroll(id="done"):
            action = "Replaced" if self.result.replaced else "Created"
            if self.app.into:
                action = "Added npu-wizard's files to"
            headline = self.headline or f"{action} {project} ({len(self.result.files)} files)."
            yield Static(Text(headline, style="bold"))
            yield Static(Text(done_text(self.result)), id="next")
            yield Label("Save the answers to render again later (ctrl+s):", classes="prompt")
            yield Input(str(self.app.answers_path or Path(f"{project.name}-answers.yaml")), id="save-path")
            yield Static("", id="saved")
        yield KeysFooter()

    def on_mount(self) -> None:
        """Title the page."""
        self.sub_title = "Done"
        self.query_one("#save-path", Input).cursor_blink = self.app.blink

    @on(Input.Submitted, "#save-path")
    def action_save(self) -> None:
        """Save the answers file, asking before replacing one."""
        path = Path(self.query_one("#save-path", Input).value.strip())
        if path.exists():
            self.app.push_screen(ConfirmScreen(f"{path} exists.\nReplace it?"), lambda yes: self.save(path, yes))
        else:
            self.save(path, True)

    def save(self, path: Path, yes: bool | None) -> None:
        """Write the canonical answers file when asked to."""
        from wizard.answers.model import dump

        saved = self.query_one("#saved", Static)
        if not yes:
            saved.update("Not saved.")
            return
        try:
            path.write_text(dump(self.app.state.answers()), encoding="utf-8")
        except OSError as error:
            saved.update(Text(f"x cannot write {path}: {error.strerror}", style="bold red"))
            return
        saved.update(Text(f"Saved {path}. Render again: npu-wizard --answers {path}", style="green"))

    def action_back(self) -> None:
        """Back to the review page."""
        self.app.pop_screen()


def done_text(result: RenderResult) -> str:
    """The warnings and what to do next with the rendered project."""
    lines = [f"! {warning}" for warning in result.warnings]
    if lines:
        lines.append("")
    lines += [
        "Run it (every node simulated here, or --node N on each server):",
        f"  npu-wizard run {result.project_dir}",
        "Check each node first:",
        f"  npu-wizard doctor {result.project_dir}",
        f"What runs on which node: {result.project_dir / result.readme}",
    ]
    return "\n".join(lines)
