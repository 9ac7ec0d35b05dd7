"""training.model hf (issue 38): its answers and rules, the Training step, and the generated loader's refusals.

The model folders are made here (tests/hf_models.py): a tiny GPT-2 from a
config, with and without its weights; nothing is downloaded. The loader and
prepare_data.py run from a rendered project, in-process or as a user runs
them; the real training runs are in test_hf_runs.py.
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest
from textual.pilot import Pilot

from runtime.errors import SetupError
from tests.factories import answers_yaml
from tests.hf_models import POSITIONS, save_tiny_model
from tests.runs import render_cpu
from tests.tui_driver import next_step, pick, run_wizard, shown
from wizard.answers.model import load_text, resolve, to_context
from wizard.errors import AnswersError

# One xdist worker runs this file (`--dist loadgroup`), so that its module fixture `folders` is made once,
# not once per worker: a tiny model saved whole, about 1.2 CPU s
pytestmark = pytest.mark.xdist_group("hf-model-folders")

pytest.importorskip("transformers")

BASE = {"project_name": "demo", "device": "cpu", "nodes": 1, "devices_per_node": 2, "amp": "off"}
HF = {**BASE, "training.model": "hf", "training.dataset": "tokens"}
FETCH = "hf download NAME --local-dir DIR"


@pytest.fixture(scope="module")
def folders(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The tiny model whole, the same without its weights, and a path where nothing is."""
    root = tmp_path_factory.mktemp("hf")
    return {
        "whole": save_tiny_model(root / "tiny"),
        "no-weights": save_tiny_model(root / "config-only", weights=False),
        "missing": root / "never-fetched",
    }


def problems_of(raw: dict) -> list[str]:
    with pytest.raises(AnswersError) as caught:
        resolve(raw)
    return [str(p) for p in caught.value.problems]


def test_hf_on_tokens_takes_its_folder_and_language_model_defaults() -> None:
    values = resolve(HF).values
    assert values["training.hf_model_path"] == "hf-model"
    assert values["training.block_size"] is None  # 1024 in train.py
    loop = (values["training.grad_clip"], values["training.base_lr"], values["training.max_steps"])
    assert loop == (1.0, 0.001, 1000)
    assert "training.gpt_size" not in values and "training.dropout" not in values
    gpt = resolve({**BASE, "training.model": "gpt", "training.dataset": "tokens"}).values
    assert "training.hf_model_path" not in gpt


def test_hf_needs_token_data_and_its_folder_is_a_plain_path() -> None:
    assert problems_of({**BASE, "training.model": "hf"}) == [
        "training.dataset: 'synthetic': the hf model reads token windows: set training.dataset to tokens "
        "(train.bin and val.bin, made by the generated prepare_data.py)"
    ]
    (line,) = problems_of({**HF, "training.hf_model_path": "models/$(rm -rf ~)"})
    assert line.startswith("training.hf_model_path: ") and "no spaces or quotes" in line


def test_a_readable_folder_is_read_at_render_time_and_every_problem_is_reported_at_once(
    folders: dict[str, Path],
) -> None:
    text = answers_yaml(
        {
            **BASE,
            "training": {
                "model": "hf",
                "dataset": "tokens",
                "hf_model_path": str(folders["no-weights"]),
                "grad_accum": 0,
            },
        }
    )
    with pytest.raises(AnswersError) as caught:
        load_text(text)
    by_field = {p.field: p.message for p in caught.value.problems}
    assert sorted(by_field) == ["training.grad_accum", "training.hf_model_path"]
    assert "holds no weights (none of model.safetensors" in by_field["training.hf_model_path"]
    message = by_field["training.hf_model_path"]
    assert FETCH in message and str(folders["no-weights"]) in message


def test_a_block_size_beyond_the_models_context_is_refused_at_render_time(folders: dict[str, Path]) -> None:
    whole = str(folders["whole"])
    (line,) = problems_of({**HF, "training.hf_model_path": whole, "training.block_size": POSITIONS + 1})
    assert line == (
        f"training.block_size: {POSITIONS + 1}: block_size {POSITIONS + 1} is beyond the model's context: {whole} "
        f"takes at most {POSITIONS} positions (config.json); set training.block_size to {POSITIONS} or less"
    )
    # empty takes 1024, beyond this model's 64 too: said as the default it is
    (line,) = problems_of({**HF, "training.hf_model_path": whole})
    assert line.startswith("training.block_size: 1024: block_size 1024 (hf's default, training.block_size being empty)")
    assert resolve({**HF, "training.hf_model_path": whole, "training.block_size": POSITIONS}).values


def test_a_folder_not_on_this_machine_or_relative_is_left_to_the_start_up(folders: dict[str, Path]) -> None:
    # a cluster's model folder may be on its nodes alone; a relative one lies in a project not written yet
    assert resolve({**HF, "training.hf_model_path": str(folders["missing"]), "training.block_size": 99999}).values
    assert resolve({**HF, "training.hf_model_path": "models/tiny", "training.block_size": 99999}).values


def test_the_training_step_asks_for_the_folder_only_when_the_model_is_hf() -> None:
    async def scenario(pilot: Pilot[int]) -> None:
        while getattr(pilot.app.screen, "step", None) != "training":
            await next_step(pilot)
        assert not shown(pilot, "training.hf_model_path")
        await pick(pilot, "training.model", "hf")
        assert shown(pilot, "training.hf_model_path") and shown(pilot, "training.block_size")
        assert not shown(pilot, "training.gpt_size") and not shown(pilot, "training.dropout")
        await pick(pilot, "training.model", "gpt")
        assert not shown(pilot, "training.hf_model_path") and shown(pilot, "training.gpt_size")

    run_wizard(scenario)


def test_the_context_renders_the_folder_and_an_empty_block_size(folders: dict[str, Path]) -> None:
    context = to_context(resolve({**HF, "training.hf_model_path": "models/tiny"}))
    assert (context["model"], context["hf_model_path"], context["block_size"]) == ("hf", "models/tiny", "")


@pytest.fixture(scope="module")
def project(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A rendered hf project whose folder (models/tiny, relative) is not there yet."""
    return render_cpu(
        tmp_path_factory.mktemp("project"), "torchrun", model="hf", dataset="tokens", hf_model_path="models/tiny"
    )


def hf_model_of(project: Path) -> ModuleType:
    """The project's hf_model.py, imported as train.py imports it."""
    sys.path.insert(0, str(project))
    try:
        spec = importlib.util.spec_from_file_location("hf_model_under_test", project / "hf_model.py")
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    finally:
        sys.path.remove(str(project))
    return module


def test_the_project_lists_transformers_and_carries_no_model_py(project: Path) -> None:
    assert "transformers>=4.40" in (project / "requirements.txt").read_text().splitlines()
    assert not (project / "model.py").exists()
    train = (project / "train.py").read_text()
    assert 'HF_MODEL_PATH = PROJECT_DIR / "models/tiny"' in train and "BLOCK_SIZE = 1024" in train


@pytest.mark.parametrize(
    ("which", "words"),
    [
        ("missing", "no Hugging Face model folder at"),
        ("no-weights", "holds no weights (none of model.safetensors, model.safetensors.index.json"),
    ],
)
def test_the_loader_refuses_a_missing_or_incomplete_folder_and_says_how_to_fetch_it(
    project: Path, folders: dict[str, Path], which: str, words: str
) -> None:
    hf_model = hf_model_of(project)
    with pytest.raises(SetupError) as caught:
        hf_model.load_causal_lm(folders[which], 32, 300)
    assert words in str(caught.value) and FETCH in str(caught.value)
    assert f"then copy DIR to {folders[which]} on every node" in str(caught.value)


def test_the_loader_refuses_a_block_size_beyond_the_model_and_token_ids_beyond_its_vocabulary(
    project: Path, folders: dict[str, Path]
) -> None:
    hf_model = hf_model_of(project)
    with pytest.raises(SetupError, match=f"block_size 1024 is beyond the model's context: .* at most {POSITIONS}"):
        hf_model.load_causal_lm(folders["whole"], 1024, 300)
    with pytest.raises(SetupError, match=r"ids up to 299999, the model in .* embeds 300: prepare the data with"):
        hf_model.load_causal_lm(folders["whole"], 32, 300_000)


def test_the_loaded_model_gives_logits_and_the_next_token_loss(project: Path, folders: dict[str, Path]) -> None:
    import torch

    hf_model = hf_model_of(project)
    model = hf_model.load_causal_lm(folders["whole"], 32, 257)  # byte-level data fits a 300-token vocabulary
    tokens = torch.randint(257, (2, 33))
    logits = model(tokens[:, :-1])
    assert logits.shape == (2, 32, 300) and logits.dtype == torch.float32
    loss = hf_model.next_token_loss(logits, tokens[:, 1:])
    assert 4.0 < loss.item() < 7.5  # about ln(300) = 5.7 for an untrained model
    assert model.flops_per_token() > 6 * sum(p.numel() for p in model.parameters())
    assert set(model.state_dict()) == {f"model.{name}" for name in model.model.state_dict()}


def test_prepare_data_tokenizes_with_the_models_tokenizer_or_says_where_it_is_missing(
    project: Path, folders: dict[str, Path], tmp_path: Path
) -> None:
    text = tmp_path / "text"
    text.mkdir()
    (text / "a.txt").write_text("the cat sees the red ball.\n" * 40)

    def prepare(*extra: str) -> subprocess.CompletedProcess[str]:
        command = [sys.executable, "prepare_data.py", str(text), "--data-dir", str(tmp_path / "data"), *extra]
        return subprocess.run(command, cwd=project, capture_output=True, text=True, timeout=120)

    missing = prepare()  # models/tiny is not in the project
    assert missing.returncode != 0 and f"no tokenizer folder at {project / 'models' / 'tiny'}" in missing.stderr
    assert FETCH in missing.stderr and not (tmp_path / "data").exists()
    done = prepare("--tokenizer", str(folders["whole"]))
    assert done.returncode == 0, done.stderr
    meta = json.loads((tmp_path / "data" / "meta.json").read_text())
    assert (meta["dtype"], meta["vocab_size"], meta["tokenizer"]) == ("uint16", 300, str(folders["whole"]))
    # BPE merges: fewer tokens than the 1,080 bytes
    assert meta["tokens"]["train"] + meta["tokens"]["val"] < 1080 / 2
