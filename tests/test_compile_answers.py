"""training.compile: the answer, its gates on an NPU (TorchAir per release and series), the render, the TUI."""

from __future__ import annotations

from pathlib import Path

import pytest
from textual.pilot import Pilot
from textual.widgets import Label

from tests.factories import answers, answers_yaml
from tests.tui_driver import field, next_step, pick, run_wizard, until
from wizard.answers import hardware
from wizard.answers.model import dump, from_context, load_text, resolve, to_context
from wizard.errors import AnswersError
from wizard.render.render import render
from wizard.tui import create_app
from wizard.tui.screens import StepScreen

BASE = {"project_name": "fast", "device": "cpu", "nodes": 1, "devices_per_node": 2, "amp": "off"}
NPU = {**BASE, "device": "npu", "hardware": "atlas-a2", "network.host_ips": ["10.0.0.1"], "amp": "bf16"}


def problems_of(raw: dict) -> list[str]:
    """The error lines resolve() reports for `raw`."""
    with pytest.raises(AnswersError) as caught:
        resolve(raw)
    return [str(p) for p in caught.value.problems]


def with_release(raw: dict, torch_npu: str) -> dict:
    """`raw` for the torch_npu release `torch_npu` and the torch it pairs with."""
    torch = hardware.base_version(torch_npu)
    return {**raw, "environment.torch_npu_version": torch_npu, "environment.torch_version": torch}


def test_compile_is_off_by_default_and_recorded_in_answers_yaml() -> None:
    plain = answers()
    assert plain["training.compile"] == "off"
    assert "  compile: 'off'\n" in dump(plain)
    assert to_context(plain)["compile"] == "off"


@pytest.mark.parametrize("mode", ["off", "default", "reduce-overhead"])
def test_each_mode_survives_the_answers_file_and_the_template_context(mode: str) -> None:
    text = answers_yaml({**BASE, "training": {"compile": mode}})
    loaded = load_text(text.replace("'off'", "off"))  # a bare `off` is YAML 1.1's false: read as the word
    assert loaded["training.compile"] == mode
    assert load_text(dump(loaded)).values == loaded.values
    assert from_context(to_context(loaded))["training.compile"] == mode


@pytest.mark.parametrize("raw", ["fast", "max-autotune", True, 1])
def test_a_mode_outside_the_three_is_refused_naming_them(raw: object) -> None:
    (line,) = problems_of({**BASE, "training.compile": raw})
    assert line.startswith("training.compile: ")
    assert line.endswith("must be one of: off, default, reduce-overhead")


def test_with_the_users_own_script_compile_does_not_apply() -> None:
    own = resolve({**BASE, "training.script": "src/main.py", "training.compile": "default"})
    assert "training.compile" not in own.values
    assert [str(w) for w in own.warnings] == [
        "training.compile: 'default': ignored: it does not apply to these answers"
    ]


@pytest.mark.parametrize("version", ["2.1.0.post12", "2.3.1.post6", "2.4.0.post4", "2.5.1", "2.6.0", "2.9.0.post6"])
def test_reduce_overhead_on_an_npu_takes_a_torch_npu_whose_torchair_has_it(version: str) -> None:
    chosen = resolve(with_release({**NPU, "training.compile": "reduce-overhead"}, version))
    assert chosen["training.compile"] == "reduce-overhead"


@pytest.mark.parametrize("version", ["2.1.0.post10", "2.3.1.post4", "2.4.0.post2"])
def test_reduce_overhead_on_an_npu_is_refused_before_torchairs_aclgraph_mode(version: str) -> None:
    (line,) = problems_of(with_release({**NPU, "training.compile": "reduce-overhead"}, version))
    assert line == (
        f"training.compile: 'reduce-overhead': on an NPU, reduce-overhead is TorchAir's aclgraph mode, which "
        f"torch_npu {version} lacks (it came with 2.1.0.post12, 2.3.1.post6, 2.4.0.post4 and 2.5.1, CANN 8.1.RC1): "
        "choose default, or a newer environment.torch_npu_version"
    )
    assert resolve(with_release({**NPU, "training.compile": "default"}, version))["training.compile"] == "default"
    cpu = with_release({**BASE, "training.compile": "reduce-overhead"}, version)
    assert resolve(cpu)["training.compile"] == "reduce-overhead"  # the CPU compiles with torch.compile


@pytest.mark.parametrize(("device", "mode"), [("npu", "default"), ("auto", "reduce-overhead")])
def test_compile_on_the_atlas_training_series_npu_is_refused(device: str, mode: str) -> None:
    raw = {**NPU, "hardware": "atlas-training", "device": device, "amp": "fp16", "training.compile": mode}
    (line,) = problems_of(raw)
    assert line == (
        f"training.compile: {mode!r}: torch_npu's graph backend (TorchAir) supports the Atlas A2 and A3 series, "
        "not the Atlas training series (Ascend 910): set training.compile to off"
    )
    assert resolve({**raw, "device": "cpu"})["training.compile"] == mode


def test_only_a_compiled_project_has_the_compiled_step_and_torchairs_protobuf(tmp_path: Path) -> None:
    off = render(answers(), tmp_path / "off").project_dir
    on = render(answers(training__compile="reduce-overhead"), tmp_path / "on").project_dir
    npu = render(resolve({**NPU, "training.compile": "default"}), tmp_path / "npu").project_dir
    assert "compiled" not in (off / "train.py").read_text()
    assert 'COMPILE = "reduce-overhead"' in (on / "train.py").read_text()
    assert "compiled.CompiledStep(" in (on / "train.py").read_text()
    assert "protobuf" not in (off / "requirements.txt").read_text()
    assert "protobuf" not in (on / "requirements.txt").read_text()  # the CPU has no TorchAir
    assert "\nprotobuf>=3.13\n" in (npu / "requirements.txt").read_text()


def test_the_training_step_asks_for_the_compiled_step(tmp_path: Path) -> None:
    async def scenario(pilot: Pilot[int]) -> None:
        while not (isinstance(pilot.app.screen, StepScreen) and pilot.app.screen.step == "training"):
            await next_step(pilot)
        assert field(pilot, "training.compile").display
        assert str(field(pilot, "training.compile").query_one(".prompt", Label).render()) == "Compiled step"
        assert pilot.app.state.values["training.compile"] == "off"
        await pick(pilot, "training.compile", "reduce-overhead")
        assert pilot.app.state.values["training.compile"] == "reduce-overhead"
        await next_step(pilot)
        await until(pilot, lambda: pilot.app.screen.step != "training", "the step after Training")

    run_wizard(scenario, create_app(output_dir=tmp_path, blink=False))


def test_compile_on_an_npu_is_described_as_torchair_compiles_it_with_the_backward(tmp_path: Path) -> None:
    from wizard.answers.questions_training import TRAINING_QUESTIONS

    help_text = next(q for q in TRAINING_QUESTIONS if q.name == "training.compile").help
    readme = render(resolve({**NPU, "training.compile": "reduce-overhead"}), tmp_path).project_dir / "README.md"
    text = " ".join(readme.read_text().split())
    for said in (" ".join(help_text.split()), text):
        assert "forward only" not in said and "backward runs as usual" not in said
        assert "the backward with the same compiler" in said
        assert "npugraph_ex" in said
        assert "beta aimed at inference" in said
    assert "a failure at the first backward runs that step again eagerly" in text
