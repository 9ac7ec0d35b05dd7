"""`npu-wizard update` on a project whose files or pristine copy are not as it wrote them: real renders, real runs."""

from __future__ import annotations

import resource
import subprocess
import sys
import zlib
from pathlib import Path

from tests.test_update import edit_answers, files_of, project_raw, render_project, update
from wizard.pristine import PRISTINE, Pristine, encode, load

# Runs `npu-wizard ARGS` and prints the process's peak resident memory at exit (KiB, as getrusage gives it).
PEAK_MEMORY = """
import resource, sys
from wizard.cli import main
code = main(sys.argv[1:])
print(f"peak {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss}", flush=True)
sys.exit(code)
"""
GBK_NOTE = "# 机架七的两台机器: 节点零在上\n".encode("gbk")  # a note saved by an editor set to GBK
ADDRESS_SPACE = 3 * 2**30  # so that a run of the unfixed code fails with MemoryError, not by taking the machine


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
