"""Huawei's performance settings in the launch scripts and train.py, gated by series and torch_npu release.

The scripts run for real under bash with the recording stand-ins of
test_launch_scripts (a fake rank for train.py, a recording torchrun); the
binary-kernel switch runs against a torch_npu test double that records it.
"""

from __future__ import annotations

import os
from pathlib import Path
from types import SimpleNamespace

import pytest

from runtime import device
from tests.test_launch_scripts import (
    fake_bin,
    rank_record,
    recorded_env,
    render_project,
    run_node,
    script_env,
    with_fake_train,
)
from wizard.answers import hardware

NPU = {"device": "npu"}
SKIP_CHECKS = {"NPU_WIZARD_SKIP_PREFLIGHT": "1", "ASCEND_HOME_PATH": "/opt/cann-set-up-already"}


def torchrun_env(tmp_path: Path, **answers: object) -> dict[str, str]:
    """The environment torchrun gets from node 0's script of a project with `answers`."""
    project = render_project(tmp_path, **answers)
    record = tmp_path / "record"
    record.mkdir()
    result = run_node(project, 0, script_env(record, fake_bin(tmp_path, "torchrun"), **SKIP_CHECKS))
    assert result.returncode == 0, result.stdout + result.stderr
    return recorded_env(record, "torchrun")


@pytest.mark.parametrize(
    ("torch_npu", "task_queue", "affinity"),
    [
        ("2.9.0.post6", "2", "1"),
        ("2.4.0.post2", "2", "1"),
        ("2.4.0", "2", None),  # the 6.0.0 branch: task queue level 2 yes, CPU_AFFINITY_CONF not yet
        ("2.1.0.post6", None, None),
    ],
)
def test_task_queue_and_cpu_affinity_follow_the_torch_npu_release(
    tmp_path: Path, torch_npu: str, task_queue: str | None, affinity: str | None
) -> None:
    versions = {"environment.torch_npu_version": torch_npu, "environment.torch_version": torch_npu.split(".post")[0]}
    env = torchrun_env(tmp_path, **NPU, **versions)
    assert env.get("TASK_QUEUE_ENABLE") == task_queue
    assert env.get("CPU_AFFINITY_CONF") == affinity


def test_each_setting_keeps_a_value_from_the_environment(tmp_path: Path) -> None:
    project = render_project(tmp_path, **NPU)
    record = tmp_path / "record"
    record.mkdir()
    env = script_env(
        record, fake_bin(tmp_path, "torchrun"), TASK_QUEUE_ENABLE="1", CPU_AFFINITY_CONF="1,force:1", **SKIP_CHECKS
    )
    assert run_node(project, 0, env).returncode == 0
    seen = recorded_env(record, "torchrun")
    assert (seen["TASK_QUEUE_ENABLE"], seen["CPU_AFFINITY_CONF"]) == ("1", "1,force:1")


@pytest.mark.parametrize(("torch_npu", "reads_force"), [("2.9.0.post6", True), ("2.6.0", False)])
def test_cpu_affinity_force_is_written_after_the_mode_and_gated_by_the_release(
    tmp_path: Path, torch_npu: str, reads_force: bool
) -> None:
    versions = {"environment.torch_npu_version": torch_npu, "environment.torch_version": torch_npu.split(".post")[0]}
    project = render_project(tmp_path, **NPU, **versions)
    readme = (project / "README.md").read_text()
    script = (project / "launch" / "run-node.sh").read_text()
    assert "`1,force:1`" in readme and "1,force:1" in script
    assert '"force:1" where' not in script and "`force:1` inside a container" not in readme
    assert ("is read only by the torch_npu of CANN 9.1.0" in readme) is not reads_force
    record = tmp_path / "record"
    record.mkdir()
    env = script_env(record, fake_bin(tmp_path, "torchrun"), CPU_AFFINITY_CONF="1,force:1", **SKIP_CHECKS)
    result = run_node(project, 0, env)
    assert result.returncode == 0, result.stdout + result.stderr
    note = f"NOTE: torch_npu {torch_npu} does not read the force option of CPU_AFFINITY_CONF=1,force:1"
    assert (note in result.stdout) is not reads_force
    assert recorded_env(record, "torchrun")["CPU_AFFINITY_CONF"] == "1,force:1"


def test_a_cpu_project_sets_none_of_them(tmp_path: Path) -> None:
    env = torchrun_env(tmp_path, device="cpu")
    assert "TASK_QUEUE_ENABLE" not in env and "CPU_AFFINITY_CONF" not in env


OLD_TORCH_NPU = {"environment.torch_npu_version": "2.1.0.post6", "environment.torch_version": "2.1.0"}

# nproc's stand-in: the core count of a bigger server than this one.
FAKE_NPROC = """\
#!/usr/bin/env bash
echo "$FAKE_NPROC"
"""

# taskset's stand-in (the cores of a bigger server do not exist here): records which cores
# each rank asked for, then runs the rank unpinned.
RECORDING_TASKSET = """\
#!/usr/bin/env bash
printf '%s\\n' "$2" >"$FAKE_RECORD/taskset-rank-$RANK"
shift 2
exec "$@"
"""


def core_stand_ins(tmp_path: Path, *, taskset: bool) -> Path:
    """A folder with the nproc stand-in, and the recording taskset if asked, to put first on PATH."""
    folder = tmp_path / "cores"
    folder.mkdir()
    scripts = {"nproc": FAKE_NPROC, **({"taskset": RECORDING_TASKSET} if taskset else {})}
    for name, text in scripts.items():
        (folder / name).write_text(text)
        (folder / name).chmod(0o755)
    return folder


def pinned_cores(tmp_path: Path, cores: int, **env: str) -> tuple[dict[int, str], str]:
    """The taskset cores each rank of a 2-rank shell-loop A2 node asked for, on a server of `cores` cores."""
    project = render_project(tmp_path, launcher="shell", devices_per_node=2, **NPU, **OLD_TORCH_NPU)
    record = with_fake_train(project, tmp_path)
    fakes = core_stand_ins(tmp_path, taskset=True)
    result = run_node(project, 0, script_env(record, fakes, FAKE_NPROC=str(cores), **env, **SKIP_CHECKS))
    assert result.returncode == 0, result.stdout + result.stderr
    asked = {int(path.name.rsplit("-", 1)[1]): path.read_text().strip() for path in record.glob("taskset-rank-*")}
    return asked, result.stdout


def test_the_shell_loop_pins_each_rank_to_the_cores_of_its_device(tmp_path: Path) -> None:
    asked, _ = pinned_cores(tmp_path, 64)
    assert asked == {0: "0-7", 1: "8-15"}  # 64 cores / 8 devices of an A2 server


def test_visible_devices_move_the_ranks_to_their_devices_cores(tmp_path: Path) -> None:
    asked, _ = pinned_cores(tmp_path, 64, ASCEND_RT_VISIBLE_DEVICES="4,5")
    assert asked == {0: "32-39", 1: "40-47"}  # devices 4 and 5, not the cores of devices 0 and 1


def test_visible_devices_that_name_no_device_for_a_rank_leave_taskset_off_and_say_so(tmp_path: Path) -> None:
    asked, out = pinned_cores(tmp_path, 64, ASCEND_RT_VISIBLE_DEVICES="6")
    assert asked == {}
    assert "NOTE: no taskset: ASCEND_RT_VISIBLE_DEVICES='6' names no device 0-7 for local rank 1" in out


def test_a_device_id_past_bashs_integers_is_no_device(tmp_path: Path) -> None:
    # 2**64 + 1 wrapped to 1 in bash's arithmetic: both ranks were pinned to the cores of device 1
    asked, out = pinned_cores(tmp_path, 64, ASCEND_RT_VISIBLE_DEVICES="18446744073709551617,1")
    assert asked == {}
    assert "names no device 0-7 for local rank 0" in out


@pytest.mark.skipif(not {0, 1} <= os.sched_getaffinity(0), reason="needs CPUs 0 and 1 to give each rank its own")
def test_the_real_taskset_binds_each_rank_by_device(tmp_path: Path) -> None:
    # 8 cores for 8 devices: one core each, so devices 1 and 0 bind to cores 1 and 0 of this machine
    project = render_project(tmp_path, launcher="shell", devices_per_node=2, **NPU, **OLD_TORCH_NPU)
    record = with_fake_train(project, tmp_path)
    nproc = core_stand_ins(tmp_path, taskset=False)
    env = script_env(record, nproc, FAKE_NPROC="8", ASCEND_RT_VISIBLE_DEVICES="1,0", **SKIP_CHECKS)
    result = run_node(project, 0, env)
    assert result.returncode == 0, result.stdout + result.stderr
    assert [rank_record(record, rank)["cpus"] for rank in range(2)] == [[1], [0]]
    assert "CPU_AFFINITY_CONF" not in rank_record(record, 0)["env"]
    (tmp_path / "off").mkdir()
    unpinned = with_fake_train(project, tmp_path / "off")
    result = run_node(project, 0, script_env(unpinned, nproc, FAKE_NPROC="8", NPU_WIZARD_TASKSET="0", **SKIP_CHECKS))
    assert result.returncode == 0
    assert rank_record(unpinned, 1)["cpus"] == sorted(os.sched_getaffinity(0))


def test_the_shell_loop_leaves_core_binding_to_torch_npu_where_it_reads_cpu_affinity(tmp_path: Path) -> None:
    project = render_project(tmp_path, launcher="shell", devices_per_node=2, **NPU)
    record = with_fake_train(project, tmp_path)
    assert run_node(project, 0, script_env(record, **SKIP_CHECKS)).returncode == 0
    assert rank_record(record, 1)["cpus"] == sorted(os.sched_getaffinity(0))
    assert rank_record(record, 1)["env"]["CPU_AFFINITY_CONF"] == "1"


@pytest.mark.parametrize(
    ("version", "task_queue", "affinity", "force"),
    [
        ("2.1.0.post7", False, False, False),
        ("2.1.0.post8", True, False, False),
        ("2.1.0.post10", True, True, False),
        ("2.3.1.post2", True, False, False),
        ("2.3.1.post4", True, True, False),
        ("2.4.0.post1", True, False, False),
        ("2.4.0.post2", True, True, False),
        ("2.5.1", True, True, False),
        ("2.7.1.post4", True, True, False),  # CANN 9.0.0
        ("2.7.1.post8", True, True, True),  # CANN 9.1.0: the 26.1.0 branches parse force
        ("2.9.0.post2", True, True, False),
        ("2.9.0.post6", True, True, True),
        ("2.10.0.post4", True, True, True),
        ("2.10.0.post3", True, True, False),  # not in the pairs table: by its branch
        ("2.12.0", True, True, True),
        ("2.13.0", True, True, True),
    ],
)
def test_release_gates_follow_ascend_md(version: str, task_queue: bool, affinity: bool, force: bool) -> None:
    assert hardware.has_task_queue_2(version) is task_queue
    assert hardware.has_cpu_affinity_conf(version) is affinity
    assert hardware.has_cpu_affinity_force(version) is force


class CompileModeRecorder:
    """Test double of torch_npu (no NPU exists here): records torch_npu.npu.set_compile_mode."""

    def __init__(self) -> None:
        self.calls: list[dict[str, object]] = []
        self.npu = SimpleNamespace(set_compile_mode=lambda **kwargs: self.calls.append(kwargs))


def test_binary_kernels_are_asked_of_torch_npu_on_an_npu_only(monkeypatch: pytest.MonkeyPatch) -> None:
    double = CompileModeRecorder()
    monkeypatch.setattr(device, "_import_torch_npu", lambda: double)
    assert device.use_binary_kernels(device.DeviceChoice("npu", "hccl", "test")) is True
    assert double.calls == [{"jit_compile": False}]
    assert device.use_binary_kernels(device.DeviceChoice("cpu", "gloo", "test")) is False
    assert double.calls == [{"jit_compile": False}]


@pytest.mark.parametrize(("series", "calls"), [("atlas-training", 1), ("atlas-a2", 0), ("atlas-a3", 0)])
def test_train_py_selects_binary_kernels_on_the_atlas_training_series_only(
    tmp_path: Path, series: str, calls: int
) -> None:
    amp = {"amp": "fp16"} if series == "atlas-training" else {}
    text = (render_project(tmp_path, hardware=series, **amp) / "train.py").read_text()
    assert text.count("device.use_binary_kernels(choice)") == calls
    assert "broadcast_buffers=False,\n                gradient_as_bucket_view=True," in text


@pytest.mark.parametrize(
    ("answers", "async_parse"),
    [
        ({"device": "npu", "environment.torch_npu_version": "2.5.1", "environment.torch_version": "2.5.1"}, "1"),
        (
            {"device": "npu", "environment.torch_npu_version": "2.1.0.post10", "environment.torch_version": "2.1.0"},
            None,
        ),
        ({"device": "cpu"}, None),
    ],
)
def test_a_profile_windows_async_parse_follows_the_torch_npu_release(
    tmp_path: Path, answers: dict[str, str], async_parse: str | None
) -> None:
    """tensorboard_trace_handler(async_mode=True) only where the release has it (the 7.0.0 branches on)."""
    env = torchrun_env(tmp_path, **answers)
    assert env.get("NPU_WIZARD_PROFILE_ASYNC_PARSE") == async_parse
