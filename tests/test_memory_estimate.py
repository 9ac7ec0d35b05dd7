"""The memory estimate per rank (wizard/memory), doctor's check, the peaks the monitor keeps, and out-of-memory texts.

The parameter counts are checked against the real models (the template's model.py, torchvision's ResNet-18).
The NPU's and CUDA's out-of-memory messages are written in the shape torch_npu's and torch's caching allocators
print them (none of those devices here); the CPU's MemoryError is met for real in tests/test_memory_runs.py.
"""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

from runtime.checks import PASS, WARN
from runtime.events import EventWriter, read_events
from wizard.answers.model import resolve
from wizard.doctor.memory_check import check_memory, device_capacity
from wizard.doctor.network import Node
from wizard.doctor.probe import Software
from wizard.memory.estimate import estimate, model_size
from wizard.memory.fit import advise, npu_capacity, to_record
from wizard.monitor.state import JobState
from wizard.monitor.summary_text import failure_report, format_summary, summarize

MODEL_PY = (
    Path(__file__).resolve().parent.parent / "templates" / "project" / "{{cookiecutter.project_name}}" / "model.py"
)
NPU_OOM = (
    "NPU out of memory. Tried to allocate 2.00 GiB (NPU 1; 60.96 GiB total capacity; 58.12 GiB already "
    "allocated; 58.12 GiB current active; 1.02 GiB free; 59.30 GiB reserved in total by PyTorch)"
)
CUDA_OOM = (
    "CUDA out of memory. Tried to allocate 2.00 GiB. GPU 1 has a total capacity of 79.25 GiB of which "
    "1.02 GiB is free. Of the allocated memory 76.10 GiB is allocated by PyTorch"
)


def gpt(size: str = "tiny", **more: object) -> dict:
    """Answers of a gpt project on one A2 node of 4 cards."""
    raw = {"devices_per_node": 4, "training.model": "gpt", "training.dataset": "tokens", "training.gpt_size": size}
    return dict(resolve({**raw, **{f"training.{k}" if "." not in k else k: v for k, v in more.items()}}).values)


def template_gpt(values: dict) -> object:
    """The template's GPT built in the answers' shape, with the byte-level vocabulary."""
    spec = importlib.util.spec_from_file_location("template_model", MODEL_PY)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    from wizard.answers.language_model import shape_from_answers

    shape = shape_from_answers(values)
    return module.GPT(module.GPTConfig(257, shape.block_size, shape.n_layer, shape.n_head, shape.n_embd))


@pytest.mark.parametrize("size", ["tiny", "small", "gpt2-124m"])
def test_the_gpt_parameter_count_is_the_models_own(size: str) -> None:
    values = gpt(size)
    model = template_gpt(values)
    assert model_size(values).parameters == sum(p.numel() for p in model.parameters())


def test_the_resnet18_parameter_count_is_torchvisions() -> None:
    from torchvision.models import resnet18

    values = dict(resolve({"training.model": "resnet18", "training.dataset": "synthetic"}).values)
    assert model_size(values).parameters == sum(p.numel() for p in resnet18(num_classes=10).parameters())


def test_fsdp2_holds_a_quarter_of_ddps_state_on_four_ranks_and_zero1_shards_only_the_optimizer() -> None:
    values = gpt("small")
    ddp, zero1, fsdp2 = (estimate(values, mode=mode) for mode in ("ddp", "zero1", "fsdp2"))
    assert ddp.parameters == 4 * model_size(values).parameters and ddp.optimizer == 2 * ddp.parameters
    assert (zero1.parameters, zero1.gradients, zero1.optimizer) == (ddp.parameters, ddp.gradients, ddp.optimizer / 4)
    assert fsdp2.parameters + fsdp2.gradients + fsdp2.optimizer == pytest.approx(
        (ddp.parameters + ddp.gradients + ddp.optimizer) / 4, abs=4
    )
    assert fsdp2.gathered > 0 and ddp.activations == zero1.activations == fsdp2.activations


def test_parallelism_missing_from_the_answers_is_ddp_and_checkpointing_lowers_the_activations() -> None:
    values = gpt("small")
    assert estimate(values).mode == "ddp"
    assert estimate(values, checkpointed=True).activations < estimate(values).activations / 3


def test_doctor_warns_where_the_estimate_does_not_fit_and_names_what_would() -> None:
    answers = resolve(
        {"devices_per_node": 4, "training.model": "gpt", "training.dataset": "tokens",
         "training.gpt_size": "gpt2-124m", "training.batch_size": 128}
    )  # fmt: skip
    found = check_memory(answers, npu_capacity("atlas-a2"))
    assert found.status == WARN and "does not fit (an estimate)" in found.detail
    assert "of 61 GiB (an Atlas A2 card's 64 GB HBM (about 61 GiB usable))" in found.detail
    assert "training.batch_size: 64 with training.grad_accum: 2 (the same global batch)" in found.fix


def test_doctor_weighs_a_cpu_project_against_this_hosts_memory_shared_by_its_ranks(tmp_path: Path) -> None:
    meminfo = tmp_path / "meminfo"
    meminfo.write_text("MemTotal:       16000000 kB\nMemAvailable:    8388608 kB\n")
    answers = resolve({"device": "cpu", "nodes": 2, "devices_per_node": 2})
    capacity = device_capacity(answers, Software(), Node(0, "127.0.0.1", "simulated"), meminfo)
    assert capacity is not None and capacity.bytes == 2 * 2**30
    assert capacity.what == "this host's available memory, 8.0 GiB shared by 4 ranks"
    assert check_memory(answers, capacity).status == PASS


def ranks_with_peaks(run_dir: Path, peaks: list[int], error: str | None = None) -> JobState:
    """Ranks that logged steps 4 and 8 with `peaks` (bytes each); rank 1 ends with `error` where given."""
    for rank, peak in enumerate(peaks):
        writer = EventWriter(run_dir, rank)
        writer.started(local_rank=rank, node=0, device=f"npu:{rank}", world_size=len(peaks))
        for step in (4, 8):
            writer.step_done(
                step=step, epoch=0, loss=1.0, samples_per_s=10.0, lr=0.1,
                memory_peak_bytes=peak, memory_peak_of="max_memory_allocated, this window",
                memory_state_bytes=2**20,
            )  # fmt: skip
        if rank == 1 and error:
            try:
                raise RuntimeError(error)
            except RuntimeError as failed:
                writer.error(failed)
        writer.close()
    state = JobState(len(peaks))
    state.ingest_all(read_events(run_dir))
    return state


def test_a_rank_whose_peak_stands_far_above_the_others_is_flagged(tmp_path: Path) -> None:
    gib = 2**30
    state = ranks_with_peaks(tmp_path, [10 * gib, 10 * gib, 11 * gib, 20 * gib])
    (outlier,) = state.memory.outliers()
    assert (outlier.rank, outlier.step, outlier.median) == (3, 8, 10 * gib)
    summary = summarize(state, started_at=0.0, ended_at=1.0, outcome="finished")
    lines = format_summary(summary)
    assert "memory (max_memory_allocated, this window), highest per rank: rank 0 10 GiB" in lines
    assert (
        "memory outlier: rank 3 peaked at 20 GiB at step 8, 2.0x the other ranks' median 10 GiB "
        "(uneven batches, a leak, or work of its own?)"
    ) in lines
    assert state.memory.cell(3) == "20 GiB"


@pytest.mark.parametrize("text", [NPU_OOM, CUDA_OOM], ids=["npu", "cuda"])
def test_an_npu_or_cuda_out_of_memory_names_the_ranks_peak_and_the_modes_that_would_fit(
    tmp_path: Path, text: str
) -> None:
    values = gpt("gpt2-124m", batch_size=128)
    (tmp_path / "run.json").write_text(
        json.dumps({"memory_estimate": to_record(advise(values, npu_capacity("atlas-a2")))})
    )
    state = ranks_with_peaks(tmp_path, [58 * 2**30, 59 * 2**30], error=text)
    failure = state.root_cause()
    assert failure is not None and failure.rank == 1
    report = failure_report(failure, tmp_path)
    assert "hint: out of memory: the rank ran out of memory" in report
    assert "rank 1's last logged peak: 59 GiB at step 8 (max_memory_allocated, this window)" in report
    assert "= 75 GiB per rank (GPT gpt2-124m, ddp on 4 ranks), of 61 GiB" in report
    assert "would fit: " in report and "training.batch_size: 64 with training.grad_accum: 2" in report


def test_an_hf_models_parameter_count_is_read_from_its_folder_and_a_folder_not_here_is_no_estimate(
    tmp_path: Path,
) -> None:
    pytest.importorskip("transformers")
    from transformers import AutoModelForCausalLM

    from tests.hf_models import save_tiny_model
    from wizard.memory.estimate import ModelUnknown, with_model_folder

    folder = save_tiny_model(tmp_path / "hf-model")
    real = sum(p.numel() for p in AutoModelForCausalLM.from_pretrained(folder, local_files_only=True).parameters())
    values = {"training.model": "hf", "training.hf_model_path": "hf-model", "training.block_size": 32}
    with pytest.raises(ModelUnknown, match="relative to the project"):
        model_size(values)
    sized = model_size(with_model_folder(values, tmp_path))
    assert sized.parameters == real, (sized.parameters, real)  # the config's widths give GPT-2's exact count
    assert sized.optimizer == "AdamW" and sized.activations_per_sample > 0
    with pytest.raises(ModelUnknown, match="holds no config.json"):
        model_size(with_model_folder(values, tmp_path / "elsewhere"))


def test_the_advice_never_suggests_what_the_rules_refuse_and_offers_activation_checkpointing_in_any_mode() -> None:
    from wizard.memory.fit import alternatives

    on_910 = {"device": "auto", "hardware": "atlas-training", "amp": "fp16", "training.model": "gpt",
              "training.gpt_size": "small", "training.batch_size": 8, "nodes": 1, "devices_per_node": 8}  # fmt: skip
    old_torch_npu = {**on_910, "hardware": "atlas-a2", "amp": "bf16", "device": "npu",
                     "environment.torch_version": "2.5.1", "environment.torch_npu_version": "2.5.1"}  # fmt: skip
    for values in (on_910, old_torch_npu):
        settings = [setting for setting, _ in alternatives(values)]
        assert not any("fsdp2" in setting for setting in settings), settings
        assert "training.activation_checkpointing: true" in settings
    newer = {**old_torch_npu, "environment.torch_version": "2.7.1", "environment.torch_npu_version": "2.7.1"}
    assert "training.parallelism: fsdp2" in [setting for setting, _ in alternatives(newer)]


def test_fsdp2_with_grad_accum_counts_whole_gradients_the_inner_micro_batches_keep() -> None:
    values = {"training.model": "gpt", "training.gpt_size": "small", "training.batch_size": 2,
              "nodes": 1, "devices_per_node": 4, "training.parallelism": "fsdp2"}  # fmt: skip
    one = estimate(values)
    accumulating = estimate({**values, "training.grad_accum": 4})
    assert one.gradients * 4 == pytest.approx(accumulating.gradients, rel=0.01)
    # whole, unsharded, against a quarter of the weights
    assert accumulating.gradients == pytest.approx(accumulating.parameters * 4, abs=4)
