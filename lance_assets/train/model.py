"""A compact GPT in two recipes, chosen by ``GPTConfig.arch``.

- ``nanogpt`` (GPT-2, 2019): learned positions, pre-LayerNorm, GELU MLP, tied embeddings.
- ``modern`` (nanochat / modded-nanogpt): rotary positions, parameter-free RMSNorm, QK-norm,
  ReLU² MLP, an untied head with zero-initialised output projections, logits soft-capped at 15.
  Trained with Muon on the hidden matrices and AdamW on the embedding and head (see the trainer).
"""

from __future__ import annotations

import math

import torch
import torch.nn as nn
import torch.nn.functional as F

from lance_assets.train.shapes import ARCHS, GPTConfig, config_for  # noqa: F401 (config_for: part of this API)

SOFTCAP = 15.0


def norm(cfg: GPTConfig) -> nn.Module:
    if cfg.arch == "modern":
        return nn.RMSNorm(cfg.n_embd, elementwise_affine=False)
    return nn.LayerNorm(cfg.n_embd)


def rotary_tables(block_size: int, head_dim: int, base: float = 10000.0):
    """cos and sin of every (position, frequency) pair: (1, 1, T, head_dim / 2) each."""
    inv_freq = 1.0 / base ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim)
    angles = torch.outer(torch.arange(block_size, dtype=torch.float32), inv_freq)
    return angles.cos()[None, None], angles.sin()[None, None]


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    d = x.shape[-1] // 2
    x1, x2 = x[..., :d], x[..., d:]
    T = x.shape[-2]
    cos, sin = cos[..., :T, :].to(x.dtype), sin[..., :T, :].to(x.dtype)
    return torch.cat((x1 * cos + x2 * sin, x2 * cos - x1 * sin), dim=-1)


class CausalSelfAttention(nn.Module):
    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.n_head = cfg.n_head
        self.qkv = nn.Linear(cfg.n_embd, 3 * cfg.n_embd, bias=False)
        self.proj = nn.Linear(cfg.n_embd, cfg.n_embd, bias=False)
        self.dropout = cfg.dropout

    def forward(self, x: torch.Tensor, rotary=None) -> torch.Tensor:
        B, T, C = x.shape
        q, k, v = self.qkv(x).split(C, dim=2)
        q, k, v = (t.view(B, T, self.n_head, C // self.n_head).transpose(1, 2) for t in (q, k, v))
        if rotary is not None:  # modern: QK-norm, then rotary positions
            q, k = F.rms_norm(q, (q.size(-1),)), F.rms_norm(k, (k.size(-1),))
            q, k = apply_rotary(q, *rotary), apply_rotary(k, *rotary)
        y = F.scaled_dot_product_attention(
            q, k, v, is_causal=True, dropout_p=self.dropout if self.training else 0.0
        )
        return self.proj(y.transpose(1, 2).contiguous().view(B, T, C))


class MLP(nn.Module):
    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.fc = nn.Linear(cfg.n_embd, 4 * cfg.n_embd, bias=False)
        self.proj = nn.Linear(4 * cfg.n_embd, cfg.n_embd, bias=False)
        self.relu2 = cfg.arch == "modern"

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.fc(x)
        return self.proj(F.relu(h).square() if self.relu2 else F.gelu(h))


class Block(nn.Module):
    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.ln1 = norm(cfg)
        self.attn = CausalSelfAttention(cfg)
        self.ln2 = norm(cfg)
        self.mlp = MLP(cfg)

    def forward(self, x: torch.Tensor, rotary=None) -> torch.Tensor:
        x = x + self.attn(self.ln1(x), rotary)
        return x + self.mlp(self.ln2(x))


class GPT(nn.Module):
    def __init__(self, cfg: GPTConfig):
        super().__init__()
        if cfg.arch not in ARCHS:
            raise ValueError(f"unknown arch {cfg.arch!r}; choose one of {', '.join(ARCHS)}")
        self.cfg = cfg
        self.modern = cfg.arch == "modern"
        self.wte = nn.Embedding(cfg.vocab_size, cfg.n_embd)
        self.wpe = None if self.modern else nn.Embedding(cfg.block_size, cfg.n_embd)
        self.blocks = nn.ModuleList(Block(cfg) for _ in range(cfg.n_layer))
        self.ln_f = norm(cfg)
        self.lm_head = nn.Linear(cfg.n_embd, cfg.vocab_size, bias=False)
        self.apply(self._init_weights)
        if self.modern:
            cos, sin = rotary_tables(cfg.block_size, cfg.n_embd // cfg.n_head)
            self.register_buffer("rotary_cos", cos, persistent=False)
            self.register_buffer("rotary_sin", sin, persistent=False)
            for name, p in self.named_parameters():  # every block starts as the identity
                if name.endswith("proj.weight") or name == "lm_head.weight":
                    nn.init.zeros_(p)
        else:
            self.lm_head.weight = self.wte.weight  # weight tying
            for name, p in self.named_parameters():
                if name.endswith("proj.weight"):  # GPT-2's scaled init of residual projections
                    nn.init.normal_(p, mean=0.0, std=0.02 / math.sqrt(2 * cfg.n_layer))

    @staticmethod
    def _init_weights(module: nn.Module) -> None:
        if isinstance(module, (nn.Linear, nn.Embedding)):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)

    def num_params(self, non_embedding: bool = True) -> int:
        """Parameters; without the lookup-only tables (positions, and the input embedding when
        the head is untied) unless ``non_embedding=False``."""
        n = sum(p.numel() for p in self.parameters())
        if not non_embedding:
            return n
        lookup = self.wte.weight.numel() if self.modern else self.wpe.weight.numel()
        return n - lookup

    def flops_per_token(self) -> float:
        """Training FLOPs per token: 6N for the matmuls plus attention (PaLM appendix B)."""
        c = self.cfg
        return 6 * self.num_params() + 12 * c.n_layer * c.n_embd * c.block_size

    def forward(self, idx: torch.Tensor, targets: torch.Tensor | None = None):
        B, T = idx.shape
        if T > self.cfg.block_size:
            raise ValueError(f"sequence of {T} tokens exceeds block_size {self.cfg.block_size}")
        if self.modern:
            x, rotary = F.rms_norm(self.wte(idx), (self.cfg.n_embd,)), (self.rotary_cos, self.rotary_sin)
        else:
            x, rotary = self.wte(idx) + self.wpe(torch.arange(T, device=idx.device)), None
        for block in self.blocks:
            x = block(x, rotary)
        logits = self.lm_head(self.ln_f(x))
        if self.modern:
            logits = SOFTCAP * torch.tanh(logits / SOFTCAP)
        loss = None
        if targets is not None:
            # targets of -1 (padding) are left out of the loss
            loss = F.cross_entropy(logits.view(-1, logits.size(-1)).float(), targets.view(-1),
                                   ignore_index=-1)
        return logits, loss

    @torch.no_grad()
    def generate(self, idx: torch.Tensor, max_new_tokens: int, *, temperature: float = 1.0,
                 top_k: int | None = None, banned: list[int] | None = None) -> torch.Tensor:
        """Sample continuations of ``idx``; ids in ``banned`` (PAD, embedding padding) never appear."""
        for _ in range(max_new_tokens):
            ctx = idx[:, -self.cfg.block_size:]
            logits, _ = self(ctx)
            logits = logits[:, -1, :] / max(temperature, 1e-6)
            if banned:
                logits[:, banned] = -float("inf")
            if top_k:
                v, _ = torch.topk(logits, min(top_k, logits.size(-1)))
                logits[logits < v[:, [-1]]] = -float("inf")
            nxt = torch.multinomial(F.softmax(logits, dim=-1), num_samples=1)
            idx = torch.cat((idx, nxt), dim=1)
        return idx
