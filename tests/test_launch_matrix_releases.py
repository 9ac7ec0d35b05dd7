"""Every launch script of the example matrix, run under each torch_npu release's test double.

No NPU exists here. For each matrix project x torch_npu release the project
is rendered for that release, node 0's script runs under bash with the
version-aware torch_npu double first on PATH (its torch_npu_run accepts only
the flags that release defines and refuses others as the release would), a
recording torchrun and the fake rank of test_launch_scripts. Each run must
pass no unrecognized flag and export the variables ASCEND.md asks of that
series and release.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.matrix import ALL, case_answers
from tests.test_launch_scripts import fake_bin, rank_record, recorded_env, run_node, script_env, with_fake_train
from wizard.answers import hardware
from wizard.answers.model import resolve
from wizard.render.render import render

# helper i10's version-aware double; this test runs once it is in the tree
install_torch_npu_double = pytest.importorskip("tests.doubles.torch_npu_double").install_torch_npu_double
RELEASES = ("2.1.0.post10", "2.4.0.post2", "2.5.1", "2.9.0.post6")


def for_release(case: str, release: str) -> Any:
    """The case's answers with torch_npu `release` (and its torch), still valid."""
    values = dict(case_answers(case).values)
    values["environment.torch_npu_version"] = release
    values["environment.torch_version"] = hardware.base_version(release)
    for derived in ("network.hccl_port_count", "environment.cann_set_env"):
        values.pop(derived, None)
    if values.get("training.compile") == "reduce-overhead" and not hardware.has_torchair_reduce_overhead(release):
        values["training.compile"] = "default"  # the release has no aclgraph mode: the answers would refuse it
    if values.get("training.parallelism") == "fsdp2" and hardware.parse_version(release)[:2] < (2, 6):
        values["training.parallelism"] = "zero1"  # no fully_shard before torch(_npu) 2.6: the answers would refuse it
    return resolve(values)


@pytest.mark.parametrize("release", RELEASES)
@pytest.mark.parametrize("case", ALL)
def test_every_launch_script_runs_under_each_release(case: str, release: str, tmp_path: Path) -> None:
    answers = for_release(case, release)
    if answers["launcher"] == "torch-launch":
        pytest.skip("python -m torch.distributed.launch is the real one and would wait for the other nodes")
    project = render(answers, tmp_path / "out").project_dir
    if not (project / "launch" / "node0.sh").exists():
        pytest.skip("a scheduler's project: its entry script runs under the scheduler (tested with the engines)")
    record = with_fake_train(project, tmp_path)
    double = install_torch_npu_double(tmp_path, release)
    env = double.env(script_env(record, fake_bin(tmp_path, "torchrun"), NPU_WIZARD_SKIP_PREFLIGHT="1"))
    result = run_node(project, 0, env, timeout=180)  # the double's torch_npu_run imports torch
    assert result.returncode == 0, result.stdout + result.stderr
    assert double.rejected() == []
    launcher = answers["launcher"]
    if launcher == "torch-npu-run":
        (run,) = double.runs()
        seen = run["env"]
    elif launcher == "torchrun":
        seen = recorded_env(record, "torchrun")
    else:
        seen = rank_record(record, 0)["env"]
    npu = answers["device"] != "cpu"
    assert seen.get("TASK_QUEUE_ENABLE") == ("2" if npu and hardware.has_task_queue_2(release) else None)
    assert seen.get("CPU_AFFINITY_CONF") == ("1" if npu and hardware.has_cpu_affinity_conf(release) else None)
    if answers["network.nic"]:
        assert seen["HCCL_SOCKET_IFNAME"] == answers["network.nic"] and "HCCL_IF_IP" not in seen
    else:
        assert seen["HCCL_IF_IP"] == answers["network.host_ips"][0] and "HCCL_SOCKET_IFNAME" not in seen
    assert seen["HCCL_IF_BASE_PORT"] == str(answers["network.hccl_base_port"])
    assert seen["HCCL_EXEC_TIMEOUT"] == str(answers["network.exec_timeout"])


@pytest.mark.parametrize("release", sorted(pytest.importorskip("tests.doubles.torch_npu_double").RELEASES))
@pytest.mark.parametrize("case", ["a2-4x8-torch-npu-run-fp16-mnist", "own-a2-2x8-torch-npu-run-slurm"])
def test_the_torch_npu_run_restart_text_follows_the_release(case: str, release: str, tmp_path: Path) -> None:
    double_release = pytest.importorskip("tests.doubles.torch_npu_double").RELEASES[release]
    assert hardware.has_parallel_store_env(release) is double_release.parallel_store_env
    readme = " ".join(
        (render(for_release(case, release), tmp_path / "out").project_dir / "README.md").read_text().split()
    )
    own_store = "predates torch_npu_run's own store for the workers" in readme
    assert own_store is not double_release.parallel_store_env
    if double_release.parallel_store_env:
        assert "TORCH_NPU_USE_PARALLEL_TCPSTORE=True" in readme and "no store of its own there" in readme
    else:
        # the 6.0.0 and 7.0.0 branches: plain env:// and a MASTER_PORT the agent chose
        assert "no store of its own there" not in readme
        assert "plain `env://` and a `MASTER_PORT` it chose" in readme
        assert "under a prefix of its own attempt (`TORCHELASTIC_RESTART_COUNT`)" in readme
