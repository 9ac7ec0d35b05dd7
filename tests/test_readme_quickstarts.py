"""The README's two quick starts, run as written, and its table of docs/ pages, kept whole.

Each quick start's commands are the shell block after a `<!-- quickstart: NAME -->` line in README.md; the slow
tests run that block with bash in a temporary folder on the CPU, `npu-wizard` from this venv on PATH, as a
newcomer would paste it (issue 37 item 7).
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest
import yaml

from tests.runs import free_port, node_env

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
DOCS = ROOT / "docs"

# What "my repository" holds before the quick start: a script torchrun starts (env://, gloo), a few steps, that
# resumes from its own checkpoint behind --resume, as the quick start's resume_args expect.
TRAIN_DDP = """\
import argparse
import os

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

parser = argparse.ArgumentParser()
parser.add_argument("--resume", action="store_true")
args = parser.parse_args()
dist.init_process_group("gloo")
model = DDP(torch.nn.Linear(4, 1))
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
start = torch.load("ckpt.pt")["step"] if args.resume and os.path.exists("ckpt.pt") else 0
for step in range(start, 5):
    loss = model(torch.randn(8, 4)).pow(2).mean()
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    if dist.get_rank() == 0:
        torch.save({"step": step + 1}, "ckpt.pt")
dist.destroy_process_group()
"""


def quick_start(name: str) -> str:
    """The shell block that follows `<!-- quickstart: NAME -->` in the README."""
    found = re.search(rf"<!-- quickstart: {name} -->\n```sh\n(.*?)\n```\n", README.read_text(), re.DOTALL)
    assert found, f"README.md has no quick start {name!r}"
    return found.group(1) + "\n"


def run_as_written(commands: str, folder: Path) -> subprocess.CompletedProcess[str]:
    """The commands in one bash, stopping at the first that fails, in `folder`."""
    env = {key: value for key, value in node_env(folder / "unused").items() if key != "NPU_WIZARD_RUN_DIR"}
    return subprocess.run(
        ["bash", "-e", "-c", commands], cwd=folder, env=env, capture_output=True, text=True, timeout=600
    )


@pytest.mark.slow
def test_the_new_project_quick_start_runs_as_written(tmp_path: Path) -> None:
    demo = yaml.safe_load((ROOT / "examples" / "cpu-demo.yaml").read_text())
    demo["network"]["master_port"] = free_port()  # the file, not the commands: beside other tests' jobs
    (tmp_path / "examples").mkdir()
    (tmp_path / "examples" / "cpu-demo.yaml").write_text(yaml.safe_dump(demo))

    result = run_as_written(quick_start("new-project"), tmp_path)

    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-4000:]
    assert "outcome: finished" in result.stdout


@pytest.mark.slow
def test_the_my_repository_quick_start_runs_as_written(tmp_path: Path) -> None:
    repo = tmp_path / "my-repo"
    repo.mkdir()
    (repo / "train_ddp.py").write_text(TRAIN_DDP)
    subprocess.run(["git", "init", "-q", str(repo)], check=True, timeout=60)

    commands = quick_start("my-repository")
    # one line added after the answers are written: a free master port, beside other tests' jobs (the default
    # 29500 may be another test's); the commands themselves run as written
    assert commands.count("\nEOF\n") == 1, commands
    port = f"\nEOF\nprintf 'network:\\n  master_port: {free_port()}\\n' >> npu-answers.yaml\n"
    result = run_as_written(commands.replace("\nEOF\n", port), tmp_path)

    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-4000:]
    assert "outcome: finished" in result.stdout
    assert (repo / "ckpt.pt").exists()  # the user's own script ran, unchanged
    # nothing of npu-wizard's outside npu/: the answers live on in npu/answers.yaml
    assert not (repo / "npu-answers.yaml").exists() and (repo / "npu" / "answers.yaml").is_file()


def test_every_docs_link_in_the_readme_exists_and_every_page_is_linked() -> None:
    linked = set(re.findall(r"\]\((docs/[^)#]+)", README.read_text()))
    pages = {f"docs/{page.name}" for page in DOCS.glob("*.md")}
    assert sorted(link for link in linked if not (ROOT / link).is_file()) == []
    assert sorted(pages - linked) == []


def test_the_links_between_docs_pages_exist() -> None:
    for page in DOCS.glob("*.md"):
        for link in re.findall(r"\]\(([^)#:]+)", page.read_text()):
            assert (page.parent / link).exists(), f"{page.name} links {link}"
