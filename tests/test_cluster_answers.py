"""Cluster answers and numbers that must be refused: each names its key and value, and nothing is written."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import pytest
from textual.pilot import Pilot
from textual.widgets import Static

from tests.factories import answers_yaml
from tests.test_tui_cluster import go_to_cluster
from tests.tui_driver import answer, field, pick, run_wizard
from tests.wizard_forks import wizard
from wizard.answers.model import load_text, resolve
from wizard.answers.questions import BY_NAME
from wizard.errors import AnswersError
from wizard.tui.state import check_text

CPU = {"project_name": "demo", "device": "cpu", "nodes": 1, "devices_per_node": 2, "amp": "off"}
SLURM = {**CPU, "cluster.engine": "slurm"}
SSH = {**CPU, "nodes": 2, "network.host_ips": ["127.0.0.1", "127.0.0.1"], "cluster.engine": "ssh"}
KUBERNETES = {**CPU, "cluster.engine": "pytorchjob", "cluster.image": "registry.example.com/train:8.1"}
ONE_YEAR = "at most 365 days (8760:00:00 or 365-00:00:00)"
CONTROL = "holds a control character ('\\n') at the end; write it on one line"


def refusal(raw: dict[str, Any]) -> list[tuple[str, str]]:
    """Each error of these answers as (key, message); none when they resolve."""
    try:
        resolve(raw)
    except AnswersError as error:
        return [(problem.field, problem.message) for problem in error.problems]
    return []


def render(tmp_path: Path, document: dict[str, Any] | str) -> subprocess.CompletedProcess[str]:
    """`npu-wizard --answers FILE -o OUT`, a process of its own (tests/wizard_forks.py)."""
    text = document if isinstance(document, str) else answers_yaml(document)
    (tmp_path / "answers.yaml").write_text(text)
    return wizard(["--answers", str(tmp_path / "answers.yaml"), "-o", str(tmp_path / "out")], timeout=120)


@pytest.mark.parametrize(
    ("time", "message"),
    [
        ("١٢:00:00", "must be a time limit as HH:MM:SS, D-HH:MM:SS or whole minutes, at most 365 days"),
        ("１２:00:00", "must be a time limit as HH:MM:SS, D-HH:MM:SS or whole minutes, at most 365 days"),
        ("١-02:00:00", "must be a time limit as HH:MM:SS, D-HH:MM:SS or whole minutes, at most 365 days"),
        ("8761:00:00", ONE_YEAR),
        ("366-00:00:00", ONE_YEAR),
        ("1-24:00:00", "after the days (D-HH:MM:SS) the hours run from 00 to 23"),
        (27777777777777777777777 * 3600 + 46 * 60 + 39, ONE_YEAR),
    ],
    ids=["arabic-indic-hours", "fullwidth-hours", "arabic-indic-days", "hours", "days", "day-hours", "huge"],
)
def test_a_slurm_time_takes_ascii_digits_and_at_most_a_year(time: object, message: str) -> None:
    assert refusal({**SLURM, "cluster.time": time}) == [("cluster.time", message)]


@pytest.mark.parametrize("time", ["8760:00:00", "365-00:00:00", "0-23:59:59", "00:20:00"])
def test_a_slurm_time_up_to_a_year_is_kept_as_written(time: str) -> None:
    assert resolve({**SLURM, "cluster.time": time})["cluster.time"] == time


def test_a_huge_time_in_an_answers_file_is_refused_and_nothing_is_written(tmp_path: Path) -> None:
    text = answers_yaml(CPU) + "cluster:\n  engine: slurm\n  time: 9999999999999999\n"
    result = render(tmp_path, text)
    assert result.returncode == 1, result.stdout + result.stderr
    assert f"cluster.time: 9999999999999999: {ONE_YEAR}" in result.stderr
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(
    ("time", "written"),
    [("240", "04:00:00"), ("'240'", "04:00:00"), ("12:00:00", "12:00:00"), ("525600", "8760:00:00")],
    ids=["minutes", "quoted-minutes", "unquoted-hh-mm-ss", "a-year-of-minutes"],
)
def test_a_bare_number_of_minutes_is_read_as_slurm_reads_it(time: str, written: str, tmp_path: Path) -> None:
    result = render(tmp_path, answers_yaml(CPU) + f"cluster:\n  engine: slurm\n  time: {time}\n")
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"#SBATCH --time={written}\n" in (tmp_path / "out" / "demo" / "slurm" / "job.sbatch").read_text()
    assert load_text((tmp_path / "out" / "demo" / "answers.yaml").read_text())["cluster.time"] == written


@pytest.mark.parametrize(
    ("raw", "field", "limit"),
    [
        ({**SLURM, "cluster.gres": "gpu:910b:" + "8" * 300}, "cluster.gres", 256),
        ({**KUBERNETES, "cluster.image": "registry.example.com/" + "a" * 600 + ":8.1"}, "cluster.image", 512),
    ],
)
def test_gres_and_image_have_a_length_cap(raw: dict[str, Any], field: str, limit: int) -> None:
    assert refusal(raw) == [(field, f"too long: at most {limit} characters")]


@pytest.mark.parametrize(
    ("raw", "field", "message"),
    [
        ({**SSH, "cluster.ssh_hosts": ["node1", "node2\n"]}, "cluster.ssh_hosts", CONTROL),
        ({**SSH, "cluster.ssh_hosts": ["node1", "fe80::1%eth0\n"]}, "cluster.ssh_hosts", CONTROL),
        ({**KUBERNETES, "cluster.node_selector": {"zone": "a\n"}}, "cluster.node_selector", CONTROL),
        ({**KUBERNETES, "cluster.node_selector": {"zone\n": "a"}}, "cluster.node_selector", CONTROL),
        (
            {**KUBERNETES, "cluster.node_selector": "zone=a\x1b[2J, tier=b"},
            "cluster.node_selector",
            "holds a control character ('\\x1b') at character 7; write it on one line",
        ),
    ],
    ids=["ssh-host", "ssh-zone", "label-value", "label-key", "escape"],
)
def test_a_control_character_in_a_host_or_label_is_refused(raw: dict[str, Any], field: str, message: str) -> None:
    assert refusal(raw) == [(field, message)]


@pytest.mark.parametrize(
    ("data_dir", "why"),
    [
        ("/", "/, the root of the pod"),
        ("../..", "/, the root of the pod"),
        ("/usr", "/usr, a system folder of the image"),
        ("/etc", "/etc, a system folder of the image"),
        ("/usr/local/Ascend/driver", "/usr/local/Ascend/driver, inside a system folder of the image"),
        (".", "/workspace/demo, the project's own folder in the pod"),
        ("..", "/workspace, which holds the project's folder in the pod"),
        ("/opt", "/opt, which holds /opt/npu-wizard/project"),
    ],
)
@pytest.mark.parametrize("volume", [{"cluster.data_pvc": "imagenet"}, {"cluster.data_host_path": "/srv/imagenet"}])
def test_the_data_volume_is_never_mounted_over_the_root_a_system_folder_or_the_project(
    data_dir: str, why: str, volume: dict[str, str]
) -> None:
    raw = {**KUBERNETES, **volume, "training.dataset": "imagefolder", "training.data_dir": data_dir}
    assert refusal(raw) == [
        (
            "training.data_dir",
            f"the data volume is mounted at the data folder, here {why}; "
            "give a folder inside the project, such as data",
        )
    ]


@pytest.mark.parametrize("data_dir", ["data", "/data", "../imagenet", "/srv/imagenet"])
def test_a_data_folder_of_its_own_takes_the_data_volume(data_dir: str) -> None:
    raw = {
        **KUBERNETES,
        "cluster.data_pvc": "imagenet",
        "training.dataset": "imagefolder",
        "training.data_dir": data_dir,
    }
    assert refusal(raw) == []


@pytest.mark.parametrize(
    ("name", "text"),
    [
        ("training.epochs", "1_0"),
        ("training.epochs", "١٠"),
        ("training.epochs", "１０"),
        ("training.batch_size", "3_2"),
        ("training.lr", "0.0_1"),
        ("training.lr", "٠.١"),
    ],
)
def test_a_number_given_as_text_is_plain_ascii_digits(name: str, text: str) -> None:
    allowed = BY_NAME[name].allowed()
    assert refusal({**CPU, name: text}) == [(name, f"must be {allowed}, written with the digits 0-9")]
    assert check_text(BY_NAME[name], text) == f"must be {allowed}, written with the digits 0-9"  # the wizard's field


def test_a_number_with_spaces_around_it_is_read_as_written() -> None:
    assert resolve({**CPU, "training.epochs": " 10 ", "training.lr": " 0.5 "})["training.epochs"] == 10


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ("epochs: 1_0", "1_0: YAML reads it as a number without the '_'; write the digits alone"),
        ("epochs: 010", "010: YAML reads a number with a leading 0 as octal; write it without the 0, or quote it"),
    ],
)
def test_a_yaml_number_that_yaml_would_misread_is_refused(line: str, message: str) -> None:
    with pytest.raises(AnswersError) as raised:
        load_text(answers_yaml(CPU) + f"training:\n  {line}\n")
    assert [problem.message for problem in raised.value.problems] == [f"the answers file, line 8: {message}"]


def test_the_wizard_refuses_unicode_digits_in_the_time_limit() -> None:
    async def scenario(pilot: Pilot[int]) -> None:
        await go_to_cluster(pilot)
        await pick(pilot, "cluster.engine", "slurm")
        await answer(pilot, "cluster.time", "١٢:00:00")
        problem = str(field(pilot, "cluster.time").query_one(".problem", Static).render())
        assert "HH:MM:SS" in problem
        await answer(pilot, "cluster.time", "9000:00:00")
        problem = str(field(pilot, "cluster.time").query_one(".problem", Static).render())
        assert "at most 365 days" in problem

    run_wizard(scenario)
