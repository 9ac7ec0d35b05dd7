"""`npu-wizard update` on a project whose files or pristine copy are not as it wrote them: real renders, real runs."""

from __future__ import annotations

import gzip
import json
import resource
import subprocess
import sys
import zlib
from collections.abc import Callable
from pathlib import Path

import pytest
import yaml

from tests.test_merge import take_side
from tests.test_update import (
    USER_MODEL,
    edit_answers,
    files_of,
    project_raw,
    render_project,
    replace_build_model,
    two_node_project_with_my_model,
    update,
)
from wizard.render.pristine import PRISTINE, Pristine, encode, load, same_copy

# Runs `npu-wizard ARGS` and prints the process's peak resident memory at exit (KiB, as getrusage gives it).
PEAK_MEMORY = """
import sys
from wizard.cli import main
code = main(sys.argv[1:])
# VmHWM belongs to this process's own memory map: ru_maxrss would carry the forking parent's size over exec
print("peak", next(line.split()[1] for line in open("/proc/self/status") if line.startswith("VmHWM:")), flush=True)
sys.exit(code)
"""
GBK_NOTE = "# 机架七的两台机器: 节点零在上\n".encode("gbk")  # a note saved by an editor set to GBK
ADDRESS_SPACE = 3 * 2**30
DAMAGES: dict[str, Callable[[bytes], bytes | None]] = {
    "truncated": lambda data: data[: len(data) // 2],
    "not gzip": lambda data: b"pristine copy\n",
    "wrong JSON shape": lambda data: gzip.compress(json.dumps({"files": ["train.py"]}).encode()),
    "missing": lambda data: None,
}  # so that a run of the unfixed code fails with MemoryError, not by taking the machine


def gzip_bomb(path: Path, member_mib: int, members: int) -> None:
    """A gzip file of `members` members, each of `member_mib` MiB of spaces: kilobytes that unpack to gigabytes."""
    packer = zlib.compressobj(9, zlib.DEFLATED, 31)
    member = b"".join(packer.compress(b" " * 2**20) for _ in range(member_mib)) + packer.flush()
    path.write_bytes(member * members)


def run_measured(*argv: str) -> tuple[subprocess.CompletedProcess[str], int]:
    """Run `npu-wizard ARGV` in a fresh interpreter with a bounded address space; its result and peak RSS in MiB."""

    def bound() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (ADDRESS_SPACE, ADDRESS_SPACE))

    result = subprocess.run(
        [sys.executable, "-c", PEAK_MEMORY, *argv], capture_output=True, text=True, timeout=300, preexec_fn=bound
    )
    peaks = [line for line in result.stdout.splitlines() if line.startswith("peak ")]
    assert peaks, result.stdout + result.stderr
    return result, int(peaks[-1].split()[1]) // 1024


def test_a_gzip_bomb_as_the_pristine_copy_is_refused_naming_it_in_little_memory(tmp_path: Path) -> None:
    project = render_project(tmp_path, project_raw(2))
    bomb = project / PRISTINE
    gzip_bomb(bomb, member_mib=128, members=8)  # 1 GiB unpacked
    assert bomb.stat().st_size < 2 * 2**20
    before = files_of(project)

    result, peak_mib = run_measured("update", str(project))

    print(f"peak RSS of update on a {bomb.stat().st_size} byte gzip bomb: {peak_mib} MiB")
    assert result.returncode == 1, result.stdout + result.stderr
    assert f"{PRISTINE} is damaged (it unpacks to more than 64 MiB" in result.stderr
    assert "Traceback" not in result.stderr
    assert peak_mib < 256
    assert files_of(project) == before


def test_a_pristine_copy_naming_a_file_outside_the_project_is_refused_and_that_file_stays(tmp_path: Path) -> None:
    project = render_project(tmp_path / "projects", project_raw(2))
    victim = tmp_path / "victim.txt"
    victim.write_text("someone's notes\n")
    kept = load(project)
    crafted = Pristine(kept.generator, {**kept.files, "../../victim.txt": victim.read_text()}, kept.executable)
    (project / PRISTINE).write_bytes(encode(crafted))

    result = update(project)

    assert result.returncode == 1, result.stdout + result.stderr
    assert f"{PRISTINE} is damaged ('../../victim.txt' is not a file name inside a project)" in result.stderr
    assert victim.read_text() == "someone's notes\n"


# ---- a file edited in another encoding ------------------------------------------------


def test_a_file_edited_in_gbk_is_merged_byte_for_byte(tmp_path: Path) -> None:
    project = render_project(tmp_path, project_raw(2))
    train = project / "train.py"
    generated = train.read_bytes()
    train.write_bytes(GBK_NOTE + generated)
    edit_answers(project, nodes=4, network__host_ips=["127.0.0.1"] * 4)

    result = update(project)

    assert result.returncode == 0, result.stdout + result.stderr
    assert "  merged   train.py (your edits kept)" in result.stdout.splitlines()
    assert train.read_bytes() == GBK_NOTE + generated.replace(b"NODES = 2\n", b"NODES = 4\n")


def test_a_file_saved_as_utf16_is_named_and_nothing_changes(tmp_path: Path) -> None:
    project = render_project(tmp_path, project_raw(2))
    readme = project / "README.md"
    readme.write_bytes(readme.read_text().encode("utf-16"))
    edit_answers(project, nodes=4, network__host_ips=["127.0.0.1"] * 4)
    before = files_of(project)

    result = update(project)

    assert result.returncode == 1, result.stdout + result.stderr
    assert result.stderr.startswith(f"npu-wizard: {readme} holds NUL bytes (a binary file, or text saved as UTF-16)")
    assert "save it as UTF-8" in result.stderr
    assert files_of(project) == before


# ---- a damaged pristine copy: update --rebase keeps the edits ---------------------------


def damage_pristine(project: Path, damage: str) -> None:
    """Damage the project's pristine copy as DAMAGES names."""
    copy = project / PRISTINE
    damaged = DAMAGES[damage](copy.read_bytes())
    if damaged is None:
        copy.unlink()
    else:
        copy.write_bytes(damaged)


def fresh_render(tmp_path: Path, project: Path, nodes: int) -> Path:
    """A fresh render of the project's answers with `nodes` nodes (the same master port)."""
    port = yaml.safe_load((project / "answers.yaml").read_text())["network"]["master_port"]
    raw = project_raw(nodes, **{"network.master_port": port, "network.host_ips": ["127.0.0.1"] * nodes})
    return render_project(tmp_path / "fresh", raw)


def test_a_copy_stored_at_another_gzip_level_is_left_alone_by_an_update_with_nothing_to_change(tmp_path: Path) -> None:
    project = render_project(tmp_path / "out", project_raw(2))
    copy = project / PRISTINE
    # as npu-wizard stored it before its level 1: the same document in other bytes
    older = gzip.compress(gzip.decompress(copy.read_bytes()), compresslevel=6, mtime=0)
    assert older != copy.read_bytes()
    copy.write_bytes(older)
    written = copy.stat().st_mtime_ns

    result = update(project)

    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.endswith(": nothing to change\n")
    assert copy.read_bytes() == older and copy.stat().st_mtime_ns == written


def test_a_stored_copy_matches_only_the_same_document_and_never_when_damaged() -> None:
    copy = Pristine("npu-wizard test", {"train.py": "print()\n", "launch/node0.sh": "exit 0\n"}, frozenset())
    stored = encode(copy)
    document = gzip.decompress(stored)
    assert same_copy(gzip.compress(document, compresslevel=9, mtime=1), stored)
    assert not same_copy(stored, encode(Pristine(copy.generator, copy.files, frozenset({"launch/node0.sh"}))))
    assert not same_copy(stored, encode(Pristine(copy.generator, {**copy.files, "train.py": "pass\n"}, frozenset())))
    for damage in DAMAGES.values():
        assert not same_copy(damage(stored) or b"", stored)


@pytest.mark.parametrize("damage", DAMAGES)
def test_a_damaged_pristine_copy_is_refused_naming_rebase_which_keeps_my_edit(tmp_path: Path, damage: str) -> None:
    project = two_node_project_with_my_model(tmp_path)
    mine = (project / "train.py").read_text()
    damage_pristine(project, damage)
    edit_answers(project, nodes=4, network__host_ips=["127.0.0.1"] * 4)
    before = files_of(project)

    refused = update(project)

    assert refused.returncode == 1, refused.stdout + refused.stderr
    assert PRISTINE in refused.stderr
    assert f"To keep them: npu-wizard update {project} --rebase puts <<<<<<< markers" in refused.stderr
    assert "Traceback" not in refused.stderr
    assert files_of(project) == before

    rebased = update(project, "--rebase")

    assert rebased.returncode == 1, rebased.stdout + rebased.stderr
    assert "  added    launch/node3.sh" in rebased.stdout.splitlines()
    assert "file(s) with conflicts written with <<<<<<< markers: " in rebased.stderr
    merged = (project / "train.py").read_text()
    assert take_side(merged, "yours") == mine  # my model, whole, on the "yours" side of the markers
    fresh = fresh_render(tmp_path, project, 4)
    assert take_side(merged, "theirs") == (fresh / "train.py").read_text()
    assert load(project).files["train.py"] == (fresh / "train.py").read_text()  # the new base


def test_after_a_rebase_resolved_the_next_update_merges_three_ways_again(tmp_path: Path) -> None:
    project = two_node_project_with_my_model(tmp_path)
    damage_pristine(project, "truncated")
    edit_answers(project, nodes=4, network__host_ips=["127.0.0.1"] * 4)
    assert update(project, "--rebase").returncode == 1
    fresh = fresh_render(tmp_path, project, 4)
    for name in ("README.md", "launch/node0.sh", "launch/node1.sh", "launch/run-node.sh"):  # never edited: theirs
        (project / name).write_text(take_side((project / name).read_text(), "theirs"))
    (project / "train.py").write_text(replace_build_model((fresh / "train.py").read_text()))
    assert update(project).stdout.endswith(": nothing to change\n")
    edit_answers(project, amp="bf16")

    result = update(project)

    assert result.returncode == 0, result.stdout + result.stderr
    assert "  merged   train.py (your edits kept)" in result.stdout.splitlines()
    assert 'AMP = "bf16"' in (project / "train.py").read_text()
    assert USER_MODEL in (project / "train.py").read_text()


def test_rebase_with_the_old_answers_kept_updates_the_files_i_never_edited_cleanly(tmp_path: Path) -> None:
    project = two_node_project_with_my_model(tmp_path)
    damage_pristine(project, "not gzip")
    new_answers = yaml.safe_load((project / "answers.yaml").read_text())
    new_answers["nodes"], new_answers["network"]["host_ips"] = 4, ["127.0.0.1"] * 4
    (tmp_path / "four.yaml").write_text(yaml.safe_dump(new_answers))

    result = update(project, "--rebase", "--answers", str(tmp_path / "four.yaml"))

    assert result.returncode == 1, result.stdout + result.stderr
    changes = result.stdout.splitlines()[1:]
    assert [line.split()[:2] for line in changes] == [
        ["updated", "README.md"],
        ["updated", "answers.yaml"],
        ["updated", "launch/node0.sh"],
        ["updated", "launch/node1.sh"],
        ["added", "launch/node2.sh"],
        ["added", "launch/node3.sh"],
        ["updated", "launch/run-node.sh"],
        ["conflict", "train.py:"],
    ]
    fresh = fresh_render(tmp_path, project, 4)
    assert (project / "README.md").read_text() == (fresh / "README.md").read_text()
    assert USER_MODEL in take_side((project / "train.py").read_text(), "yours")


def test_a_generated_file_linked_outside_is_never_read_and_named(tmp_path: Path) -> None:
    project = render_project(tmp_path / "projects", project_raw(2))
    edit_answers(project, nodes=4, network__host_ips=["127.0.0.1"] * 4)
    outside = tmp_path / "outside.bin"
    outside.write_bytes(b"secret\0bytes\n")  # what reading it would tell: NUL bytes
    (project / "train.py").unlink()
    (project / "train.py").symlink_to(outside)
    before = files_of(project)

    for args in [(), ("--rebase",)]:
        result = update(project, *args)

        assert result.returncode == 1, result.stdout + result.stderr
        assert "Traceback" not in result.stderr and "NUL" not in result.stderr
        assert f"  - train.py is a symbolic link (to {outside}) and update neither writes" in result.stderr
        assert files_of(project) == before
