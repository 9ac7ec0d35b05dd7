"""The three-way line merge behind `npu-wizard update`, against exact texts and against git merge-file."""

from __future__ import annotations

import random
import shutil
import subprocess
from pathlib import Path

import pytest

from wizard.render.merge import Conflict, MergeResult, merge, merge_two_way

BASE = "".join(f"line {n}\n" for n in range(1, 11))


def edit(text: str, **lines: str) -> str:
    """`text` with line N replaced (keys like l3="new")."""
    rows = text.splitlines(keepends=True)
    for key, value in lines.items():
        rows[int(key[1:]) - 1] = value + "\n"
    return "".join(rows)


def test_edits_two_lines_apart_merge_cleanly() -> None:
    result = merge(BASE, edit(BASE, l4="yours"), edit(BASE, l6="theirs"))
    assert result.clean
    assert result.text == edit(BASE, l4="yours", l6="theirs")


def test_edits_on_neighbouring_lines_are_one_conflict_with_markers() -> None:
    result = merge(BASE, edit(BASE, l4="yours"), edit(BASE, l5="theirs"))
    assert result.conflicts == (Conflict(4, 5),)
    assert result.text == "".join(
        [*(f"line {n}\n" for n in range(1, 4))]
        + ["<<<<<<< yours\n", "yours\n", "line 5\n", "=======\n", "line 4\n", "theirs\n", ">>>>>>> npu-wizard update\n"]
        + [f"line {n}\n" for n in range(6, 11)]
    )
    assert result.conflicts[0].describe() == "lines 4-5"


def test_the_same_change_on_both_sides_is_no_conflict() -> None:
    both = edit(BASE, l2="same", l9="same")
    assert merge(BASE, both, both).text == both
    assert merge(BASE, edit(BASE, l2="same"), both).text == both


def test_one_sided_changes_take_that_side() -> None:
    mine = BASE + "added by you\n"
    assert merge(BASE, mine, BASE).text == mine
    assert merge(BASE, BASE, mine).text == mine


def test_a_deletion_next_to_an_unchanged_line_and_an_insertion_elsewhere_merge() -> None:
    mine = BASE.replace("line 2\n", "")
    theirs = BASE.replace("line 8\n", "line 8\ninserted\n")
    result = merge(BASE, mine, theirs)
    assert result.clean
    assert result.text == BASE.replace("line 2\n", "").replace("line 8\n", "line 8\ninserted\n")


def test_a_file_without_a_final_newline_gets_markers_on_their_own_lines() -> None:
    result = merge("a\nb", "a\nmine", "a\ntheirs")
    assert result.text == "a\n<<<<<<< yours\nmine\n=======\ntheirs\n>>>>>>> npu-wizard update\n"
    assert result.conflicts == (Conflict(2, 2),)


def random_edits(rng: random.Random, lines: list[str], tag: str) -> list[str]:
    """A few random line changes, deletions and insertions."""
    out = list(lines)
    for count in range(rng.randint(1, 4)):
        at = rng.randrange(len(out))
        kind = rng.choice("cdi")
        if kind == "c":
            out[at] = f"{tag} changed {count}\n"
        elif kind == "d":
            del out[at]
        else:
            out.insert(at, f"{tag} inserted {count}\n")
    return out


def take_side(text: str, side: str) -> str:
    """A merged text with every conflict resolved to one side ("yours" or "theirs")."""
    out, part = [], "both"
    for line in text.splitlines(keepends=True):
        if line.startswith("<<<<<<< "):
            part = "yours"
        elif line == "=======\n" and part == "yours":
            part = "theirs"
        elif line.startswith(">>>>>>> ") and part == "theirs":
            part = "both"
        elif part in ("both", side):
            out.append(line)
    return "".join(out)


@pytest.mark.skipif(shutil.which("git") is None, reason="git merge-file is the reference; git is not installed")
def test_agrees_with_git_merge_file_on_random_edits(tmp_path: Path) -> None:
    # git joins conflicts a few lines apart into one; this merge keeps them apart, so
    # conflicts are compared by how they resolve: all-yours and all-theirs must agree.
    rng = random.Random(13)
    base = [f"line {n}\n" for n in range(40)]
    clean = 0
    for case in range(150):
        mine, theirs = random_edits(rng, base, "yours"), random_edits(rng, base, "theirs")
        for name, lines in (("base", base), ("mine", mine), ("theirs", theirs)):
            (tmp_path / name).write_text("".join(lines))
        result = merge("".join(base), "".join(mine), "".join(theirs))
        for option, side in (("--ours", "yours"), ("--theirs", "theirs")):
            git = subprocess.run(
                ["git", "merge-file", "-p", option, "mine", "base", "theirs"],
                cwd=tmp_path,
                capture_output=True,
                text=True,
                check=False,
            )
            assert take_side(result.text, side) == git.stdout, f"case {case}, {option}"
        plain = subprocess.run(["git", "merge-file", "-p", "mine", "base", "theirs"], cwd=tmp_path, capture_output=True)
        assert result.clean == (plain.returncode == 0), f"case {case}"
        assert len(result.conflicts) >= plain.returncode, f"case {case}"
        clean += result.clean
    assert 0 < clean < 150  # both outcomes were exercised


def test_two_way_keeps_shared_lines_and_makes_every_difference_a_conflict() -> None:
    yours = "a\nmine\nb\nc\nadded by me\n"
    theirs = "a\ntheirs\nb\nc\n"
    result = merge_two_way(yours, theirs)
    assert result.text == (
        "a\n<<<<<<< yours\nmine\n=======\ntheirs\n>>>>>>> npu-wizard update\nb\nc\n"
        "<<<<<<< yours\nadded by me\n=======\n>>>>>>> npu-wizard update\n"
    )
    assert [c.describe() for c in result.conflicts] == ["line 2", "line 5"]
    assert take_side(result.text, "yours") == yours
    assert take_side(result.text, "theirs") == theirs
    assert merge_two_way(yours, yours) == MergeResult(yours, ())
