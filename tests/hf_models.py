"""A tiny Hugging Face causal LM and its tokenizer, made here from a config and a few lines of text: no download.

The tokenizer is a byte-level BPE (the tokenizers library) trained on the
lines below; the model a 2-layer GPT-2 of width 32 with 64 positions, saved
with save_pretrained as a downloaded one is. Needs transformers (the test
extra); the tests that use it skip without it.
"""

from __future__ import annotations

from pathlib import Path

LINES = [
    "the cat sees the red ball.",
    "a dog likes a green tree.",
    "my friend follows the river.",
    "the old man finds a quiet house.",
    "our teacher watches the long road.",
    "the small bird hears some bread.",
]
END_OF_TEXT = "<|endoftext|>"
POSITIONS = 64


def save_tiny_model(folder: Path, *, weights: bool = True) -> Path:
    """Write the tiny model's config, tokenizer and (unless not `weights`) weights into `folder`."""
    import torch
    from tokenizers import ByteLevelBPETokenizer
    from transformers import GPT2Config, GPT2LMHeadModel, PreTrainedTokenizerFast

    folder.mkdir(parents=True, exist_ok=True)
    bpe = ByteLevelBPETokenizer()
    bpe.train_from_iterator(LINES * 4, vocab_size=300, min_frequency=1, special_tokens=[END_OF_TEXT])
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=bpe, eos_token=END_OF_TEXT)
    tokenizer.save_pretrained(folder)
    config = GPT2Config(
        vocab_size=len(tokenizer),
        n_positions=POSITIONS,
        n_embd=32,
        n_layer=2,
        n_head=2,
        bos_token_id=tokenizer.eos_token_id,
        eos_token_id=tokenizer.eos_token_id,
    )
    torch.manual_seed(0)
    model = GPT2LMHeadModel(config)
    if weights:
        model.save_pretrained(folder)
    else:
        config.save_pretrained(folder)
    return folder
