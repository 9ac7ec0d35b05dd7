"""The compiled-template cache: it saves compiling, never changes a render, never fails one."""

from __future__ import annotations

import filecmp
import os
import pickle
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import jinja2
import pytest
from jinja2.bccache import bc_magic

from tests.factories import answers
from wizard.render.render import render
from wizard.render.template_cache import template_cache

EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "cpu-demo.yaml"


def cli_render(
    out: Path, cache: str, env: dict[str, str] | None = None, cwd: Path | None = None
) -> subprocess.CompletedProcess[str]:
    """`npu-wizard --answers examples/cpu-demo.yaml -o OUT` with NPU_WIZARD_CACHE_DIR=cache (or the given env), in a
    fresh interpreter: renders of separate processes, each with its own string-hash seed, must be the same files
    (not tests/wizard_forks.py, whose forks share one)."""
    return subprocess.run(
        [sys.executable, "-m", "wizard", "--answers", str(EXAMPLE), "-o", str(out)],
        env={**os.environ, "NPU_WIZARD_CACHE_DIR": cache} if env is None else env,
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=120,
    )


class WritesMarker:
    """Pickles to a call that writes `marker` when unpickled: what a planted cache entry could run."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[object, tuple[str]]:
        return exec, (f"open({str(self.marker)!r}, 'w').write('ran')",)


def filled(cache: Path, tmp_path: Path) -> list[Path]:
    """The entries a render leaves in `cache`."""
    assert cli_render(tmp_path / "fill", str(cache)).returncode == 0
    entries = sorted((cache / "templates").iterdir())
    assert entries
    return entries


def plant(entries: list[Path], marker: Path) -> None:
    """Replace every entry with jinja2's magic and a pickle that writes `marker` when jinja2 reads it."""
    for entry in entries:
        entry.write_bytes(bc_magic + pickle.dumps(WritesMarker(marker), 2))


def uncached(tmp_path: Path) -> Path:
    """The project as a render without a cache makes it."""
    assert cli_render(tmp_path / "none", "").returncode == 0
    return tmp_path / "none"


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
    assert template_cache({"NPU_WIZARD_CACHE_DIR": ""}) == (None, "")
    xdg, _ = template_cache({"XDG_CACHE_HOME": str(tmp_path / "xdg")})
    assert xdg is not None and Path(xdg.directory) == tmp_path / "xdg" / "npu-wizard" / "templates"
    named, _ = template_cache({"NPU_WIZARD_CACHE_DIR": str(tmp_path / "named"), "XDG_CACHE_HOME": str(tmp_path / "x")})
    assert named is not None and Path(named.directory) == tmp_path / "named" / "templates"


@pytest.mark.parametrize("problem", ["owned by another user", "writable by others", "a symlink"])
def test_a_cache_folder_others_can_write_is_not_used_and_its_planted_entries_never_run(
    tmp_path: Path, problem: str
) -> None:
    cache, marker = tmp_path / "cache", tmp_path / "planted-code-ran"
    plant(filled(cache, tmp_path), marker)
    named, unsafe = cache, cache
    if problem == "owned by another user":
        try:
            for path in (cache, cache / "templates", *(cache / "templates").iterdir()):
                os.chown(path, 65534, 65534)  # nobody
        except PermissionError:
            pytest.skip("only root can give a folder to another user")
        reason = f"it belongs to uid 65534, not to you (uid {os.getuid()})"
    elif problem == "writable by others":
        cache.chmod(0o777)
        reason = "it is writable by group and others (mode 0777)"
    else:
        named = unsafe = tmp_path / "link"
        named.symlink_to(cache)
        reason = "it is a symlink"
    result = cli_render(tmp_path / "out", str(named))
    assert result.returncode == 0 and not marker.exists()
    assert result.stderr.splitlines() == [
        f"warning: not using the template cache {unsafe}: {reason}; delete it, or set NPU_WIZARD_CACHE_DIR "
        "to a folder of your own (renders are slower without it, never different)"
    ]
    assert same_tree(tmp_path / "out", uncached(tmp_path))


@pytest.mark.parametrize("problem", ["writable by others", "a symlink"])
def test_nothing_is_made_in_a_cache_folder_before_it_is_found_to_be_the_users_own(tmp_path: Path, problem: str) -> None:
    cache = tmp_path / "cache"
    cache.mkdir()
    named = cache
    if problem == "writable by others":
        cache.chmod(0o777)
        reason = "it is writable by group and others (mode 0777)"
    else:
        named = tmp_path / "link"
        named.symlink_to(cache)
        reason = "it is a symlink"

    assert template_cache({"NPU_WIZARD_CACHE_DIR": str(named)}) == (
        None,
        f"not using the template cache {named}: {reason}; delete it, or set NPU_WIZARD_CACHE_DIR to a folder of "
        "your own (renders are slower without it, never different)",
    )
    assert list(cache.iterdir()) == []


def test_an_entry_planted_in_the_users_own_cache_is_never_unpickled_but_compiled_anew(tmp_path: Path) -> None:
    cache, marker = tmp_path / "cache", tmp_path / "planted-code-ran"
    entries = filled(cache, tmp_path)
    plant(entries, marker)
    result = cli_render(tmp_path / "out", str(cache))
    assert (result.returncode, result.stderr, marker.exists()) == (0, "", False)
    assert same_tree(tmp_path / "out", uncached(tmp_path))
    assert all(entry.read_bytes().startswith(bc_magic + b"\x80\x02X") for entry in entries)  # compiled anew


def test_a_damaged_entry_is_deleted_and_compiled_anew(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    entries = filled(cache, tmp_path)
    good = {entry: entry.read_bytes() for entry in entries}
    for entry in entries:
        entry.write_bytes(bc_magic + b"garbage")  # jinja2's magic, then bytes that are no pickle
    result = cli_render(tmp_path / "out", str(cache))
    assert (result.returncode, result.stderr) == (0, "")
    assert same_tree(tmp_path / "out", uncached(tmp_path))
    assert {entry: entry.read_bytes() for entry in entries} == good


def test_a_new_cache_folder_is_private(tmp_path: Path) -> None:
    cache, _ = template_cache({"HOME": str(tmp_path / "home")})
    assert cache is not None and Path(cache.directory) == tmp_path / "home" / ".cache" / "npu-wizard" / "templates"
    for folder in (".cache", ".cache/npu-wizard", ".cache/npu-wizard/templates"):
        assert stat.S_IMODE((tmp_path / "home" / folder).stat().st_mode) == 0o700, folder


def test_without_a_home_folder_there_is_no_cache_and_the_render_goes_on(tmp_path: Path) -> None:
    # Path.home() took HOME='' for '/', a cache in /.cache; without HOME it asked the user database, or raised.
    assert template_cache({}) == (None, "")
    assert template_cache({"HOME": ""}) == (None, "")
    assert template_cache({"HOME": "relative"}) == (None, "")
    plain = {k: v for k, v in os.environ.items() if k not in ("NPU_WIZARD_CACHE_DIR", "XDG_CACHE_HOME", "HOME")}
    expected = uncached(tmp_path)
    (tmp_path / "a-file").write_text("not a folder")
    for home in ({}, {"HOME": ""}, {"HOME": str(tmp_path / "a-file")}):
        result = cli_render(tmp_path / "out", "", env={**plain, **home})
        assert (result.returncode, result.stderr) == (0, ""), home
        assert same_tree(tmp_path / "out", expected)
        shutil.rmtree(tmp_path / "out")


def test_the_suites_cache_is_a_private_folder_of_this_run() -> None:
    folder = Path(os.environ["NPU_WIZARD_CACHE_DIR"])
    info = folder.lstat()
    assert stat.S_ISDIR(info.st_mode) and info.st_uid == os.getuid() and stat.S_IMODE(info.st_mode) == 0o700
    assert folder.name != f"npu-wizard-tests-{os.getuid()}"  # the predictable name any local user could make first
