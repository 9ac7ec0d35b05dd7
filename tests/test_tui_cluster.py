"""The cluster step as a person meets it: the engine after the topology, only its own questions."""

from __future__ import annotations

from pathlib import Path

from textual.pilot import Pilot
from textual.widgets import Static

from tests.test_tui_flow import answers_file, render_with_answers_file
from tests.tui_driver import (
    answer,
    answer_all,
    field,
    next_step,
    pick,
    problem_text,
    render_into,
    run_wizard,
    shown,
    snapshot_of,
)
from wizard.answers.questions_cluster import SETTINGS
from wizard.answers.questions_k8s import KUBERNETES_QUESTIONS
from wizard.tui.review import ReviewScreen
from wizard.tui.screens import StepScreen

SSH_SETTINGS = {"cluster.ssh_hosts", "cluster.remote_dir"}
SLURM_SETTINGS = {q.name for q in SETTINGS} - SSH_SETTINGS


def shown_settings(pilot: Pilot[int]) -> set[str]:
    """The engine settings the cluster step shows now."""
    return {q.name for q in SETTINGS if shown(pilot, q.name)}


async def go_to_cluster(pilot: Pilot[int]) -> None:
    """Press Next with the defaults until the cluster step shows."""
    while not (isinstance(pilot.app.screen, StepScreen) and pilot.app.screen.step == "cluster"):
        await next_step(pilot)


def test_the_engine_is_asked_after_the_topology_with_only_its_own_questions() -> None:
    async def scenario(pilot: Pilot[int]) -> None:
        await go_to_cluster(pilot)
        assert shown_settings(pilot) == set()
        await pick(pilot, "cluster.engine", "ssh")
        assert shown_settings(pilot) == SSH_SETTINGS
        await pick(pilot, "cluster.engine", "slurm")
        assert shown_settings(pilot) == SLURM_SETTINGS
        await answer(pilot, "cluster.time", "12 hours")
        problem = str(field(pilot, "cluster.time").query_one(".problem", Static).render())
        assert "HH:MM:SS" in problem

    run_wizard(scenario)


def test_a_kubernetes_engine_is_offered_with_its_own_questions() -> None:
    kubernetes = {q.name for q in KUBERNETES_QUESTIONS}

    def shown_kubernetes(pilot: Pilot[int]) -> set[str]:
        return {name for name in kubernetes if shown(pilot, name)}

    async def scenario(pilot: Pilot[int]) -> None:
        await go_to_cluster(pilot)
        states = {c.choice.value: c.refusal for c in pilot.app.state.choices("cluster.engine")}
        assert all(refusal is None for refusal in states.values()), states
        assert shown_kubernetes(pilot) == set()
        await pick(pilot, "cluster.engine", "ascendjob")
        assert shown_kubernetes(pilot) == kubernetes
        assert shown_settings(pilot) == set()
        await pick(pilot, "cluster.engine", "pytorchjob")
        assert shown_kubernetes(pilot) == kubernetes - {"cluster.queue"}

    run_wizard(scenario)


def test_a_slurm_project_typed_in_renders_as_its_answers_file_and_the_review_previews_sbatch(tmp_path: Path) -> None:
    raw = {
        "project_name": "slurm-typed",
        "nodes": 2,
        "cluster.engine": "slurm",
        "cluster.partition": "npu",
        "cluster.time": "02:00:00",
        "cluster.gres": "gpu:910b:8",
    }

    async def scenario(pilot: Pilot[int]) -> None:
        await answer_all(pilot, raw)
        screen = pilot.app.screen
        assert isinstance(screen, ReviewScreen)
        await pilot.app.workers.wait_for_complete()
        await pilot.pause()
        sbatch = str(screen.query_one("#sbatch", Static).render())
        assert "#SBATCH --nodes=2" in sbatch and "#SBATCH --gres=gpu:910b:8" in sbatch
        assert "srun --kill-on-bad-exit=1" in sbatch
        await render_into(pilot, tmp_path / "tui")

    run_wizard(scenario)
    render_with_answers_file(answers_file(tmp_path, raw), tmp_path / "cli")
    tui_files = snapshot_of(tmp_path / "tui" / "slurm-typed")
    assert tui_files == snapshot_of(tmp_path / "cli" / "slurm-typed")
    assert {"slurm/job.sbatch", "launch/entry.sh", "launch/run-node.sh"} <= set(tui_files)
    assert "network:\n  host_ips" not in tui_files["answers.yaml"][0].decode()


def test_spare_hosts_are_typed_on_the_cluster_step_once_the_engine_can_use_them() -> None:

    async def scenario(pilot: Pilot[int]) -> None:
        while not (isinstance(pilot.app.screen, StepScreen) and pilot.app.screen.step == "topology"):
            await next_step(pilot)
        await answer(pilot, "nodes", "2")
        await pilot.pause()
        await answer(pilot, "network.host_ips", ["10.0.0.2", "10.0.0.3"])
        await answer(pilot, "network.master_addr", "10.0.0.2")
        await go_to_cluster(pilot)
        await answer(pilot, "network.spare_hosts", "10.0.0.4, 10.0.0.5")
        assert "the manual engine starts only the node" in problem_text(pilot, "network.spare_hosts")
        await pick(pilot, "cluster.engine", "ssh")
        await pilot.pause()
        assert problem_text(pilot, "network.spare_hosts") == ""
        assert pilot.app.state.values["network.spare_hosts"] == ("10.0.0.4", "10.0.0.5")

    run_wizard(scenario)
