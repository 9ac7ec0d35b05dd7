"""A decoder-only transformer language model (GPT), written out whole.

Tokens and their positions are embedded and summed; a stack of pre-norm blocks
(causal self-attention, then an MLP, each added back onto its input) follows;
a final layer norm and the output head, which shares its weights with the
token embedding, give the next-token logits at every position. The model knows
nothing of devices, precision or parallelism: train.py applies those from
outside.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn


@dataclass(frozen=True)
class GPTConfig:
    """The model's shape: vocabulary, context length, depth, heads, width and dropout."""

    vocab_size: int
    block_size: int
    n_layer: int
    n_head: int
    n_embd: int
    dropout: float = 0.0


class CausalSelfAttention(nn.Module):
    """Multi-head self-attention in which each position sees only itself and the positions before it."""

    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        if config.n_embd % config.n_head != 0:
            raise ValueError(
                f"n_embd {config.n_embd} is not a multiple of n_head {config.n_head}"
            )
        self.n_head = config.n_head
        self.dropout = config.dropout
        self.qkv = nn.Linear(
            config.n_embd, 3 * config.n_embd
        )  # queries, keys and values in one matmul
        self.proj = nn.Linear(config.n_embd, config.n_embd)
        self.proj_dropout = nn.Dropout(config.dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, length, width = x.shape
        q, k, v = self.qkv(x).split(width, dim=2)
        # (batch, length, width) -> (batch, heads, length, head width)
        q, k, v = (
            t.view(batch, length, self.n_head, width // self.n_head).transpose(1, 2)
            for t in (q, k, v)
        )
        attended = F.scaled_dot_product_attention(
            q, k, v, dropout_p=self.dropout if self.training else 0.0, is_causal=True
        )
        merged = attended.transpose(1, 2).contiguous().view(batch, length, width)
        return self.proj_dropout(self.proj(merged))


class MLP(nn.Module):
    """The position-wise feed-forward network: widen four times, GELU, back to the model width."""

    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        self.fc = nn.Linear(config.n_embd, 4 * config.n_embd)
        self.proj = nn.Linear(4 * config.n_embd, config.n_embd)
        self.dropout = nn.Dropout(config.dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.dropout(self.proj(F.gelu(self.fc(x))))


class Block(nn.Module):
    """One transformer block: attention then MLP, each on a layer-normed input and added back (pre-norm)."""

    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        self.ln_1 = nn.LayerNorm(config.n_embd)
        self.attn = CausalSelfAttention(config)
        self.ln_2 = nn.LayerNorm(config.n_embd)
        self.mlp = MLP(config)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    """Token and position embeddings, n_layer blocks, a final norm and a head tied to the token embedding."""

    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        self.config = config
        self.token_embedding = nn.Embedding(config.vocab_size, config.n_embd)
        self.position_embedding = nn.Embedding(config.block_size, config.n_embd)
        self.dropout = nn.Dropout(config.dropout)
        self.blocks = nn.ModuleList(Block(config) for _ in range(config.n_layer))
        self.ln_f = nn.LayerNorm(config.n_embd)
        self.head = nn.Linear(config.n_embd, config.vocab_size, bias=False)
        self.head.weight = (
            self.token_embedding.weight
        )  # weight tying (Press and Wolf 2017)
        self.apply(self._init_weights)
        # the projections back onto the residual stream start smaller, one share per layer (GPT-2)
        for name, parameter in self.named_parameters():
            if name.endswith("proj.weight"):
                nn.init.normal_(
                    parameter, mean=0.0, std=0.02 / math.sqrt(2 * config.n_layer)
                )

    @staticmethod
    def _init_weights(module: nn.Module) -> None:
        if isinstance(module, nn.Linear | nn.Embedding):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)
        if isinstance(module, nn.Linear) and module.bias is not None:
            nn.init.zeros_(module.bias)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        """Next-token logits (batch x length x vocab_size) for token ids (batch x length)."""
        length = tokens.shape[1]
        if length > self.config.block_size:
            raise ValueError(
                f"a sequence of {length} tokens is longer than the model's context (block_size "
                f"{self.config.block_size}): cut the windows to at most that, or build the model with a larger one"
            )
        positions = torch.arange(length, device=tokens.device)
        x = self.dropout(
            self.token_embedding(tokens) + self.position_embedding(positions)
        )
        for block in self.blocks:
            x = block(x)
        return self.head(self.ln_f(x))

    def configure_optimizer(
        self, lr: float, weight_decay: float = 0.1
    ) -> torch.optim.AdamW:
        """AdamW with weight decay on the matrices and embeddings, none on biases and norms."""
        decayed = [p for p in self.parameters() if p.dim() >= 2]
        plain = [p for p in self.parameters() if p.dim() < 2]
        groups = [
            {"params": decayed, "weight_decay": weight_decay},
            {"params": plain, "weight_decay": 0.0},
        ]
        return torch.optim.AdamW(groups, lr=lr, betas=(0.9, 0.95))

    def flops_per_token(self) -> float:
        """Training FLOPs per token: 6 per parameter (forward and backward) plus attention's scores.

        The estimate of Kaplan et al. (2020) and the PaLM paper's appendix B, which MFU figures are quoted with.
        """
        parameters = sum(p.numel() for p in self.parameters())
        c = self.config
        return 6 * parameters + 12 * c.n_layer * c.n_embd * c.block_size


def next_token_loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Cross-entropy of the logits at every position against the token that follows it."""
    return F.cross_entropy(logits.flatten(0, 1).float(), targets.flatten())
