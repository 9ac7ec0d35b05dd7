"""Token data for the gpt model (issue 38): prepare_data.py, runtime/tokens.py's windows and errors, model.py's limits.

No training process: prepare_data.py runs as a user runs it, the rest in-process.
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import numpy as np
import pytest
import torch

from runtime import distributed, schedule, tokens
from runtime.errors import SetupError
from tests.factories import answers
from wizard.render.render import render


@pytest.fixture(scope="module")
def project(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A rendered CPU gpt project on token data (nothing prepared yet)."""
    rendered = answers(training__model="gpt", training__dataset="tokens", project_name="lm")
    return render(rendered, tmp_path_factory.mktemp("gpt-project")).project_dir


def prepare(project: Path, source: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    """`python prepare_data.py SOURCE` run in the project folder."""
    command = [sys.executable, "prepare_data.py", str(source), *extra]
    return subprocess.run(command, cwd=project, capture_output=True, text=True, timeout=60)


def write_tokens(folder: Path, values: list[int], *, dtype: str = "uint16", meta_dtype: str = "uint16") -> Path:
    """train.bin and val.bin holding `values` as `dtype`, and a meta.json that says `meta_dtype`."""
    folder.mkdir(parents=True, exist_ok=True)
    for split in ("train", "val"):
        np.asarray(values, dtype=dtype).tofile(folder / f"{split}.bin")
    counts = {"train": len(values), "val": len(values)}
    meta = {"dtype": meta_dtype, "vocab_size": 257, "tokenizer": "bytes", "tokens": counts}
    (folder / "meta.json").write_text(json.dumps(meta))
    return folder


def test_prepare_data_writes_byte_tokens_split_per_document_with_their_metadata(project: Path, tmp_path: Path) -> None:
    source = tmp_path / "text"
    source.mkdir()
    (source / "a.txt").write_text("hello world\n" * 10)
    (source / "b.txt").write_text("ünïcode text\n" * 10)
    result = prepare(project, source)
    assert result.returncode == 0, result.stderr
    assert "[1] a.txt: 121 tokens" in result.stdout and "[2] b.txt:" in result.stdout
    meta = json.loads((project / "data" / "meta.json").read_text())
    assert (meta["dtype"], meta["vocab_size"], meta["tokenizer"]) == ("uint16", 257, "bytes")
    train = np.fromfile(project / "data" / "train.bin", dtype=np.uint16)
    val = np.fromfile(project / "data" / "val.bin", dtype=np.uint16)
    assert meta["tokens"] == {"train": len(train), "val": len(val)}
    assert bytes(train[:12].astype(np.uint8)) == b"hello world\n"
    assert (train == 256).sum() + (val == 256).sum() == 2  # one end-of-text per document
    assert len(val) == len(train) // 9 or abs(len(val) * 9 - len(train)) < 20


def test_prepare_data_reads_jsonl_and_running_it_again_gives_the_same_files(project: Path, tmp_path: Path) -> None:
    source = tmp_path / "docs.jsonl"
    source.write_text("\n".join(json.dumps({"text": f"document {n} " * 20}) for n in range(5)) + "\n")
    assert prepare(project, source).returncode == 0
    first = (project / "data" / "train.bin").read_bytes()
    again = prepare(project, source)
    assert again.returncode == 0 and (project / "data" / "train.bin").read_bytes() == first
    assert not list((project / "data").glob("*.partial"))


def test_prepare_data_says_what_is_wrong_with_its_source(project: Path, tmp_path: Path) -> None:
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"body": "no text field"}\n')
    result = prepare(project, bad)
    assert result.returncode != 0 and 'bad.jsonl line 1: not a JSON object with a "text" field' in result.stderr
    empty = tmp_path / "empty"
    empty.mkdir()
    assert "no .txt file in" in prepare(project, empty).stderr


def test_missing_token_data_says_how_to_make_it(tmp_path: Path) -> None:
    with pytest.raises(SetupError, match=r"meta.json is missing\): make it with python prepare_data.py SOURCE"):
        tokens.read_meta(tmp_path)
    folder = write_tokens(tmp_path / "data", list(range(100)))
    (folder / "val.bin").unlink()
    with pytest.raises(SetupError, match=r"token file .*val.bin is missing: make it with python prepare_data.py"):
        tokens.open_tokens(folder, "val", tokens.read_meta(folder))


def test_a_token_file_of_another_dtype_is_refused(tmp_path: Path) -> None:
    folder = write_tokens(tmp_path, list(range(100)), dtype="uint32", meta_dtype="uint16")
    with pytest.raises(SetupError, match="does not hold uint16 tokens as meta.json says"):
        tokens.open_tokens(folder, "train", tokens.read_meta(folder))


def test_a_token_file_shorter_than_one_window_is_refused(tmp_path: Path) -> None:
    folder = write_tokens(tmp_path, list(range(40)))
    data = tokens.open_tokens(folder, "train", tokens.read_meta(folder))
    with pytest.raises(
        SetupError, match=r"holds 40 tokens: each of 2 rank\(s\) gets 20, which make 0 window\(s\) of 65"
    ):
        tokens.TokenBatches(data, 64, 1, rank=0, world_size=2, seed=0)


def test_each_rank_reads_its_own_part_in_windows_whose_targets_are_the_next_tokens() -> None:
    stream = np.arange(1000, dtype=np.uint16)
    seen = []
    for rank in range(2):
        batches = tokens.TokenBatches(stream, 8, 4, rank=rank, world_size=2, seed=1, shuffle=False)
        for inputs, targets in batches.batches():
            assert torch.equal(inputs[:, 1:], targets[:, :-1])
            seen.append(set(inputs.flatten().tolist()))
    rank0, rank1 = set().union(*seen[: len(seen) // 2]), set().union(*seen[len(seen) // 2 :])
    assert max(rank0) < 500 <= min(rank1)


def test_a_resumed_epoch_continues_the_stream_with_the_next_batch() -> None:
    stream = np.arange(5000, dtype=np.uint16)
    batches = tokens.TokenBatches(stream, 16, 4, rank=1, world_size=2, seed=7)
    batches.set_epoch(3)
    whole = [inputs for inputs, _ in batches.batches()]
    resumed = [inputs for inputs, _ in batches.batches(start=5)]
    assert all(torch.equal(a, b) for a, b in zip(whole[5:], resumed, strict=True))
    batches.set_epoch(4)
    assert not torch.equal(next(batches.batches())[0], whole[0])  # each epoch its own order


def load_model_module(project: Path) -> ModuleType:
    """The project's model.py, imported as the module `generated_model`."""
    spec = importlib.util.spec_from_file_location("generated_model", project / "model.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules["generated_model"] = module  # its dataclass looks itself up there
    spec.loader.exec_module(module)
    return module


def test_the_gpt_ties_its_head_to_the_token_embedding_and_refuses_a_sequence_beyond_its_context(
    project: Path,
) -> None:
    model_py = load_model_module(project)
    model = model_py.GPT(model_py.GPTConfig(vocab_size=257, block_size=16, n_layer=1, n_head=2, n_embd=32))
    assert model.head.weight is model.token_embedding.weight
    logits = model(torch.zeros(2, 16, dtype=torch.long))
    assert logits.shape == (2, 16, 257)
    with pytest.raises(
        ValueError, match=r"a sequence of 17 tokens is longer than the model's context \(block_size 16\)"
    ):
        model(torch.zeros(1, 17, dtype=torch.long))


def test_the_cosine_falls_from_the_peak_after_the_warmup_to_min_lr_at_the_last_step() -> None:
    rate = schedule.LinearWarmup(0.0, 1.0, warmup_steps=10).with_cosine(110, 0.1)
    assert rate.lr_at(0) == 0.0 and rate.lr_at(5) == 0.5 and rate.lr_at(10) == 1.0
    assert rate.lr_at(60) == pytest.approx(0.55)
    assert rate.lr_at(110) == pytest.approx(0.1) and rate.lr_at(500) == pytest.approx(0.1)


def load_train_module(project: Path, monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    """The project's train.py, imported as the module `generated_train` (its model.py beside it)."""
    monkeypatch.syspath_prepend(str(project))
    monkeypatch.delitem(sys.modules, "model", raising=False)
    spec = importlib.util.spec_from_file_location("generated_train", project / "train.py")
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, "generated_train", module)
    spec.loader.exec_module(module)
    return module


def test_without_validation_a_val_bin_smaller_than_a_batch_per_rank_is_never_read(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    rendered = answers(training__model="gpt", training__dataset="tokens", training__eval_every=0, project_name="lm")
    train = load_train_module(render(rendered, tmp_path / "out").project_dir, monkeypatch)
    assert train.EVAL_EVERY == 0
    folder = write_tokens(tmp_path / "data", list(range(train.BLOCK_SIZE + 2)))  # a window in all, none per rank
    monkeypatch.setattr(train, "DATA_DIR", folder)
    rank = distributed.RankInfo(1, 1, 2, 2, 0, "torchrun")
    assert train.load_val_data(rank, torch.device("cpu")) is None
    monkeypatch.setattr(train, "EVAL_EVERY", 10)  # validating, the same file is refused as too small
    with pytest.raises(SetupError, match="val.bin"):
        train.load_val_data(rank, torch.device("cpu"))
