"""The training step's questions for language models and the loop around any generated model.

GPT_QUESTIONS shape the generated GPT (training.model: gpt) and name the folder
of a Hugging Face model (training.model: hf); SCHEDULE_QUESTIONS and
LOOP_QUESTIONS (the run's length, accumulation, clipping, evaluation) apply to
every model train.py generates, never to a user's own script.
"""

from __future__ import annotations

from wizard.answers.language_model import HF_BLOCK_SIZE, LANGUAGE_MODELS, PRESETS
from wizard.answers.script import is_foreign
from wizard.answers.spec import Choice, Question, Values


def _generated(values: Values) -> bool:
    return not is_foreign(values.get("training.script"))


def _gpt(values: Values) -> bool:
    return _generated(values) and values.get("training.model") == "gpt"


def _hf(values: Values) -> bool:
    return _generated(values) and values.get("training.model") == "hf"


def _language_model(values: Values) -> bool:
    return _generated(values) and values.get("training.model") in LANGUAGE_MODELS


def _cosine(values: Values) -> bool:
    return _generated(values) and values.get("training.lr_schedule") == "cosine"


def _preset_text(name: str) -> str:
    return ", ".join(f"{size} {getattr(shape, name)}" for size, shape in PRESETS.items())


def _override(name: str, prompt: str, meaning: str, maximum: int) -> Question:
    return Question(
        name=f"training.{name}",
        prompt=prompt,
        kind="int",
        optional=True,
        minimum=1,
        maximum=maximum,
        when=_gpt,
        step="training",
        help=f"{meaning} Empty: the preset's ({_preset_text(name)}).",
    )


GPT_QUESTIONS: tuple[Question, ...] = (
    Question(
        name="training.gpt_size",
        prompt="GPT size",
        kind="choice",
        default="tiny",
        choices=(
            Choice("tiny", "tiny", "2 layers, 2 heads, 64 wide, 64 tokens of context: seconds per step on a CPU."),
            Choice("small", "small", "6 layers, 6 heads, 384 wide, 256 tokens: learns real text on one card."),
            Choice("gpt2-124m", "GPT-2 124M", "12 layers, 12 heads, 768 wide, 1024 tokens: GPT-2's smallest shape."),
        ),
        when=_gpt,
        step="training",
        help="The preset shape of the GPT in model.py; the overrides below change single settings of it.",
    ),
    _override("n_layer", "Layers (optional)", "Transformer blocks.", 1024),
    _override("n_head", "Attention heads (optional)", "Heads per block; must divide the embedding width.", 1024),
    _override("n_embd", "Embedding width (optional)", "Width of the token vectors.", 65536),
    Question(
        name="training.hf_model_path",
        prompt="Hugging Face model folder",
        kind="relpath",
        default="hf-model",
        when=_hf,
        step="training",
        help="A causal language model saved with save_pretrained (config.json, the weights and the tokenizer), "
        "relative to the project or absolute, on every node. Nothing is downloaded at run time: fetch it on a "
        "machine with internet (hf download NAME --local-dir PATH) and copy the folder over. prepare_data.py "
        "tokenizes with its tokenizer.",
    ),
    Question(
        name="training.block_size",
        prompt="Context length (optional)",
        kind="int",
        optional=True,
        minimum=1,
        maximum=1_048_576,
        when=_language_model,
        step="training",
        help="Tokens the model sees at once (one window). Empty: for gpt the preset's "
        f"({_preset_text('block_size')}); for hf {HF_BLOCK_SIZE}. For hf at most the model's own context "
        "(max_position_embeddings in its config.json).",
    ),
    Question(
        name="training.dropout",
        prompt="Dropout (optional)",
        kind="float",
        optional=True,
        minimum=0.0,
        maximum=0.9,
        when=_gpt,
        step="training",
        help=f"Dropout after attention and MLP. Empty: the preset's ({_preset_text('dropout')}).",
    ),
    Question(
        name="training.peak_tflops",
        prompt="Peak TFLOPS per device (optional)",
        kind="float",
        optional=True,
        minimum=0.001,
        maximum=100000.0,
        when=_language_model,
        step="training",
        help="The card's peak dense TFLOPS at the training precision. When set, each logged step reports the "
        "model FLOPs utilisation (MFU) against it; never on a CPU. Empty: no MFU.",
    ),
)

SCHEDULE_QUESTIONS: tuple[Question, ...] = (
    Question(
        name="training.lr_schedule",
        prompt="Learning-rate schedule",
        kind="choice",
        default="constant",
        choices=(
            Choice("constant", "Constant", "The rate stays at its peak after any warmup."),
            Choice("cosine", "Cosine", "After the warmup, the rate falls along a cosine to min_lr at the last step."),
        ),
        when=_generated,
        step="training",
        help="How the learning rate moves over the run. The rate is a function of the step alone, so a resumed "
        "run continues on the same curve.",
    ),
    Question(
        name="training.warmup_steps",
        prompt="Warmup steps",
        kind="int",
        default=0,
        minimum=0,
        maximum=10_000_000,
        when=_generated,
        step="training",
        help="Optimizer steps over which the rate climbs linearly from 0 to its peak (0: none). When set, it "
        "replaces the epoch warmup of a scaled rate (warmup_epochs).",
    ),
    Question(
        name="training.min_lr",
        prompt="Final learning rate",
        kind="float",
        default=0.0,
        minimum=0.0,
        maximum=10.0,
        when=_cosine,
        step="training",
        help="Where the cosine ends, at the run's last step (often a tenth of the peak).",
    ),
)

LOOP_QUESTIONS: tuple[Question, ...] = (
    Question(
        name="training.max_steps",
        prompt="Max optimizer steps",
        kind="int",
        default_from=lambda values: 1000 if values.get("training.dataset") == "tokens" else 0,
        minimum=0,
        maximum=1_000_000_000,
        when=_generated,
        step="training",
        help="The run's length in optimizer steps; with epochs, whichever ends first (0: the epochs alone). "
        "For token data, where an epoch of windows means little, this is the length that counts.",
    ),
    Question(
        name="training.grad_accum",
        prompt="Gradient accumulation",
        kind="int",
        default=1,
        minimum=1,
        maximum=65536,
        when=_generated,
        step="training",
        help="Micro-batches per optimizer step: the global batch is batch size x world size x this. The "
        "gradients are averaged across ranks only at the last micro-batch (DDP's no_sync on the others).",
    ),
    Question(
        name="training.grad_clip",
        prompt="Gradient clipping",
        kind="float",
        default_from=lambda values: 1.0 if values.get("training.model") in LANGUAGE_MODELS else 0.0,
        minimum=0.0,
        maximum=1e6,
        when=_generated,
        step="training",
        help="Clip the gradients' global norm to this before each optimizer step (0: no clipping). 1.0 is the "
        "usual value for transformers.",
    ),
    Question(
        name="training.eval_every",
        prompt="Validate every N steps",
        kind="int",
        default_from=lambda values: 100 if values.get("training.dataset") == "tokens" else 0,
        minimum=0,
        maximum=10_000_000,
        when=_generated,
        step="training",
        help="Every N optimizer steps the validation loss is measured on every rank, averaged, printed and "
        "written as an eval event (0: never). Token data validates on val.bin; the other datasets on a "
        "held-out tenth of their samples, drawn with the seed, the same on every rank and never trained on "
        "(with 0 they train on all of them).",
    ),
)


def _parallelism_refused(values: Values) -> str:
    return (
        f"a script of your own ({values.get('training.script')}) shards itself: npu-wizard only starts it; "
        "leave this out"
    )


SHARDING_QUESTIONS: tuple[Question, ...] = (
    Question(
        name="training.parallelism",
        prompt="Data parallelism",
        kind="choice",
        default="ddp",
        choices=(
            Choice("ddp", "DDP", "Every rank holds the whole model, its gradients and its optimizer state."),
            Choice(
                "zero1",
                "ZeRO-1",
                "DDP, with the optimizer state split across the ranks (ZeroRedundancyOptimizer); any series.",
            ),
            Choice(
                "fsdp2",
                "FSDP2",
                "fully_shard: parameters, gradients and optimizer state split across the ranks; Atlas A2/A3, "
                "torch_npu 2.6 and later; sharded checkpoints.",
            ),
        ),
        when=_generated,
        refused=_parallelism_refused,
        step="training",
        help="How the ranks share the model. DDP keeps about 16 bytes per parameter on every card (fp32 weights, "
        "gradients, two Adam moments); ZeRO-1 splits the optimizer's 8 across the N ranks; FSDP2 splits all 16 "
        "and gathers one block at a time. A checkpoint of one mode resumes under the others (FSDP2's sharded "
        "folders under ZeRO-1 excepted).",
    ),
    Question(
        name="training.activation_checkpointing",
        prompt="Activation checkpointing",
        kind="bool",
        default=False,
        choices=(
            Choice("false", "Off", "Each block's activations are kept for the backward pass."),
            Choice(
                "true",
                "On",
                "Each block recomputes its activations in the backward pass: less memory, about a third more compute.",
            ),
        ),
        when=_generated,
        refused=_parallelism_refused,
        step="training",
        help="Whether each block of the model (the gpt's transformer blocks, ResNet's residual blocks, the "
        "layers of the small models) recomputes its activations in the backward pass instead of keeping "
        "them (torch.utils.checkpoint), under any parallelism.",
    ),
)
