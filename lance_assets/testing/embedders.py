"""Stand-ins for the sentence model (``lance_assets.embeddings.embeddings``): fast, offline,
deterministic ``encode(texts) -> float32[n, DIM]`` objects with the model's ``device`` and
``batch_size`` attributes, for tests and benchmarks of the embedding columns and what reads them.

- ``ClusteredEmbedder``: 40 clusters of unit vectors, chosen by a hash of the text's words (like
  the model, it does not see how the words are spaced), so vector indexes have structure to
  find; it can be made to fail after a number of calls, like a backfill killed mid-way.
- ``FeatureEmbedder``: unit vectors whose first dimensions carry what the synthetic corpus's
  quality score depends on, so a learned head on them has something to learn.
"""

from __future__ import annotations

import hashlib

import numpy as np

from lance_assets.embeddings.embeddings import DIM


class ClusteredEmbedder:
    """Stands in for the model: 40 clusters of unit vectors, chosen by a hash of the text."""

    device = "cpu"
    batch_size = 64

    def __init__(self, fail_after_calls: int | None = None):
        rng = np.random.default_rng(0)
        self.centres = rng.standard_normal((40, DIM)).astype(np.float32)
        self.calls = 0
        self.fail_after_calls = fail_after_calls

    def encode(self, texts):
        self.calls += 1
        if self.fail_after_calls is not None and self.calls > self.fail_after_calls:
            raise KeyboardInterrupt("killed")
        out = []
        for t in texts:
            words = " ".join(t.split())  # the model reads word pieces: spacing is invisible
            seed = int.from_bytes(hashlib.sha256(words.encode()).digest()[:8], "little")
            r = np.random.default_rng(seed)
            v = self.centres[seed % 40] + 0.7 * r.standard_normal(DIM).astype(np.float32)
            out.append(v / np.linalg.norm(v))
        return np.stack(out).astype(np.float32)


class FeatureEmbedder:
    """Stands in for the sentence model: unit vectors whose first dimensions carry what the
    synthetic score depends on (paragraphs, prose vs boilerplate), the rest noise."""

    device = "cpu"
    batch_size = 64

    def encode(self, texts):
        rng = np.random.default_rng(len(texts))
        out = rng.standard_normal((len(texts), DIM)).astype(np.float32) * 0.05
        for i, t in enumerate(texts):
            words = t.split()
            out[i, 0] = t.count("\n\n") / 3
            out[i, 1] = sum(w.lower() in ("the", "a", "of", "and") for w in words) / max(len(words), 1)
            out[i, 2] = ("|" in t or "!" in t or "..." in t)
        return out / np.linalg.norm(out, axis=1, keepdims=True)
