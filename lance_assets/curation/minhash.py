"""MinHash signatures and LSH band keys: what the ``near_dup`` columns match documents by.

Settings follow FineWeb: text is simplified (lowercase, punctuation and symbols removed, digits
folded to 0), cut into word 5-grams, and each document gets 112 MinHash values in 14 bands of 8.
Two documents that share a band become candidates; a candidate pair is confirmed when the exact
Jaccard similarity of their 5-gram sets (:func:`jaccard`) is at least ``min_jaccard`` (0.8; 0
confirms every candidate, FineWeb's own behaviour).

Invariant: a document's shingles, signature and band keys are a function of its text and the
:class:`MinHashSettings` alone: the same in every process, machine and run (blake2b word hashes,
permutations drawn from ``seed``). Why: the band keys are stored in the table
(``minhash_bands``) and later runs match new documents against them instead of recomputing old
signatures, so a change to the hashing must bump ``MinHashSettings.version``, or old keys would
silently stop matching. Pure numpy and pyarrow: no table access.
"""

from __future__ import annotations

import hashlib
from dataclasses import asdict, dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

SHINGLES_PER_CHUNK = 1 << 12  # (permutations × shingles) chunks of ~4 MB: 2-3x faster than 30 MB
MIX = np.uint64(0x9E3779B97F4A7C15)


@dataclass(frozen=True)
class MinHashSettings:
    ngram: int = 5
    bands: int = 14
    rows_per_band: int = 8
    seed: int = 1
    min_jaccard: float = 0.8
    version: int = 1  # bump when the hashing changes: old band keys would no longer match

    @property
    def num_perm(self) -> int:
        return self.bands * self.rows_per_band

    def to_dict(self) -> dict:
        return asdict(self)


def simplify(texts: pa.Array) -> pa.Array:
    """Lowercase, drop punctuation and symbols, fold digits to 0 (FineWeb's simplify_text)."""
    if isinstance(texts, pa.ChunkedArray):
        texts = texts.combine_chunks()
    out = pc.utf8_lower(pc.cast(texts, pa.string()))
    out = pc.replace_substring_regex(out, r"[\p{P}\p{S}]+", "")
    return pc.replace_substring_regex(out, r"\p{Nd}+", "0")


_WORD_CACHE: dict[str, int] = {}
WORD_CACHE_MAX = 400_000  # ~50 MB; frequent words stay, the cache is emptied when full


def _blake(w: str) -> int:
    return int.from_bytes(hashlib.blake2b(w.encode(), digest_size=8).digest(), "little")


def _word_hashes(words: pa.Array) -> np.ndarray:
    """A stable 64-bit hash per word: blake2b over the distinct words of the batch, remembered
    across batches (most words of a batch were seen in the one before)."""
    enc = pc.dictionary_encode(words)
    uniq = enc.dictionary.to_pylist()
    cache = _WORD_CACHE
    if len(cache) > WORD_CACHE_MAX:
        cache.clear()
    get = cache.get
    values = [get(w) for w in uniq]
    for i, v in enumerate(values):
        if v is None:
            values[i] = cache[uniq[i]] = _blake(uniq[i])
    table = np.array(values, dtype=np.uint64) if values else np.zeros(0, np.uint64)
    return table[enc.indices.to_numpy(zero_copy_only=False)]


def shingle_stream(texts: pa.Array, ngram: int) -> tuple[np.ndarray, np.ndarray]:
    """(document index, 32-bit shingle hash) for every word n-gram of every document, in
    document order (a document's repeated n-grams repeat). A document shorter than ``n`` words
    is one shingle of all its words; a document without words has none."""
    n_docs = len(texts)
    tokens = pc.utf8_split_whitespace(simplify(texts))
    parents = pc.list_parent_indices(tokens).to_numpy(zero_copy_only=False)
    flat = tokens.flatten()
    keep = pc.greater(pc.utf8_length(flat), 0).to_numpy(zero_copy_only=False)
    if not keep.all():
        parents = parents[keep]
        flat = flat.filter(pa.array(keep))
    h = _word_hashes(flat)
    n_words = np.bincount(parents, minlength=n_docs)
    ends = np.cumsum(n_words)
    if len(h) >= ngram and not ((n_words > 0) & (n_words < ngram)).any():
        # the common case, every document with words has n or more: its windows are all whole
        # and start at every word but its last n - 1, so contiguous slices, no gathers
        span = len(h) - ngram + 1
        rolled = np.zeros(span, dtype=np.uint64)
        for j in range(ngram):
            rolled ^= h[j:j + span]
            rolled *= np.uint64(0x100000001B3)
        valid = np.ones(len(h), dtype=bool)
        last_words = ends[n_words > 0]
        for k in range(1, ngram):
            valid[last_words - k] = False
        valid = valid[:span]
        key = rolled[valid]
        doc = parents[:span][valid]
    else:
        starts = ends - n_words
        # windows starting at each word: valid if they end inside the document, or if the
        # document is shorter than n and the window starts at its first word
        pos = np.arange(len(h)) - starts[parents]
        remaining = n_words[parents] - pos
        valid = (remaining >= ngram) | ((n_words[parents] < ngram) & (pos == 0))
        idx = np.flatnonzero(valid)
        width = np.minimum(remaining[idx], ngram)
        key = np.zeros(len(idx), dtype=np.uint64)
        last = len(h) - 1
        for j in range(ngram):
            take = j < width
            nxt = np.where(take, h[np.minimum(idx + j, last)], np.uint64(0))
            key = np.where(take, (key ^ nxt) * np.uint64(0x100000001B3), key)
        doc = parents[idx]
    key ^= key >> np.uint64(29)
    key *= MIX
    return doc.astype(np.int64), key >> np.uint64(32)


def shingles(texts: pa.Array, ngram: int) -> tuple[np.ndarray, np.ndarray]:
    """:func:`shingle_stream` as sets: sorted and unique per document (for Jaccard)."""
    doc, sh = shingle_stream(texts, ngram)
    composite = (doc.astype(np.uint64) << np.uint64(32)) | sh
    composite = np.sort(composite)
    composite = composite[np.r_[True, composite[1:] != composite[:-1]]]  # a set per document
    return (composite >> np.uint64(32)).astype(np.int64), composite & np.uint64(0xFFFFFFFF)


def _permutations(settings: MinHashSettings) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(settings.seed)
    a = rng.integers(1, 1 << 63, settings.num_perm, dtype=np.uint64) | np.uint64(1)
    b = rng.integers(0, 1 << 63, settings.num_perm, dtype=np.uint64)
    return a, b


def signatures(doc: np.ndarray, sh: np.ndarray, n_docs: int, settings: MinHashSettings) -> np.ndarray:
    """MinHash values [n_docs, num_perm] (uint32; all-ones for a document without shingles).

    Permutation i maps a shingle x to the high 32 bits of (a_i * x + b_i) mod 2**64
    (multiply-shift hashing), and a document's value is the minimum over its shingles. ``doc``
    must be non-decreasing; repeated shingles do not change a minimum, so sets are not needed.
    The high 32 bits are monotone in the 64-bit value, so the minimum is taken over the 64-bit
    values and shifted once per document (two passes over the big matrix fewer)."""
    a, b = _permutations(settings)
    sig = np.full((n_docs, settings.num_perm), np.uint32(0xFFFFFFFF), dtype=np.uint32)
    if len(sh) == 0:
        return sig
    bounds = np.flatnonzero(np.r_[True, doc[1:] != doc[:-1]])  # first shingle of each doc
    lo = 0
    while lo < len(bounds):
        # whole documents per chunk, about SHINGLES_PER_CHUNK shingles
        start = bounds[lo]
        hi = np.searchsorted(bounds, start + SHINGLES_PER_CHUNK, side="left")
        hi = max(hi, lo + 1)
        end = bounds[hi] if hi < len(bounds) else len(sh)
        # permutations x shingles: each document's values are a contiguous run of every row,
        # so the minimum is a contiguous reduction (1.7x faster than shingles x permutations)
        vals = a[:, None] * sh[None, start:end]
        vals += b[:, None]
        heads = bounds[lo:hi] - start
        sig[doc[bounds[lo:hi]]] = (np.minimum.reduceat(vals, heads, axis=1) >> np.uint64(32)).T
        lo = hi
    return sig


def band_keys(sig: np.ndarray, settings: MinHashSettings) -> np.ndarray:
    """[n_docs, bands] int64 keys: a hash of each band's rows, salted with the band index so
    keys of different bands never meet."""
    n = sig.shape[0]
    rows = sig.reshape(n, settings.bands, settings.rows_per_band).astype(np.uint64)
    key = np.broadcast_to((np.arange(settings.bands, dtype=np.uint64) + np.uint64(1)) * MIX,
                          (n, settings.bands)).copy()
    for r in range(settings.rows_per_band):
        key = (key ^ rows[:, :, r]) * np.uint64(0x100000001B3)
        key ^= key >> np.uint64(31)
    return key.view(np.int64)


def jaccard(a: np.ndarray, b: np.ndarray) -> float:
    """Jaccard similarity of two sorted, unique shingle arrays."""
    if len(a) == 0 and len(b) == 0:
        return 1.0
    inter = len(np.intersect1d(a, b, assume_unique=True))
    return inter / (len(a) + len(b) - inter)


def per_doc_sets(doc: np.ndarray, sh: np.ndarray, n_docs: int) -> list[np.ndarray]:
    """Each document's slice of the output of ``shingles`` (sorted, unique)."""
    cuts = np.searchsorted(doc, np.arange(n_docs + 1))
    return [sh[cuts[i]:cuts[i + 1]] for i in range(n_docs)]
