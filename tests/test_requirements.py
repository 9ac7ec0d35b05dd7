"""The generated requirements.txt, read as pip reads it: every platform gets one CPU torch.

Each matrix project's file is parsed with `packaging` and its markers are
evaluated for x86_64 and aarch64 Linux: exactly one torch applies on each,
the CPU build where PyPI's default is the CUDA one, torchvision pinned to the
release that pairs with torch, NumPy 1.x for torch before 2.3 (ASCEND.md).
"""

from __future__ import annotations

from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet
from packaging.version import Version

from tests.matrix import ALL, case_answers
from wizard.answers.model import Answers, resolve
from wizard.render.render import render

PLATFORMS = ("x86_64", "aarch64")
CPU_INDEX = "--extra-index-url https://download.pytorch.org/whl/cpu"


def requirements_of(answers: Answers, tmp_path: Path) -> tuple[list[str], list[Requirement]]:
    """The pip options and the requirements of the rendered project's requirements.txt."""
    project = render(answers, tmp_path).project_dir
    lines = [line.strip() for line in (project / "requirements.txt").read_text().splitlines()]
    entries = [line for line in lines if line and not line.startswith("#")]
    options = [line for line in entries if line.startswith("-")]
    return options, [Requirement(line) for line in entries if not line.startswith("-")]


def applying(requirements: list[Requirement], name: str, machine: str) -> list[Requirement]:
    """The requirements named `name` whose markers hold on Linux `machine`."""
    env = {"platform_machine": machine, "sys_platform": "linux"}
    return [r for r in requirements if r.name == name and (r.marker is None or r.marker.evaluate(env))]


def pinned(requirement: Requirement) -> Version:
    """The version an exact pin (==X) names."""
    (spec,) = requirement.specifier
    assert spec.operator == "==", requirement
    return Version(spec.version)


@pytest.mark.parametrize("case", ALL)
def test_each_platform_gets_exactly_one_cpu_torch(case: str, tmp_path: Path) -> None:
    answers = case_answers(case)
    options, requirements = requirements_of(answers, tmp_path)
    assert CPU_INDEX in options
    for machine in PLATFORMS:
        (torch,) = applying(requirements, "torch", machine)
        if answers["device"] == "cpu":
            assert not applying(requirements, "torch-npu", machine)
            continue
        version = pinned(torch)
        assert version.public == answers["environment.torch_version"]
        assert version.local == ("cpu" if machine == "x86_64" else None)
        (npu,) = applying(requirements, "torch-npu", machine)
        assert str(pinned(npu)) == answers["environment.torch_npu_version"]


@pytest.mark.parametrize(
    ("torch_npu", "torch", "vision", "numpy_below_2"),
    [
        ("2.1.0.post10", "2.1.0", "0.16.0", True),
        ("2.3.1.post4", "2.3.1", "0.18.1", False),
        ("2.5.1", "2.5.1", "0.20.1", False),
        ("2.7.1.post8", "2.7.1", "0.22.1", False),
        ("2.9.0.post6", "2.9.0", "0.24.0", False),
    ],
)
def test_torchvision_pairs_with_torch_and_old_torch_keeps_numpy_1(
    torch_npu: str, torch: str, vision: str, numpy_below_2: bool, tmp_path: Path
) -> None:
    raw = {
        "device": "npu",
        "training.model": "resnet18",
        "training.dataset": "imagefolder",
        "environment.torch_npu_version": torch_npu,
        "environment.torch_version": torch,
    }
    _, requirements = requirements_of(resolve(raw), tmp_path)
    for machine in PLATFORMS:
        (torchvision,) = applying(requirements, "torchvision", machine)
        assert pinned(torchvision).public == vision
        assert pinned(torchvision).local == ("cpu" if machine == "x86_64" else None)
        numpy = applying(requirements, "numpy", machine)
        if numpy_below_2:
            (only,) = numpy
            assert only.specifier == SpecifierSet("<2")
        else:
            assert numpy == []
