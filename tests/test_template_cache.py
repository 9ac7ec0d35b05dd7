"""The compiled-template cache: it saves compiling, never changes a render, never fails one."""

from __future__ import annotations

import filecmp
import os
import subprocess
import sys
from pathlib import Path

import jinja2
import pytest

from tests.factories import answers
from wizard.render import render
from wizard.templates import template_cache

EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "cpu-demo.yaml"


def cli_render(out: Path, cache: str) -> subprocess.CompletedProcess[str]:
    """`npu-wizard --answers examples/cpu-demo.yaml -o OUT` with NPU_WIZARD_CACHE_DIR=cache."""
    env = {**os.environ, "NPU_WIZARD_CACHE_DIR": cache}
    return subprocess.run(
        [sys.executable, "-m", "wizard", "--answers", str(EXAMPLE), "-o", str(out)],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def same_tree(left: Path, right: Path) -> bool:
    """Whether two folders hold the same files with the same bytes."""
    files = sorted(str(p.relative_to(left)) for p in left.rglob("*") if p.is_file())
    if files != sorted(str(p.relative_to(right)) for p in right.rglob("*") if p.is_file()):
        return False
    match, mismatch, errors = filecmp.cmpfiles(left, right, files, shallow=False)
    return not mismatch and not errors


def test_a_cached_render_is_byte_for_byte_an_uncached_one_and_the_cache_stays_out_of_the_project(
    tmp_path: Path,
) -> None:
    cache = tmp_path / "cache"
    for name in ("cold", "warm"):
        assert cli_render(tmp_path / name, str(cache)).returncode == 0
    assert cli_render(tmp_path / "none", "").returncode == 0
    assert sorted(p.name for p in (cache / "templates").iterdir())  # the cold render filled it
    assert same_tree(tmp_path / "warm", tmp_path / "none") and same_tree(tmp_path / "cold", tmp_path / "none")
    assert [p.name for p in (tmp_path / "warm").iterdir()] == ["cpu-demo"]


def test_a_warm_cache_spares_compiling_the_project_templates(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NPU_WIZARD_CACHE_DIR", str(tmp_path / "cache"))
    compiled: list[str | None] = []
    real_compile = jinja2.Environment.compile

    def counting_compile(self: jinja2.Environment, source: object, name: str | None = None, *args: object) -> object:
        compiled.append(name)
        return real_compile(self, source, name, *args)

    monkeypatch.setattr(jinja2.Environment, "compile", counting_compile)
    render(answers(), tmp_path / "first")
    cold = [name for name in compiled if name]  # file templates have a name; file names are compiled as strings
    compiled.clear()
    render(answers(), tmp_path / "second")
    assert cold and [name for name in compiled if name] == []


@pytest.mark.parametrize("problem", ["a file where the folder should be", "corrupt entries"])
def test_a_broken_cache_never_fails_or_changes_a_render(tmp_path: Path, problem: str) -> None:
    cache = tmp_path / "cache"
    if problem == "corrupt entries":
        assert cli_render(tmp_path / "fill", str(cache)).returncode == 0
        for entry in (cache / "templates").iterdir():
            entry.write_bytes(b"j2\x00garbage")
        where = str(cache)
    else:
        cache.write_text("not a folder")
        where = str(cache / "below")
    result = cli_render(tmp_path / "out", where)
    assert (result.returncode, result.stderr) == (0, "")
    assert cli_render(tmp_path / "none", "").returncode == 0
    assert same_tree(tmp_path / "out", tmp_path / "none")


def test_the_cache_folder_follows_the_environment(tmp_path: Path) -> None:
    assert template_cache({"NPU_WIZARD_CACHE_DIR": ""}) is None
    xdg = template_cache({"XDG_CACHE_HOME": str(tmp_path / "xdg")})
    assert xdg is not None and Path(xdg.directory) == tmp_path / "xdg" / "npu-wizard" / "templates"
    named = template_cache({"NPU_WIZARD_CACHE_DIR": str(tmp_path / "named"), "XDG_CACHE_HOME": str(tmp_path / "x")})
    assert named is not None and Path(named.directory) == tmp_path / "named" / "templates"
