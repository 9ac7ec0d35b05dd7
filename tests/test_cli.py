"""The `npu-wizard --answers` command as a user runs it: exit codes, output, nothing lost."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.factories import answers_yaml
from wizard.cli import main

EXAMPLES = Path(__file__).parent.parent / "examples"


def run_cli(*args: str, stdin: str | None = None, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    """Run the real command in a fresh interpreter."""
    return subprocess.run(
        [sys.executable, "-m", "wizard", *args], input=stdin, capture_output=True, text=True, cwd=cwd, timeout=60
    )


def tree(root: Path) -> list[str]:
    """Every path under root, relative, sorted."""
    return sorted(p.relative_to(root).as_posix() for p in root.rglob("*"))


def write_answers(tmp_path: Path, **document: object) -> Path:
    path = tmp_path / "a.yaml"
    path.write_text(answers_yaml({"project_name": "demo", "device": "cpu", "devices_per_node": 2, **document}))
    return path


def test_render_creates_the_project_and_says_what_next(tmp_path: Path) -> None:
    result = run_cli("--answers", str(write_answers(tmp_path)), "-o", str(tmp_path / "out"))
    assert result.returncode == 0, result.stderr
    assert f"created {tmp_path / 'out' / 'demo'}" in result.stdout
    assert (tmp_path / "out" / "demo" / "launch" / "node0.sh").is_file()
    assert (tmp_path / "out" / "demo" / "answers.yaml").is_file()


def test_answers_from_stdin(tmp_path: Path) -> None:
    text = write_answers(tmp_path).read_text()
    result = run_cli("--answers", "-", "-o", str(tmp_path / "out"), stdin=text)
    assert result.returncode == 0, result.stderr
    assert (tmp_path / "out" / "demo" / "train.py").is_file()


def test_bad_answers_list_every_problem_exit_1_and_write_nothing(tmp_path: Path) -> None:
    bad = write_answers(tmp_path, nodes=0, amp="fp8", launcher="slurm")
    result = run_cli("--answers", str(bad), "-o", str(tmp_path / "out"))
    assert result.returncode == 1
    assert "3 problems in the answers (nothing was written)" in result.stderr
    for field in ("nodes: 0", "launcher: 'slurm'", "amp: 'fp8'"):
        assert field in result.stderr
    assert "Traceback" not in result.stderr
    assert not (tmp_path / "out").exists()


def test_existing_project_is_refused_without_force(tmp_path: Path) -> None:
    answers_file = write_answers(tmp_path)
    target = tmp_path / "out" / "demo"
    target.mkdir(parents=True)
    (target / "mine.txt").write_text("keep me")
    result = run_cli("--answers", str(answers_file), "-o", str(tmp_path / "out"))
    assert result.returncode == 1
    assert "already exists; use --force" in result.stderr
    assert tree(target) == ["mine.txt"]


def test_force_replaces_the_project_whole_without_stale_node_scripts(tmp_path: Path) -> None:
    two_nodes = write_answers(tmp_path, nodes=2, network={"host_ips": ["127.0.0.1", "127.0.0.1"]})
    assert run_cli("--answers", str(two_nodes), "-o", str(tmp_path)).returncode == 0
    assert (tmp_path / "demo" / "launch" / "node1.sh").exists()
    one_node = write_answers(tmp_path)
    result = run_cli("--answers", str(one_node), "-o", str(tmp_path), "--force")
    assert result.returncode == 0, result.stderr
    assert "replaced" in result.stdout
    assert not (tmp_path / "demo" / "launch" / "node1.sh").exists()
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []


def test_dry_run_lists_files_and_warnings_and_writes_nothing(tmp_path: Path) -> None:
    answers_file = write_answers(tmp_path, network={"master_port": 40000})
    result = run_cli("--answers", str(answers_file), "-o", str(tmp_path / "out"), "--dry-run")
    assert result.returncode == 0, result.stderr
    assert "would create" in result.stdout
    assert "  launch/node0.sh" in result.stdout.splitlines()
    assert "warning: network.master_port: 40000: inside the usual ephemeral range" in result.stderr
    assert not (tmp_path / "out").exists()


def test_missing_answers_file_is_an_input_error(tmp_path: Path) -> None:
    result = run_cli("--answers", str(tmp_path / "nope.yaml"))
    assert result.returncode == 1
    assert "does not exist" in result.stderr


def test_output_that_is_a_file_is_refused(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("x")
    result = run_cli("--answers", str(write_answers(tmp_path)), "-o", str(blocker))
    assert result.returncode == 1
    assert "is not a folder" in result.stderr
    assert blocker.read_text() == "x"


def test_usage_error_is_exit_2() -> None:
    assert run_cli("--no-such-flag").returncode == 2


def test_answers_path_imports_neither_torch_nor_textual(tmp_path: Path) -> None:
    code = (
        "import sys; from wizard.cli import main\n"
        f"rc = main(['--answers', {str(write_answers(tmp_path))!r}, '-o', {str(tmp_path / 'o')!r}])\n"
        "assert rc == 0, rc\n"
        "loaded = [m for m in ('torch', 'textual', 'torch_npu') if m in sys.modules]\n"
        "assert not loaded, loaded\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr


def test_the_render_path_imports_neither_cookiecutter_nor_arrow_nor_rich(tmp_path: Path) -> None:
    """`--answers` renders with Jinja alone: cookiecutter (and the arrow and rich it pulls in, about 180 ms of
    imports) is for plain cookiecutter's path only. A fresh interpreter renders the CPU demo, --force included."""
    code = (
        "import sys; from wizard.cli import main\n"
        f"out = {str(tmp_path)!r}\n"
        f"for force in ([], ['--force']):\n"
        f"    assert main(['--answers', {str(EXAMPLES / 'cpu-demo.yaml')!r}, '-o', out, *force]) == 0\n"
        "loaded = sorted({m.split('.')[0] for m in sys.modules} & {'cookiecutter', 'arrow', 'rich', 'binaryornot'})\n"
        "assert not loaded, loaded\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr


def test_a_failing_render_leaves_nothing_behind(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import wizard.render.render

    def broken_finish(*args: object) -> None:
        raise OSError("disk full")

    monkeypatch.setattr(wizard.render.render, "finish", broken_finish)
    rc = main(["--answers", str(write_answers(tmp_path)), "-o", str(tmp_path / "out")])
    assert rc == 1
    assert not (tmp_path / "out").exists()


def test_a_failing_forced_render_keeps_the_old_project(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import wizard.render.render

    answers_file = write_answers(tmp_path)
    assert main(["--answers", str(answers_file), "-o", str(tmp_path)]) == 0
    before = tree(tmp_path / "demo")
    monkeypatch.setattr(wizard.render.render, "finish", lambda *a: (_ for _ in ()).throw(OSError("disk full")))
    assert main(["--answers", str(answers_file), "-o", str(tmp_path), "--force"]) == 1
    assert tree(tmp_path / "demo") == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.yaml", "demo"]


@pytest.mark.parametrize("example", sorted(EXAMPLES.glob("*.yaml")), ids=lambda p: p.stem)
def test_every_example_renders(example: Path, tmp_path: Path) -> None:
    result = run_cli("--answers", str(example), "-o", str(tmp_path))
    assert result.returncode == 0, result.stderr
    assert "Traceback" not in result.stderr


def test_the_command_runs_from_any_directory(tmp_path: Path) -> None:
    example = (EXAMPLES / "cpu-demo.yaml").resolve()
    result = run_cli("--answers", str(example), "-o", "here", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert (tmp_path / "here" / "cpu-demo" / "launch" / "node1.sh").is_file()
    assert os.access(tmp_path / "here" / "cpu-demo" / "launch" / "node1.sh", os.X_OK)
