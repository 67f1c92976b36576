"""Model shapes: the presets and the config a GPT is built from. No torch here, so the run
config (and the Dagster definitions that show it) load without it."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class GPTConfig:
    vocab_size: int = 258
    block_size: int = 256
    n_layer: int = 4
    n_head: int = 4
    n_embd: int = 128
    dropout: float = 0.0
    arch: str = "nanogpt"


ARCHS = ("nanogpt", "modern")


# name -> (n_layer, n_head, n_embd). `mini` sits between the demo's `tiny` and `small`;
# `small`, `medium`, `large` are the GPT-2 124M / 350M / 774M shapes; `mega` is an ~78M-parameter
# body that with a 32k vocabulary adds a 25M embedding.
PRESETS = {
    "tiny": (4, 4, 128),
    "mini": (4, 4, 256),
    "small": (12, 12, 768),
    "mega": (11, 12, 768),
    "medium": (24, 16, 1024),
    "large": (36, 20, 1280),
}


def config_for(preset: str, vocab_size: int, block_size: int, arch: str = "nanogpt") -> GPTConfig:
    if preset not in PRESETS:
        raise ValueError(f"unknown model preset {preset!r}; choose one of {', '.join(PRESETS)}")
    n_layer, n_head, n_embd = PRESETS[preset]
    # Pad the embedding table to a multiple of 64: faster matmuls, and the extra rows are never targets.
    padded = (vocab_size + 63) // 64 * 64
    return GPTConfig(vocab_size=padded, block_size=block_size, n_layer=n_layer, n_head=n_head,
                     n_embd=n_embd, arch=arch)
