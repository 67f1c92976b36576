"""A near-duplicate chain A -> B -> C for the ``near_dup`` tests: B is a near-copy of A, C a
near-copy of B but not of A, and every band key C shares with B is also one of A's, so pairing C
with the first holder of each key (A) alone never compares C with B."""

from __future__ import annotations

import string

import numpy as np
import pyarrow as pa

from lance_assets.curation import minhash

WORDS = 200  # 196 word 5-grams; four replaced words take 20 of them away, 20 new ones in


def _word(rng: np.random.Generator) -> str:
    # letters only: the MinHash simplification folds digits, which would merge words
    return "".join(rng.choice(list(string.ascii_lowercase), 7))


def _edit(words: list[str], at: list[int], rng: np.random.Generator) -> list[str]:
    out = list(words)
    for i in at:
        out[i] = _word(rng)
    return out


def jaccards(texts: list[str]) -> dict[tuple[int, int], float]:
    doc, sh = minhash.shingles(pa.array(texts), 5)
    sets = minhash.per_doc_sets(doc, sh, len(texts))
    return {(i, j): minhash.jaccard(sets[i], sets[j])
            for i in range(len(texts)) for j in range(i + 1, len(texts))}


def band_keys(texts: list[str]) -> list[set[int]]:
    keys, _ = minhash.minhash_batch(pa.array(texts), minhash.MinHashSettings())
    return [set(k.tolist()) for k in keys]


def chain(min_jaccard: float = 0.8) -> tuple[str, str, str]:
    """The first (A, B, C), over seeds 0, 1, ..., with J(A, B) and J(B, C) at least
    ``min_jaccard``, J(A, C) below it, C sharing a band key with B and every such key A's too.
    B replaces four words of A (spread over its first half), C four more of B (its second
    half): J = 176/216 = 0.81 for each step, 156/236 = 0.66 from A to C."""
    for seed in range(500):
        rng = np.random.default_rng(seed)
        a = [_word(rng) for _ in range(WORDS)]
        b = _edit(a, [20, 50, 80, 110], rng)
        c = _edit(b, [130, 150, 170, 190], rng)
        texts = [" ".join(a), " ".join(b), " ".join(c)]
        j = jaccards(texts)
        ka, kb, kc = band_keys(texts)
        if (j[0, 1] >= min_jaccard and j[1, 2] >= min_jaccard and j[0, 2] < min_jaccard
                and kc & kb and (kc & kb) <= ka):
            return texts[0], texts[1], texts[2]
    raise AssertionError("no chain among 500 seeds")
