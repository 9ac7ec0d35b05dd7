"""A Hugging Face causal language model from a local folder, behind the interface train.py gives its GPT.

The folder is one save_pretrained wrote (config.json, the weights, the
tokenizer): transformers reads it from disk alone, never from the network
(HF_HUB_OFFLINE and local_files_only), and runs none of its code
(trust_remote_code stays off). CausalLM maps token ids to next-token logits
as model.py's GPT does, so the same loss, optimizer and throughput figures
apply; its weights are the model's own, under "model.".
"""

from __future__ import annotations

import os
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from runtime import hf_folder
from runtime.errors import SetupError


class CausalLM(nn.Module):
    """A transformers causal LM that returns the logits alone (batch x length x vocabulary)."""

    def __init__(self, model: nn.Module, block_size: int) -> None:
        super().__init__()
        self.model = model
        self.block_size = block_size

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        """Next-token logits for token ids (batch x length); no key-value cache, which training never reads."""
        return self.model(input_ids=tokens, use_cache=False).logits

    def configure_optimizer(
        self, lr: float, weight_decay: float = 0.1
    ) -> torch.optim.AdamW:
        """AdamW with weight decay on the matrices and embeddings, none on biases and norms (as the GPT's)."""
        decayed = [p for p in self.parameters() if p.dim() >= 2]
        plain = [p for p in self.parameters() if p.dim() < 2]
        groups = [
            {"params": decayed, "weight_decay": weight_decay},
            {"params": plain, "weight_decay": 0.0},
        ]
        return torch.optim.AdamW(groups, lr=lr, betas=(0.9, 0.95))

    def flops_per_token(self) -> float:
        """Training FLOPs per token: 6 per parameter plus attention's scores (Kaplan et al. 2020), as the GPT's."""
        parameters = sum(p.numel() for p in self.parameters())
        config = self.model.config
        layers = getattr(config, "num_hidden_layers", 0)
        width = getattr(config, "hidden_size", 0)
        return 6 * parameters + 12 * layers * width * self.block_size


def load_causal_lm(path: Path, block_size: int, vocab_size: int) -> CausalLM:
    """The model saved in `path`, in float32, checked against the windows and the token data it will train on."""
    # says how to fetch a missing or incomplete one
    folder = hf_folder.read_model_folder(path)
    problem = hf_folder.block_size_problem(block_size, folder)
    if problem is not None:
        raise SetupError(problem)
    # read before transformers is first imported: nothing is downloaded at run time
    os.environ["HF_HUB_OFFLINE"] = "1"
    from transformers import AutoModelForCausalLM
    from transformers.utils import logging

    logging.disable_progress_bar()  # one bar per rank in the logs tells nothing
    try:
        model = AutoModelForCausalLM.from_pretrained(path, local_files_only=True)
    except (OSError, ValueError, KeyError) as error:
        raise SetupError(
            f"transformers cannot load the model in {path} ({type(error).__name__}: {str(error)[:300]}): "
            f"is it a causal language model whole on this node? {hf_folder.fetch_hint(path)}"
        ) from error
    positions = hf_folder.max_positions(model.config.to_dict())
    if positions is not None and block_size > positions:
        raise SetupError(
            f"block_size {block_size} is beyond the model's context of {positions} positions: "
            f"set training.block_size to {positions} or less"
        )
    embeddings = model.get_input_embeddings().num_embeddings
    if vocab_size > embeddings:
        raise SetupError(
            f"the token data holds ids up to {vocab_size - 1}, the model in {path} embeds {embeddings}: "
            "prepare the data with this model's tokenizer (python prepare_data.py SOURCE)"
        )
    # float32 weights: autocast gives the lower precision
    return CausalLM(model.float(), block_size)


def next_token_loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Cross-entropy of the logits at every position against the token that follows it (as model.py's)."""
    return F.cross_entropy(logits.flatten(0, 1).float(), targets.flatten())
