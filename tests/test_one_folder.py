"""`--into REPO --folder NAME`: every file of npu-wizard's in one folder of a repository it did not write.

The repository is shaped like a public one (issue 37, "Proof"): a git repository with its own .gitignore, its own
top-level package named `runtime`, and a train.py that torchrun would start (env://, gloo), that imports that
package, saves its own checkpoint and resumes from it only behind --resume, and never calls the report hook.
The ranks start from the repository's root as `python npu/runtime/start_userscript.py train.py`, npu-wizard's
runtime loaded as npu_wizard_runtime, so the repository's `import runtime` still finds its own.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.runs import clean_up, events_of, free_port, kinds, leftover_processes, run_dirs, wait_for
from tests.test_doctor_command import doctor
from tests.test_doctor_user_script import script_line
from tests.test_run_resume_args import without_venv
from tests.wizard_forks import wizard
from wizard.run.engines.ssh_copy import copy_list

STEPS = 40
TRAIN_PY = f"""\
import argparse
import os
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

import runtime

assert runtime.OWNER == "the repository", runtime.__file__
parser = argparse.ArgumentParser()
parser.add_argument("--resume", action="store_true")
args = parser.parse_args()
dist.init_process_group("gloo")
rank = dist.get_rank()
model = DDP(torch.nn.Linear(4, 1))
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
start = torch.load("out/ckpt.pt")["step"] if args.resume and os.path.exists("out/ckpt.pt") else 0
print(f"[rank {{rank}}] {{'resumed at step ' + str(start) if args.resume else 'started'}}", flush=True)
for step in range(start, {STEPS}):
    loss = model(torch.randn(8, 4)).pow(2).mean()
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    if rank == 0:
        os.makedirs("out", exist_ok=True)
        torch.save({{"step": step + 1}}, "out/ckpt.tmp")
        os.replace("out/ckpt.tmp", "out/ckpt.pt")
    time.sleep(0.05)
print(f"[rank {{rank}}] finished at step {STEPS}", flush=True)
dist.destroy_process_group()
"""


def foreign_repository(tmp_path: Path) -> Path:
    """A committed git repository of someone else's: .gitignore, a `runtime` package, train.py."""
    repo = tmp_path / "their-gpt"
    (repo / "runtime").mkdir(parents=True)
    (repo / "runtime" / "__init__.py").write_text('OWNER = "the repository"\n')
    (repo / ".gitignore").write_text("out/\n__pycache__/\n")
    (repo / "train.py").write_text(TRAIN_PY)
    (repo / "answers.yaml").write_text("theirs: true\n")  # a name npu-wizard uses, outside its folder
    git(repo, "init", "-q")
    git(repo, "add", "-A")
    git(repo, "-c", "user.name=them", "-c", "user.email=them@example.com", "commit", "-qm", "theirs")
    return repo


def git(repo: Path, *args: str) -> str:
    """Run git in `repo`; its output."""
    return subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True, text=True).stdout


def answers_file(tmp_path: Path, launcher: str = "torchrun") -> Path:
    """1 node x 2 ranks of `launcher` on the CPU, running the repository's train.py, --resume on a restart."""
    answers = {
        "schema": 1,
        "project_name": "their-gpt",
        "device": "cpu",
        "nodes": 1,
        "devices_per_node": 2,
        "launcher": launcher,
        "amp": "off",
        "network": {"host_ips": ["127.0.0.1"], "master_port": free_port()},
        "training": {"script": "train.py", "resume_args": "--resume"},
    }
    path = tmp_path / "npu-answers.yaml"
    path.write_text(yaml.safe_dump(answers))
    return path


def npu_wizard(*args: str) -> subprocess.CompletedProcess[str]:
    """`npu-wizard ARGS` from this venv, a process of its own (tests/wizard_forks.py)."""
    return wizard(args, timeout=300)


def render_into_folder(tmp_path: Path, launcher: str = "torchrun") -> Path:
    """The foreign repository with npu-wizard's files in its folder npu/."""
    repo = foreign_repository(tmp_path)
    result = npu_wizard("--answers", str(answers_file(tmp_path, launcher)), "--into", str(repo), "--folder", "npu")
    assert result.returncode == 0, result.stderr
    return repo


def test_into_a_folder_writes_only_that_folder_and_the_ranks_start_from_the_repository_root(tmp_path: Path) -> None:
    repo = render_into_folder(tmp_path)

    assert git(repo, "status", "--porcelain") == "?? npu/\n"
    assert (repo / "answers.yaml").read_text() == "theirs: true\n"
    assert (repo / "npu" / ".npu-wizard" / "repository").read_text() == "npu\n"
    node = (repo / "npu" / "launch" / "run-node.sh").read_text()
    assert "program=(npu/runtime/start_userscript.py train.py)" in node
    assert "PYTHONPATH" not in node.replace("Nothing is added to PYTHONPATH", "")
    assert 'REPOSITORY_DIR="$(cd .. && pwd)"' in node
    assert '[[ "${1:-}" == --smoke ]] || cd "$REPOSITORY_DIR"' in node
    guide = (repo / "npu" / "NPU-WIZARD.md").read_text()
    assert "Every rank runs `python npu/runtime/start_userscript.py train.py` from\nthe root of the repository" in guide
    assert "from npu_wizard_runtime import report  # npu/runtime/" in guide


def test_a_clash_is_looked_for_inside_the_folder_only(tmp_path: Path) -> None:
    repo = foreign_repository(tmp_path)
    (repo / "npu" / "launch").mkdir(parents=True)
    (repo / "npu" / "launch" / "run-node.sh").write_text("mine\n")

    result = npu_wizard("--answers", str(answers_file(tmp_path)), "--into", str(repo), "--folder", "npu")

    assert result.returncode == 1
    assert "already has 1 path(s) npu-wizard would write" in result.stderr and "launch/run-node.sh" in result.stderr
    assert (repo / "npu" / "launch" / "run-node.sh").read_text() == "mine\n"


@pytest.mark.parametrize(
    ("folder", "said"),
    [
        ("../out", "name a folder inside the repository"),
        ("train.py", "train.py (a file where npu-wizard needs the folder train.py/) is in the way"),
    ],
)
def test_a_folder_outside_the_repository_or_on_a_file_is_refused(tmp_path: Path, folder: str, said: str) -> None:
    repo = foreign_repository(tmp_path)

    result = npu_wizard("--answers", str(answers_file(tmp_path)), "--into", str(repo), "--folder", folder)

    assert result.returncode == 1 and said in result.stderr, result.stderr
    assert git(repo, "status", "--porcelain") == ""


def test_folder_goes_with_into_only(tmp_path: Path) -> None:
    result = npu_wizard("--answers", str(answers_file(tmp_path)), "-o", str(tmp_path), "--folder", "npu")
    assert result.returncode == 2 and "--folder goes with --into REPO" in result.stderr


def test_update_of_the_folder_keeps_the_ranks_starting_from_the_repository_root(tmp_path: Path) -> None:
    repo = render_into_folder(tmp_path)
    answers = repo / "npu" / "answers.yaml"
    answers.write_text(answers.read_text().replace("  - --resume\n", "  - --resume\n  - --again\n"))

    result = npu_wizard("update", str(repo / "npu"))

    assert result.returncode == 0, result.stdout + result.stderr
    node = (repo / "npu" / "launch" / "run-node.sh").read_text()
    assert "program=(npu/runtime/start_userscript.py train.py)" in node and "--again" in node
    assert git(repo, "status", "--porcelain") == "?? npu/\n"


def test_doctor_finds_the_script_and_reads_its_imports_from_the_repository_root(tmp_path: Path) -> None:
    repo = render_into_folder(tmp_path)
    (repo / "mypkg").mkdir()
    (repo / "mypkg" / "__init__.py").write_text("")
    (repo / "mypkg" / "dist.py").write_text('import torch.distributed as dist\n\ndist.init_process_group("nccl")\n')
    (repo / "train.py").write_text("import mypkg.dist\n")
    answers = repo / "npu" / "answers.yaml"
    answers.write_text(answers.read_text().replace("device: cpu", "device: npu"))

    line = script_line(doctor(str(repo / "npu")).stdout)

    assert line.startswith("WARN script train.py and the 2 module(s) it imports name nccl or cuda"), line
    assert "mypkg/dist.py line 3" in line, line


def rank_1_once_saved(repo: Path, run_dir: Path) -> int | None:
    """Rank 1's pid once the script saved its checkpoint, else None."""
    started = kinds(events_of(run_dir).get(1, []), "started")
    return started[-1]["pid"] if started and (repo / "out" / "ckpt.pt").is_file() else None


def run_plain(project: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """`npu-wizard run PROJECT --plain ARGS` to its end, the venv not on PATH."""
    return subprocess.run(
        [sys.executable, "-m", "wizard", "run", str(project), "--plain", *args],
        env=without_venv(),
        capture_output=True,
        text=True,
        timeout=300,
    )


@pytest.mark.slow
def test_their_train_py_runs_resumes_after_a_sigkill_and_git_status_shows_only_the_folder(tmp_path: Path) -> None:
    # the shell launcher: the folder and the restart are the point, and torchrun's agent would import torch in each
    # of the five attempts (torchrun starts the ranks from the repository's root over ssh and sbatch, below)
    repo = render_into_folder(tmp_path, "shell")
    project = repo / "npu"

    for _ in range(3):
        ended = run_plain(project)
        assert ended.returncode == 0, ended.stdout[-4000:] + ended.stderr[-4000:]
        assert "outcome: finished" in ended.stdout
        assert git(repo, "status", "--porcelain") == "?? npu/\n"
    (repo / "out" / "ckpt.pt").unlink()

    runner = subprocess.Popen(
        [sys.executable, "-m", "wizard", "run", str(project), "--plain", "--restarts", "1"],
        env=without_venv(),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        run_dir = wait_for(lambda: run_dirs(project)[3:], 60, "the fourth run folder")[0]
        os.kill(wait_for(lambda: rank_1_once_saved(repo, run_dir), 240, "the first checkpoint"), signal.SIGKILL)
        output, _ = runner.communicate(timeout=480)
        assert not leftover_processes(project)
    finally:
        clean_up(project, runner)
    assert runner.returncode == 0, output
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["outcome"] == "finished" and summary["job_restarts"] == 1
    second = (run_dir / "logs" / "rank-1.log").read_text()
    resumed = int(second.split("resumed at step ")[1].split("\n")[0])
    assert resumed > 0 and f"[rank 1] finished at step {STEPS}" in second
    assert git(repo, "status", "--porcelain") == "?? npu/\n"
    imported = subprocess.run(
        [sys.executable, "-c", "import runtime; print(runtime.OWNER)"], cwd=repo, capture_output=True, text=True
    )
    assert imported.stdout == "the repository\n"


def test_the_ssh_engine_copies_the_repository_and_starts_each_node_in_its_folder(tmp_path: Path) -> None:
    repo = foreign_repository(tmp_path)
    answers = yaml.safe_load(answers_file(tmp_path).read_text())
    answers.update(nodes=2, cluster={"engine": "ssh", "ssh_hosts": ["atlas-a", "atlas-b"]})
    answers["network"].update(host_ips=["192.0.2.10", "192.0.2.11"], master_addr="192.0.2.10")
    (tmp_path / "ssh.yaml").write_text(yaml.safe_dump(answers))
    rendered = npu_wizard("--answers", str(tmp_path / "ssh.yaml"), "--into", str(repo), "--folder", "npu")
    assert rendered.returncode == 0, rendered.stderr

    shown = npu_wizard("run", str(repo / "npu"), "--dry-run")

    assert shown.returncode == 0, shown.stderr
    for node, host in enumerate(["atlas-a", "atlas-b"]):
        assert f"{repo}/ {host}:{repo}/" in shown.stdout
        assert f"cd {repo}/npu && " in shown.stdout and f"launch/node{node}.sh" in shown.stdout
    listed = copy_list(repo).files
    assert "train.py" in listed and "runtime/__init__.py" in listed and "npu/launch/run-node.sh" in listed
    assert "npu/runtime/start_userscript.py" in listed


@pytest.mark.slow
def test_their_train_py_runs_over_ssh_from_the_copy_of_the_repository(tmp_path: Path) -> None:
    from tests.ssh_hosts import ssh_hosts
    from tests.test_ssh_engine import runner_env

    repo = foreign_repository(tmp_path)
    elsewhere = tmp_path / "on-the-hosts"  # the hosts' copy of the repository, apart from the one here
    (tmp_path / "ssh").mkdir()
    with ssh_hosts(tmp_path / "ssh") as hosts:
        answers = yaml.safe_load(answers_file(tmp_path).read_text())
        answers.update(nodes=2, cluster={"engine": "ssh", "remote_dir": str(elsewhere)})
        answers["network"].update(host_ips=hosts.addresses, master_addr=hosts.addresses[0])
        (tmp_path / "ssh.yaml").write_text(yaml.safe_dump(answers))
        rendered = npu_wizard("--answers", str(tmp_path / "ssh.yaml"), "--into", str(repo), "--folder", "npu")
        assert rendered.returncode == 0, rendered.stderr
        project = repo / "npu"
        runner = subprocess.Popen(
            [sys.executable, "-m", "wizard", "run", str(project), "--plain", "--interval", "2"],
            env=runner_env(hosts, project),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        try:
            output, _ = runner.communicate(timeout=480)
        finally:
            clean_up(project, runner)
    assert runner.returncode == 0, output
    (run_dir,) = run_dirs(project)
    assert json.loads((run_dir / "summary.json").read_text())["outcome"] == "finished"
    assert (elsewhere / "out" / "ckpt.pt").is_file() and (elsewhere / "npu" / "launch" / "node1.sh").is_file()
    assert not (elsewhere / ".git").exists()
    assert git(repo, "status", "--porcelain") == "?? npu/\n"


@pytest.mark.slow
def test_their_train_py_runs_through_sbatch_from_the_repository_root(tmp_path: Path) -> None:
    from tests.slurm_cluster import have_slurm, slurm_cluster
    from tests.test_slurm_engine import runner_env

    if not have_slurm():
        pytest.skip("needs slurm-wlm and munge (.ci/run installs them)")
    repo = foreign_repository(tmp_path)
    answers = yaml.safe_load(answers_file(tmp_path).read_text())
    answers.update(nodes=2, cluster={"engine": "slurm", "time": "00:20:00"})
    (tmp_path / "slurm.yaml").write_text(yaml.safe_dump(answers))
    rendered = npu_wizard("--answers", str(tmp_path / "slurm.yaml"), "--into", str(repo), "--folder", "npu")
    assert rendered.returncode == 0, rendered.stderr
    project = repo / "npu"
    (tmp_path / "slurm").mkdir()
    with slurm_cluster(tmp_path / "slurm") as cluster:
        runner = subprocess.Popen(
            [sys.executable, "-m", "wizard", "run", str(project), "--plain", "--interval", "2"],
            env=runner_env(cluster, project),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        try:
            output, _ = runner.communicate(timeout=480)
        finally:
            clean_up(project, runner)
    assert runner.returncode == 0, output
    (run_dir,) = run_dirs(project)
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["outcome"] == "finished" and [info["node"] for info in summary["ranks"].values()] == [0, 0, 1, 1]
    assert (repo / "out" / "ckpt.pt").is_file()
    assert git(repo, "status", "--porcelain") == "?? npu/\n"


def test_a_kubernetes_engine_renders_into_a_folder_too(tmp_path: Path) -> None:
    repo = foreign_repository(tmp_path)
    answers = yaml.safe_load(answers_file(tmp_path).read_text())
    answers.update(cluster={"engine": "pytorchjob", "image": "registry.example.com/train:1"})
    (tmp_path / "k8s.yaml").write_text(yaml.safe_dump(answers))

    result = npu_wizard("--answers", str(tmp_path / "k8s.yaml"), "--into", str(repo), "--folder", "npu")

    assert result.returncode == 0, result.stdout + result.stderr  # tests/test_k8s_folder.py: the pods and limits
    assert "the pods' ConfigMap does not carry" not in result.stderr
    assert git(repo, "status", "--porcelain") == "?? npu/\n"
