"""MinHash signatures and LSH band keys: what the ``near_dup`` columns match documents by.

Settings follow FineWeb: text is simplified (lowercase, punctuation and symbols removed, digits
folded to 0), cut into word 5-grams, and each document gets 112 MinHash values in 14 bands of 8.
Two documents that share a band become candidates; a candidate pair is confirmed when the exact
Jaccard similarity of their 5-gram sets (:func:`jaccard`) is at least ``min_jaccard`` (0.8; 0
confirms every candidate, FineWeb's own behaviour).

Invariant: a document's shingles, signature and band keys are a function of its text and the
:class:`MinHashSettings` alone (``version`` included), whatever the process, machine, run or
batch. The band keys are stored in the table (``minhash_bands``) and later runs match new
documents against them, so a change to the hashing must bump ``MinHashSettings.version`` (every
function whose output depends on it takes ``version=``/``settings``), or old keys would silently
stop matching. Both versions stay computable; a table keeps the version its keys were written with.

- Version 1: simplified with pyarrow regexes, split on Unicode whitespace, each distinct word
  hashed with blake2b, numpy MinHash with permutations from ``numpy.random.default_rng(seed)``.
- Version 2: the same simplification on the UTF-8 bytes with numpy (a document holding a
  non-ASCII character first gets version 1's Unicode regexes), each word hashed 8 bytes at a time
  (:func:`_hash_words`, MurmurHash3's finaliser), vectorised; signatures by rensa's compiled
  ``RMinHash`` over the shingle hashes, whose ``ALGORITHM_VERSION`` must be 2 (checked: another
  algorithm is refused, never silently used).

Pure numpy, pyarrow and rensa: no table access.
"""

from __future__ import annotations

import hashlib
from dataclasses import asdict, dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

try:  # version 2's signatures; imported lazily by name so version 1 works without it
    from rensa import RMinHash as _RMinHash
except ImportError:  # pragma: no cover - rensa is a dependency
    _RMinHash = None
RENSA_ALGORITHM = 2  # rensa's RMinHash.ALGORITHM_VERSION that version 2's signatures are

VERSION = 2  # the hashing new tables get; see the module docstring
VERSIONS = (1, 2)
SHINGLES_PER_CHUNK = 1 << 12  # (permutations × shingles) chunks of ~4 MB: 2-3x faster than 30 MB
MIX = np.uint64(0x9E3779B97F4A7C15)
FNV = np.uint64(0x100000001B3)


@dataclass(frozen=True)
class MinHashSettings:
    ngram: int = 5
    bands: int = 14
    rows_per_band: int = 8
    seed: int = 1
    min_jaccard: float = 0.8
    version: int = VERSION  # bump when the hashing changes: old band keys would no longer match

    def __post_init__(self) -> None:
        if self.version not in VERSIONS:
            raise ValueError(f"MinHashSettings.version={self.version!r}: known versions are "
                             f"{VERSIONS}; a table's stored settings name the one to use")

    @property
    def num_perm(self) -> int:
        return self.bands * self.rows_per_band

    def to_dict(self) -> dict:
        return asdict(self)


def _check_version(version: int) -> None:
    if version not in VERSIONS:
        raise ValueError(f"MinHash version {version!r} is unknown: use one of {VERSIONS}")


# ---------------------------------------------------------------------------- version 1: words

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


def _words_v1(texts: pa.Array) -> tuple[np.ndarray, np.ndarray]:
    """(document index, 64-bit word hash) of every word, in order."""
    tokens = pc.utf8_split_whitespace(simplify(texts))
    parents = pc.list_parent_indices(tokens).to_numpy(zero_copy_only=False)
    flat = tokens.flatten()
    keep = pc.greater(pc.utf8_length(flat), 0).to_numpy(zero_copy_only=False)
    if not keep.all():
        parents = parents[keep]
        flat = flat.filter(pa.array(keep))
    return parents, _word_hashes(flat)


# ---------------------------------------------------------------------------- version 2: words

def fmix64(x: np.ndarray) -> np.ndarray:
    """MurmurHash3's 64-bit finaliser (in place on a fresh array)."""
    x ^= x >> np.uint64(33)
    x *= np.uint64(0xFF51AFD7ED558CCD)
    x ^= x >> np.uint64(33)
    x *= np.uint64(0xC4CEB9FE1A85EC53)
    x ^= x >> np.uint64(33)
    return x


def _simplify_unicode(texts: pa.Array) -> pa.Array:
    """Version 2 for documents with non-ASCII characters: version 1's regexes, and Unicode
    separators (no-break spaces, ideographic spaces...) become spaces; the byte pass after it
    finds nothing left to drop."""
    out = simplify(texts)
    return pc.replace_substring_regex(out, r"[\p{Z}\x{85}]+", " ")


def _utf8_bytes(texts: pa.Array) -> tuple[np.ndarray, np.ndarray]:
    """(offsets [n + 1] int64 from 0, the bytes) of a string array, without copying the text."""
    if isinstance(texts, pa.ChunkedArray):
        texts = texts.combine_chunks()
    if texts.type not in (pa.string(), pa.large_string()):
        texts = pc.cast(texts, pa.large_string())
    if texts.null_count:
        texts = texts.fill_null("")
    n = len(texts)
    bufs = texts.buffers()
    kind = np.int64 if texts.type == pa.large_string() else np.int32
    offsets = np.frombuffer(bufs[1], dtype=kind, count=texts.offset + n + 1)[texts.offset:]
    offsets = offsets.astype(np.int64)
    data = np.frombuffer(bufs[2], dtype=np.uint8) if bufs[2] is not None else \
        np.zeros(0, np.uint8)
    data = data[offsets[0]:offsets[-1]]
    return offsets - offsets[0], data


def _words_v2(texts: pa.Array) -> tuple[np.ndarray, np.ndarray]:
    """(document index, 64-bit word hash) of every word, in order, on the UTF-8 bytes."""
    if texts.type not in (pa.string(), pa.large_string()):
        texts = pc.cast(texts, pa.large_string())
    if texts.null_count:
        texts = texts.fill_null("")
    ascii_ = pc.string_is_ascii(texts)
    if len(texts) and not pc.all(ascii_).as_py():
        other = pc.invert(ascii_)
        texts = pc.replace_with_mask(texts, other, pc.cast(_simplify_unicode(texts.filter(other)),
                                                           texts.type))
    offsets, data = _utf8_bytes(texts)
    # byte classes by comparisons (a table lookup per byte is ~10x slower in numpy)
    sep = data <= 0x20
    sep |= data == 0x7F
    digit = (data - np.uint8(0x30)) < 10
    kept = ((data | np.uint8(0x20)) - np.uint8(0x61)) < 26  # ASCII letters
    kept |= digit
    kept |= data >= 0x80
    # 1. drop ASCII punctuation and symbols, and every digit right after a digit of the same
    # document once those are gone ("3.14" is one digit): one compaction of the bytes
    doc_starts = offsets[:-1][offsets[:-1] < offsets[1:]]
    punct = ~(kept | sep)
    fold = np.zeros(len(data), dtype=bool)
    fold[1:] = digit[1:] & digit[:-1]
    after_punct = np.flatnonzero(digit[1:] & punct[:-1]) + 1  # rare: look back past punctuation
    if len(after_punct):
        doc_start = offsets[np.searchsorted(offsets, after_punct, side="right") - 1]
        back = after_punct - 1
        while True:
            more = (back > doc_start) & punct[back]
            if not more.any():
                break
            back[more] -= 1
        fold[after_punct] = digit[back] & (back >= doc_start) & ~punct[back]
    fold[doc_starts] = False  # a document's first digit never folds into the one before
    removed = np.flatnonzero(punct | fold)
    if len(removed):
        offsets = offsets - np.searchsorted(removed, offsets)
        keep = np.ones(len(data), dtype=bool)
        keep[removed] = False
        data = data[keep]
    else:
        data = data.copy()  # folded in place below; the input's buffer is read-only
    # 2. words: runs of non-separators, a document's bounds cutting them; A-Z lowered, digits 0
    sep = data <= 0x20
    sep |= data == 0x7F
    bound = np.zeros(len(data) + 1, dtype=bool)  # a word cannot run across these positions
    bound[offsets] = True
    bound[1:-1] |= sep[:-1] != sep[1:]
    inside = ~sep
    edges = np.flatnonzero(bound[:-1] & inside)  # first byte of each word
    ends = np.flatnonzero(bound[1:] & inside)  # last byte of each word
    per_doc = np.diff(np.searchsorted(edges, offsets))
    word_doc = np.repeat(np.arange(len(per_doc), dtype=np.int64), per_doc)
    data |= (((data - np.uint8(0x41)) < 26) * np.uint8(0x20)).astype(np.uint8)
    data[(data - np.uint8(0x30)) < 10] = 0x30
    return word_doc, _hash_words(data, edges, ends - edges + 1)


WORD_MUL = np.uint64(0x9FB21C651E98DF25)
_TAIL_MASKS = np.array([(1 << (8 * k)) - 1 for k in range(8)] + [(1 << 64) - 1],
                       dtype=np.uint64)


def _hash_words(data: np.ndarray, start_at: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """A 64-bit hash of each word (bytes ``data[start_at[i]:start_at[i] + lengths[i]]``): the
    length, then per 8-byte little-endian chunk (zero-padded) ``h = ((h ^ chunk) * M);
    h ^= h >> 32``, then MurmurHash3's finaliser. Most words are one chunk: the loop runs over
    the longer ones only."""
    if len(start_at) == 0:
        return np.zeros(0, np.uint64)
    padded = np.zeros(len(data) + 8, dtype=np.uint8)
    padded[:len(data)] = data
    # every 8-byte window of the buffer, one per byte offset (unaligned view)
    windows = np.ndarray((len(data) + 1,), dtype="<u8", buffer=padded, strides=(1,))
    h = lengths.astype(np.uint64)
    idx = None  # all words
    k = 0
    while True:
        at = start_at if idx is None else start_at[idx]
        rest = (lengths if idx is None else lengths[idx]) - 8 * k
        chunk = windows[at + 8 * k] & np.take(_TAIL_MASKS, rest, mode="clip")  # rest >= 1
        cur = h if idx is None else h[idx]
        cur ^= chunk
        cur *= WORD_MUL
        cur ^= cur >> np.uint64(32)
        if idx is not None:
            h[idx] = cur
        longer = np.flatnonzero(rest > 8)
        if len(longer) == 0:
            break
        idx = longer if idx is None else idx[longer]
        k += 1
    return fmix64(h)


# ---------------------------------------------------------------------------- shingles

def _ngrams(parents: np.ndarray, h: np.ndarray, n_docs: int,
            ngram: int) -> tuple[np.ndarray, np.ndarray]:
    """(document index, 32-bit shingle hash) from the words' (document index, 64-bit hash)."""
    n_words = np.bincount(parents, minlength=n_docs)
    ends = np.cumsum(n_words)
    if len(h) >= ngram and not ((n_words > 0) & (n_words < ngram)).any():
        # the common case, every document with words has n or more: its windows are all whole
        # and start at every word but its last n - 1, so contiguous slices, no gathers
        span = len(h) - ngram + 1
        rolled = np.zeros(span, dtype=np.uint64)
        for j in range(ngram):
            rolled ^= h[j:j + span]
            rolled *= FNV
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
            key = np.where(take, (key ^ nxt) * FNV, key)
        doc = parents[idx]
    key ^= key >> np.uint64(29)
    key *= MIX
    return doc.astype(np.int64), key >> np.uint64(32)


def shingle_stream(texts: pa.Array, ngram: int,
                   version: int = VERSION) -> tuple[np.ndarray, np.ndarray]:
    """(document index, 32-bit shingle hash) for every word n-gram of every document, in
    document order (a document's repeated n-grams repeat). A document shorter than ``n`` words
    is one shingle of all its words; a document without words (or null) has none. ``version``:
    the hashing (module docstring); a table's keys must be made with the version it holds."""
    _check_version(version)
    if isinstance(texts, pa.ChunkedArray):
        texts = texts.combine_chunks()
    parents, h = (_words_v2 if version == 2 else _words_v1)(texts)
    return _ngrams(parents, h, len(texts), ngram)


def shingles(texts: pa.Array, ngram: int, version: int = VERSION) -> tuple[np.ndarray, np.ndarray]:
    """:func:`shingle_stream` as sets: sorted and unique per document (for Jaccard)."""
    doc, sh = shingle_stream(texts, ngram, version=version)
    composite = (doc.astype(np.uint64) << np.uint64(32)) | sh
    composite = np.sort(composite)
    composite = composite[np.r_[True, composite[1:] != composite[:-1]]]  # a set per document
    return (composite >> np.uint64(32)).astype(np.int64), composite & np.uint64(0xFFFFFFFF)


# ---------------------------------------------------------------------------- signatures

def _permutations(settings: MinHashSettings) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(settings.seed)
    a = rng.integers(1, 1 << 63, settings.num_perm, dtype=np.uint64) | np.uint64(1)
    b = rng.integers(0, 1 << 63, settings.num_perm, dtype=np.uint64)
    return a, b


def _signatures_numpy(doc: np.ndarray, sh: np.ndarray, n_docs: int,
                      settings: MinHashSettings) -> np.ndarray:
    a, b = _permutations(settings)
    sig = np.full((n_docs, settings.num_perm), np.uint32(0xFFFFFFFF), dtype=np.uint32)
    if len(sh) == 0:
        return sig
    sh = sh.astype(np.uint64, copy=False)
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


def _signatures_rensa(doc: np.ndarray, sh: np.ndarray, n_docs: int,
                      settings: MinHashSettings) -> np.ndarray:
    if _RMinHash is None or getattr(_RMinHash, "ALGORITHM_VERSION", None) != RENSA_ALGORITHM:
        found = "not installed" if _RMinHash is None else \
            f"ALGORITHM_VERSION {getattr(_RMinHash, 'ALGORITHM_VERSION', '?')}"
        raise RuntimeError(
            f"MinHash version 2 needs rensa's RMinHash algorithm {RENSA_ALGORITHM} "
            f"(rensa 0.5.x), found {found}: install the locked rensa (requirements.lock); "
            "other algorithms would give keys that no longer match the stored ones")
    offsets = np.zeros(n_docs + 1, dtype=np.uint64)
    np.cumsum(np.bincount(doc, minlength=n_docs), out=offsets[1:])
    m = _RMinHash.digest_matrix_from_flat_token_hashes(
        np.ascontiguousarray(sh, dtype=np.uint64), offsets, settings.num_perm, settings.seed)
    # to_rows is the matrix's only export (lists of ints): about as costly as the hashing
    return np.array(m.to_rows(), dtype=np.uint32).reshape(n_docs, settings.num_perm)


def signatures(doc: np.ndarray, sh: np.ndarray, n_docs: int,
               settings: MinHashSettings) -> np.ndarray:
    """MinHash values [n_docs, num_perm] (uint32; all-ones for a document without shingles).
    ``doc`` must be non-decreasing; repeated shingles do not change a minimum, so sets are not
    needed.

    Version 1 (numpy): permutation i maps a shingle x to the high 32 bits of
    (a_i * x + b_i) mod 2**64 (multiply-shift hashing), and a document's value is the minimum
    over its shingles. The high 32 bits are monotone in the 64-bit value, so the minimum is
    taken over the 64-bit values and shifted once per document (two passes over the big matrix
    fewer). Version 2: rensa's ``RMinHash`` (algorithm 2, compiled): a coordinatewise minimum of
    per-shingle priorities too, so a union's signature is the minimum of its parts'."""
    _check_version(settings.version)
    if settings.version == 2:
        return _signatures_rensa(doc, sh, n_docs, settings)
    return _signatures_numpy(doc, sh, n_docs, settings)


def band_keys(sig: np.ndarray, settings: MinHashSettings) -> np.ndarray:
    """[n_docs, bands] int64 keys: a hash of each band's rows, salted with the band index so
    keys of different bands never meet (the same for every version: a function of ``sig``)."""
    n = sig.shape[0]
    rows = sig.reshape(n, settings.bands, settings.rows_per_band).astype(np.uint64)
    key = np.broadcast_to((np.arange(settings.bands, dtype=np.uint64) + np.uint64(1)) * MIX,
                          (n, settings.bands)).copy()
    for r in range(settings.rows_per_band):
        key = (key ^ rows[:, :, r]) * FNV
        key ^= key >> np.uint64(31)
    return key.view(np.int64)


def minhash_batch(texts: pa.Array, settings: MinHashSettings) -> tuple[np.ndarray, np.ndarray]:
    """The whole per-batch path: ([n, bands] int64 band keys, [n] bool has words) of ``texts``
    with ``settings`` (its ``version`` included). A document without words gets the keys of an
    all-ones signature; ``has_words`` says which keys are real."""
    if isinstance(texts, pa.ChunkedArray):
        texts = texts.combine_chunks()
    n = len(texts)
    doc, sh = shingle_stream(texts, settings.ngram, version=settings.version)
    keys = band_keys(signatures(doc, sh, n, settings), settings)
    return keys, np.bincount(doc, minlength=n) > 0


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
