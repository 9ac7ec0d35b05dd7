"""The CANN release a rank runs with, read from the toolkit's own version files (runtime/cann.py), as its
started event records it (runtime/provenance.py). The toolkit folders here are fakes laid out as CANN installs."""

from __future__ import annotations

import platform
from pathlib import Path

from runtime import cann, provenance


def fake_toolkit(root: Path, info: str | None = None, cfg: str | None = None) -> Path:
    """A CANN toolkit folder (what ASCEND_HOME_PATH names) with the version files given."""
    home = root / "Ascend" / "ascend-toolkit" / "latest"
    (home / f"{platform.machine()}-linux").mkdir(parents=True)
    if info is not None:
        (home / f"{platform.machine()}-linux" / "ascend_toolkit_install.info").write_text(info)
    if cfg is not None:
        (home / "version.cfg").write_text(cfg)
    return home


def test_the_install_info_s_version_field_names_the_release(tmp_path: Path) -> None:
    home = fake_toolkit(
        tmp_path,
        info="package_name=Ascend-cann-toolkit\nversion=8.0.RC2\ninnerversion=V100R001C18SPC001B230\narch=x\n",
        cfg="toolkit_running_version=[7.3.0.1.231:8.1.RC1]\n",
    )
    assert cann.toolkit_version(str(home)) == "8.0.RC2"


def test_without_the_install_info_version_cfg_s_release_part_is_read(tmp_path: Path) -> None:
    home = fake_toolkit(
        tmp_path, cfg="# version\nruntime_installed_version=[x]\ntoolkit_running_version=[7.3.0.1.231:8.0.RC2]\n"
    )
    assert cann.toolkit_version(str(home)) == "8.0.RC2"


def test_a_folder_without_version_files_has_no_release(tmp_path: Path) -> None:
    assert cann.toolkit_version(str(fake_toolkit(tmp_path))) is None
    assert cann.toolkit_version(str(tmp_path / "nowhere")) is None
    assert cann.toolkit_version("") is None


def test_the_started_event_records_the_cann_folder_and_its_release(tmp_path: Path) -> None:
    home = fake_toolkit(tmp_path, info="version=9.1.0\n")
    found = provenance.versions({"ASCEND_HOME_PATH": str(home)})
    assert (found["cann"], found["cann_version"]) == (str(home), "9.1.0")
    assert (provenance.versions({})["cann"], provenance.versions({})["cann_version"]) == (None, None)
