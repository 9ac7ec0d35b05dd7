"""The questions of the training step: the model, the data, the schedule and how often to save and report."""

from __future__ import annotations

from wizard.answers.language_model import LANGUAGE_MODELS
from wizard.answers.questions_lm import GPT_QUESTIONS, LOOP_QUESTIONS, SCHEDULE_QUESTIONS, SHARDING_QUESTIONS
from wizard.answers.script import is_foreign
from wizard.answers.spec import Choice, Question, Values


def _generated(values: Values) -> bool:
    return not is_foreign(values.get("training.script"))


def _foreign(values: Values) -> bool:
    return is_foreign(values.get("training.script"))


def _resume_args_refused(values: Values) -> str:
    return (
        "the generated train.py resumes from its newest checkpoint by itself: resume_args is for a script "
        "of your own (training.script); leave it out"
    )


def _needs_data_dir(values: Values) -> bool:
    return values.get("training.dataset") in ("mnist", "imagefolder", "tokens")


def _without_lr(values: Values) -> bool:
    return _generated(values) and values.get("training.lr") is None


def _epoch_warmup(values: Values) -> bool:
    return _without_lr(values) and not values.get("training.warmup_steps")


def _language_model(values: Values) -> bool:
    return values.get("training.model") in LANGUAGE_MODELS


TRAINING_QUESTIONS: tuple[Question, ...] = (
    Question(
        name="training.script",
        prompt="Training script",
        kind="script",
        default=None,
        optional=True,
        step="training",
        help="Your own Python file every rank runs (any name, train.py included), as a path relative to the "
        "project folder, or to the repository's root when npu-wizard renders into a repository (--into, or "
        "started inside one); npu-wizard starts it with the chosen launcher and environment and writes no train.py. "
        "Left empty, the ranks run the train.py npu-wizard generates.",
    ),
    Question(
        name="training.script_args",
        prompt="Script arguments",
        kind="args",
        default=(),
        when=_foreign,
        step="training",
        help="Arguments every rank's script gets, before those given to the launch scripts.",
    ),
    Question(
        name="training.resume_args",
        prompt="Arguments to resume",
        kind="args",
        default=(),
        when=_foreign,
        refused=_resume_args_refused,
        step="training",
        help="Arguments added after the script arguments when a start resumes (NPU_WIZARD_RESUMING=1): every "
        "attempt after the first of run --restarts, a rank its launcher started again (--max-restarts), and a "
        "run after one that did not finish. A script that "
        "resumes from its own checkpoint behind a flag gets it here, e.g. --init_from=resume.",
    ),
    Question(
        name="training.model",
        prompt="Model",
        kind="choice",
        default="mlp",
        choices=(
            Choice("mlp", "MLP", "A small multi-layer perceptron: fast anywhere, the CPU demo's model."),
            Choice("convnet", "ConvNet", "A small convolutional network for 28x28 images (MNIST-shaped)."),
            Choice("resnet18", "ResNet-18", "torchvision's ResNet-18 for image folders (needs torchvision)."),
            Choice("gpt", "GPT", "A decoder-only transformer language model (model.py) for token data."),
            Choice("hf", "Hugging Face", "A causal language model from a local Hugging Face folder, for token data."),
        ),
        when=_generated,
        step="training",
        help="The network train.py builds; replace it with your own in train.py. gpt and hf train on token "
        "data (dataset tokens) with AdamW; hf loads a model saved with save_pretrained from a local folder "
        "(transformers joins the project's requirements).",
    ),
    Question(
        name="training.dataset",
        prompt="Dataset",
        kind="choice",
        default="synthetic",
        choices=(
            Choice("synthetic", "Synthetic", "A learnable, seeded dataset made in memory; needs no download."),
            Choice("mnist", "MNIST", "MNIST through torchvision, read from data_dir."),
            Choice("imagefolder", "Image folder", "torchvision ImageFolder: one sub-folder per class under data_dir."),
            Choice("tokens", "Tokens", "train.bin and val.bin in data_dir, made by python prepare_data.py SOURCE."),
        ),
        when=_generated,
        step="training",
        help="What train.py trains on. tokens: memory-mapped token files that the generated prepare_data.py "
        "writes from a folder of .txt files or a .jsonl file (a text field), for the gpt and hf models.",
    ),
    Question(
        name="training.data_dir",
        prompt="Data folder",
        kind="relpath",
        default="data",
        when=_needs_data_dir,
        step="training",
        help="Where the dataset lives, relative to the project or absolute.",
    ),
    *GPT_QUESTIONS,
    Question(
        name="training.batch_size",
        prompt="Batch size per device",
        kind="int",
        default=32,
        minimum=1,
        maximum=65536,
        when=_generated,
        step="training",
        help="Samples each device takes per step; the global batch is this times the world size.",
    ),
    Question(
        name="training.lr",
        prompt="Learning rate (optional)",
        kind="float",
        optional=True,
        minimum=0.0,
        maximum=10.0,
        when=_generated,
        step="training",
        help="The learning rate of the whole job. Leave empty to scale it from a single-card "
        "baseline: lr = base_lr x global batch / base_batch_size.",
    ),
    *SCHEDULE_QUESTIONS,
    Question(
        name="training.base_batch_size",
        prompt="Single-card batch size",
        kind="int",
        default=32,
        minimum=1,
        maximum=65536,
        when=_without_lr,
        step="training",
        help="The batch size the single-card script used, to scale the learning rate from.",
    ),
    Question(
        name="training.base_lr",
        prompt="Single-card learning rate",
        kind="float",
        default_from=lambda values: 0.001 if _language_model(values) else 0.05,
        minimum=0.0,
        maximum=10.0,
        when=_without_lr,
        step="training",
        help="The learning rate the single-card script used (SGD for the image models, AdamW for gpt and hf; "
        "fine-tuning a pretrained hf model usually wants less, such as 0.00005).",
    ),
    Question(
        name="training.warmup_epochs",
        prompt="Warmup epochs",
        kind="int",
        default_from=lambda values: 0 if _language_model(values) else 5,
        minimum=0,
        maximum=100000,
        when=_epoch_warmup,
        step="training",
        help="When the scaled rate is above the single-card rate, climb to it linearly from the "
        "single-card rate over this many epochs (0: no warmup). 5, as Goyal et al. (2017, "
        "Accurate, Large Minibatch SGD) used with the linear scaling rule.",
    ),
    Question(
        name="training.epochs",
        prompt="Epochs",
        kind="int",
        default=3,
        minimum=1,
        maximum=100000,
        when=_generated,
        step="training",
        help="Passes over the dataset.",
    ),
    *LOOP_QUESTIONS,
    *SHARDING_QUESTIONS,
    Question(
        name="training.samples",
        prompt="Synthetic samples",
        kind="int",
        default=8192,
        minimum=1,
        maximum=100_000_000,
        when=lambda values: values.get("training.dataset") == "synthetic",
        step="training",
        help="Size of the synthetic dataset.",
    ),
    Question(
        name="training.seed",
        prompt="Seed",
        kind="int",
        default=1234,
        minimum=0,
        maximum=2**32 - 1,
        step="training",
        help="Seeds the model, the data order and the synthetic data on every rank.",
    ),
    Question(
        name="training.checkpoint_every",
        prompt="Checkpoint every N steps",
        kind="int",
        default=100,
        minimum=0,
        maximum=10_000_000,
        step="training",
        help="Rank 0 saves a checkpoint every N steps and at each epoch's end (0: epoch ends only). "
        "A restarted job resumes from the latest one.",
    ),
    Question(
        name="training.log_every",
        prompt="Log every N steps",
        kind="int",
        default=10,
        minimum=1,
        maximum=10_000_000,
        step="training",
        help="How often the loss is read and a progress event written.",
    ),
    Question(
        name="training.tensorboard",
        prompt="TensorBoard",
        kind="bool",
        default=False,
        choices=(
            Choice("false", "Off", "Progress goes to the run folder's events and the monitor only."),
            Choice("true", "On", "Rank 0 also writes loss, lr and throughput for TensorBoard (needs tensorboard)."),
        ),
        step="training",
        help="Whether rank 0 of train.py writes the loss, the learning rate and the throughput of each logged "
        "step with torch.utils.tensorboard into <run folder>/tensorboard/ (tensorboard joins requirements.txt).",
    ),
    Question(
        name="run.restarts",
        prompt="Whole-job restarts",
        kind="int",
        default=0,
        minimum=0,
        maximum=1000,
        step="training",
        help="The default of npu-wizard run --restarts: after a failure a restart can fix (a rank's error after "
        "the first step, a vanished rank, a lost node, a hang), npu-wizard run stops every node and starts the "
        "whole job again from the newest checkpoint every rank can load, up to N times (0: a failure ends the job). "
        "Under Kubernetes the operator restarts instead: runPolicy.backoffLimit (an AscendJob's fault-retry-times "
        "too).",
    ),
    Question(
        name="training.compile",
        prompt="Compiled step",
        kind="choice",
        default="off",
        choices=(
            Choice("off", "Off", "Eager: every operator is launched from Python, as written."),
            Choice("default", "Default", "torch.compile fuses the forward and loss; NPU: TorchAir's graph mode."),
            Choice(
                "reduce-overhead",
                "Reduce overhead",
                "Also replays the step as a device graph (CUDA graphs; NPU: TorchAir's aclgraph).",
            ),
        ),
        when=_generated,
        step="training",
        help="Whether train.py compiles its forward and loss. On the CPU and CUDA with torch.compile (the CPU "
        "needs a C++ compiler); on an NPU with torch_npu's graph backend TorchAir (Atlas A2 and A3 only; "
        "reduce-overhead from torch_npu 2.1.0.post12 / 2.3.1.post6 / 2.4.0.post4 / 2.5.1, CANN 8.1.RC1, and "
        "TorchAir compiles the backward with the same compiler; aclgraph captures no backward and no random "
        "ops; TorchAir is a beta aimed at inference, and on the 26.x releases reduce-overhead through its mode "
        "option is deprecated in favour of the npugraph_ex backend). The first step compiles (tens of "
        "seconds); a model whose forward or first backward cannot compile trains eagerly, said in one line. "
        "Checkpoints load either way.",
    ),
)
