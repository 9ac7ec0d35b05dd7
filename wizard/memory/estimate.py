"""The bytes per rank a generated project's training needs, per part and per parallelism mode.

`estimate(values)` takes the answers (keyed by dotted name) and returns an
`Estimate`: parameters, gradients, optimizer state, the activations saved for
the backward, and (fsdp2) the parameters gathered in flight, each in bytes per
rank. Weights, gradients and optimizer state are fp32, as train.py keeps them
(autocast computes in half precision but leaves the weights in fp32):

- ddp: 4 + 4 + optimizer bytes per parameter on every rank (AdamW 8: gpt;
  SGD with momentum 4: the image models);
- zero1: 4 + 4 + optimizer / N (ZeroRedundancyOptimizer shards the state);
- fsdp2: (4 + 4 + optimizer) / N, plus the units gathered whole at once: the
  root's own parameters (embeddings, head) and two blocks (the one running and
  the next, prefetched), 4 bytes a parameter each.

Activations are a stated estimate, fitted to the bytes autograd saves for the
backward (counted with torch.autograd.graph.saved_tensors_hooks) for the
generated models on the CPU with torch 2.14, in fp32: per token of a GPT,
n_layer x (64 n_embd + 4 n_head) + 16 n_embd + 4 vocab bytes, plus n_layer x
(13 n_head x block_size + 4 n_embd) where dropout is on (the CPU's attention
then keeps its weights); the ResNet-18 443 bytes per input pixel; the ConvNet
242,000 bytes per 28 x 28 image (in proportion for
larger ones); the MLP 4 (inputs + 512 + classes). With
activation checkpointing a GPT keeps each block's input (4 n_embd per token)
and one block's activations during its recompute. Under autocast part of them
is half precision, so the figure is an upper bound there; the transient
buffers of the backward are not counted. Token data's vocabulary is
prepare_data.py's byte-level one (257); an image folder's classes are taken as
1,000.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from wizard.answers.language_model import shape_from_answers

MODES = ("ddp", "zero1", "fsdp2")
WEIGHT_BYTES = 4  # fp32 weights, and fp32 gradients alike
BYTE_VOCAB = 257  # prepare_data.py's byte-level tokenizer
IMAGE_FOLDER_CLASSES = 1000
RESNET_BYTES_PER_PIXEL = 443
CONVNET_BYTES_PER_IMAGE = 242_000
RESNET18_BODY = 11_176_512  # torchvision's resnet18 without its fc layer


@dataclass(frozen=True)
class ModelSize:
    """What the estimate needs of a model: its parameters, its sharding units and its activations."""

    name: str
    parameters: int
    optimizer: str  # "AdamW" or "SGD with momentum"
    optimizer_bytes: int  # per parameter, fp32
    activations_per_sample: int  # bytes saved for the backward, fp32
    root_parameters: int = 0  # fsdp2: parameters outside the blocks, gathered with the root
    block_parameters: int = 0  # fsdp2: one block's


@dataclass(frozen=True)
class Estimate:
    """Bytes per rank of one mode: each part, and their sum."""

    model: ModelSize
    mode: str
    world_size: int
    batch_size: int
    checkpointing: bool
    parameters: int
    gradients: int
    optimizer: int
    activations: int
    gathered: int = 0  # fsdp2: whole units in flight

    @property
    def total(self) -> int:
        """Every part together: the rank's estimated peak."""
        return self.parameters + self.gradients + self.optimizer + self.activations + self.gathered

    def parts(self) -> list[tuple[str, int]]:
        """(name, bytes) of each part, in the order they are shown."""
        held = f"batch {self.batch_size}{', checkpointed' if self.checkpointing else ''}"
        parts = [
            ("parameters", self.parameters),
            ("gradients", self.gradients),
            (f"optimizer state ({self.model.optimizer})", self.optimizer),
            (f"activations ({held})", self.activations),
        ]
        if self.mode == "fsdp2":
            parts.append(("gathered in flight", self.gathered))
        return parts


def parallelism(values: Mapping[str, Any]) -> str:
    """The answers' training.parallelism; ddp where it is not asked (older answers)."""
    mode = values.get("training.parallelism") or "ddp"
    return mode if mode in MODES else "ddp"


def checkpointing(values: Mapping[str, Any]) -> bool:
    """Whether the answers ask for activation checkpointing (no where it is not asked)."""
    return bool(values.get("training.activation_checkpointing"))


def model_size(values: Mapping[str, Any], *, checkpointed: bool = False) -> ModelSize:
    """The generated model the answers ask for, as the estimate sees it; ModelUnknown for an hf model whose
    folder is not readable here (or named relative to a project not given: see with_model_folder)."""
    model, dataset = values.get("training.model", "mlp"), values.get("training.dataset", "synthetic")
    if model == "gpt":
        return _gpt(values, checkpointed)
    if model == "hf":
        return _hf(values, checkpointed)
    classes = IMAGE_FOLDER_CLASSES if dataset == "imagefolder" else 10
    channels, side = _image_input(model, dataset)
    pixels = side * side
    if model == "resnet18":
        stem = 64 * channels * 49  # conv1, 7 x 7, as train.py builds it for the data's channels
        count = RESNET18_BODY - 64 * 3 * 49 + stem + 512 * classes + classes
        return ModelSize("ResNet-18", count, "SGD with momentum", 4, RESNET_BYTES_PER_PIXEL * pixels)
    if model == "convnet":
        count = (channels * 32 * 9 + 32) + (32 * 64 * 9 + 64) + (64 * 49 * 128 + 128) + (128 * classes + classes)
        return ModelSize("ConvNet", count, "SGD with momentum", 4, CONVNET_BYTES_PER_IMAGE * pixels // 784)
    features = 64 if dataset == "synthetic" else channels * pixels
    count = (features * 256 + 256) + (256 * 256 + 256) + (256 * classes + classes)
    return ModelSize("MLP", count, "SGD with momentum", 4, 4 * (features + 512 + classes))


def _image_input(model: str, dataset: str) -> tuple[int, int]:
    """(channels, side) of the images train.py feeds the model (the MLP's synthetic input is 64 numbers)."""
    if dataset == "imagefolder":
        return 3, 224 if model == "resnet18" else 64
    if dataset == "synthetic" and model == "resnet18":
        return 3, 32
    return 1, 28


def _gpt(values: Mapping[str, Any], checkpointed: bool) -> ModelSize:
    shape = shape_from_answers(values)
    h, layers, heads, length = shape.n_embd, shape.n_layer, shape.n_head, shape.block_size
    block = 12 * h * h + 13 * h
    root = BYTE_VOCAB * h + length * h + 2 * h  # the head shares the token embedding's weights
    per_layer = 64 * h + 4 * heads
    if shape.dropout > 0:
        per_layer += 13 * heads * length + 4 * h
    outside = 16 * h + 4 * BYTE_VOCAB
    per_token = (layers * 4 * h + per_layer if checkpointed else layers * per_layer) + outside
    size = values.get("training.gpt_size", "custom")
    return ModelSize(
        f"GPT {size}",
        root + layers * block,
        "AdamW",
        8,
        per_token * length,
        root_parameters=root,
        block_parameters=block,
    )


class ModelUnknown(ValueError):
    """The model's size cannot be known here (an hf model whose folder is not on this machine)."""


def with_model_folder(values: Mapping[str, Any], project: Path) -> dict[str, Any]:
    """The answers with an hf model folder named relative to the project made absolute, as the ranks find it."""
    folder = values.get("training.hf_model_path")
    if values.get("training.model") != "hf" or not folder or Path(str(folder)).is_absolute():
        return dict(values)
    return {**values, "training.hf_model_path": str(project / str(folder))}


def _hf(values: Mapping[str, Any], checkpointed: bool) -> ModelSize:
    """A Hugging Face causal LM, sized from its config.json: a decoder of the GPT shape (embeddings, blocks of
    attention and MLP, a head tied or not); a model of another make is sized as such a decoder of its widths."""
    from runtime.errors import SetupError
    from runtime.hf_folder import read_config
    from wizard.answers.language_model import hf_block_size

    path = Path(str(values.get("training.hf_model_path") or ""))
    if not path.is_absolute():
        raise ModelUnknown(f"the hf model folder {path} is relative to the project: its size is read there")
    try:
        config = read_config(path)
    except SetupError as error:
        raise ModelUnknown(str(error)) from None
    h = _first(config, "hidden_size", "n_embd", "d_model")
    layers = _first(config, "num_hidden_layers", "n_layer", "num_layers")
    heads = _first(config, "num_attention_heads", "n_head") or 1
    vocab = _first(config, "vocab_size")
    if not (h and layers and vocab):
        raise ModelUnknown(f"{path}/config.json gives no hidden size, layer count or vocabulary size")
    inner = _first(config, "intermediate_size", "n_inner", "ffn_dim") or 4 * h
    gated = 3 if config.get("hidden_act") in ("silu", "swiglu") or "llama" in str(config.get("model_type")) else 2
    block = 4 * h * h + gated * h * inner + inner + 9 * h  # with GPT-2's biases and two norms
    positions = _first(config, "n_positions") if "n_positions" in config else 0
    root = vocab * h + (positions or 0) * h + 2 * h
    if not config.get("tie_word_embeddings", True):
        root += vocab * h
    length = hf_block_size(values)
    per_layer = 64 * h + 4 * heads + 4 * inner
    per_token = (layers * 4 * h + per_layer if checkpointed else layers * per_layer) + 16 * h + 4 * vocab
    return ModelSize(
        f"HF {config.get('model_type', 'model')}",
        root + layers * block,
        "AdamW",
        8,
        per_token * length,
        root_parameters=root,
        block_parameters=block,
    )


def _first(config: Mapping[str, Any], *keys: str) -> int | None:
    """The first of `keys` that config.json sets to a count."""
    for key in keys:
        value = config.get(key)
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value
    return None


def estimate(
    values: Mapping[str, Any],
    *,
    mode: str | None = None,
    batch_size: int | None = None,
    checkpointed: bool | None = None,
) -> Estimate:
    """Bytes per rank for the answers, or for another mode, batch or checkpointing choice than theirs."""
    mode = mode or parallelism(values)
    checkpointed = checkpointing(values) if checkpointed is None else checkpointed
    batch = batch_size or int(values.get("training.batch_size") or 1)
    world = int(values.get("nodes") or 1) * int(values.get("devices_per_node") or 1)
    model = model_size(values, checkpointed=checkpointed)
    weights = model.parameters * WEIGHT_BYTES
    state = model.parameters * model.optimizer_bytes
    activations = model.activations_per_sample * batch
    if mode == "zero1":
        return Estimate(model, mode, world, batch, checkpointed, weights, weights, -(-state // world), activations)
    if mode == "fsdp2":
        gathered = (model.root_parameters + 2 * model.block_parameters) * WEIGHT_BYTES
        shard = -(-weights // world)
        # with grad_accum the inner micro-batches skip the reduce-scatter (train.py's _sync_gradients): their
        # gradients are kept whole, unsharded, on every rank until the last one
        accumulating = int(values.get("training.grad_accum") or 1) > 1
        gradients = weights if accumulating else shard
        return Estimate(
            model, mode, world, batch, checkpointed, shard, gradients, -(-state // world), activations, gathered
        )
    return Estimate(model, mode, world, batch, checkpointed, weights, weights, state, activations)


def gib(count: float) -> str:
    """Bytes for people: `1.2 GiB`, `340 MiB`, `12 KiB`."""
    for unit, size in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if abs(count) >= size:
            return f"{count / size:.1f} {unit}" if count < 10 * size else f"{count / size:.0f} {unit}"
    return f"{count:.0f} B"
