"""Near-duplicates with MinHash LSH: the ``near_dup_cluster``, ``near_dup`` and ``minhash_bands``
columns.

Settings follow FineWeb: text is simplified (lowercase, punctuation and symbols removed, digits
folded to 0), cut into word 5-grams, and each document gets 112 MinHash values in 14 bands of 8.
Two documents that share a band become candidates; a candidate pair is confirmed when the exact
Jaccard similarity of their 5-gram sets is at least ``min_jaccard`` (0.8; 0 confirms every
candidate, FineWeb's own behaviour). Confirmed pairs are joined into clusters.

- ``near_dup_cluster`` (int64): equal values form a cluster; the value is the smallest ``id``
  in the cluster when the document was written (a document with no near-duplicate is its own
  cluster).
- ``near_dup`` (bool): true for every member of a cluster except the one kept, the first
  (smallest ``id``) — the same document exact dedup keeps.
- ``minhash_bands`` (fixed_size_list<int64>[14]): the document's 14 band keys. This is the
  state incremental matching needs, kept in the table itself: a later run matches new
  documents against these keys (and reads the candidates' text to confirm) instead of
  recomputing every old signature. Null for a document with no words.

Incremental like ``is_dup``: fragments lacking the columns are computed in id order, each
against every document written before it; values already written never change. A new document
that bridges two older clusters joins the smaller one; the older clusters are not merged (that
would rewrite old values). The settings are stored in the table's config, and mixing settings in
one column is refused.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from pathlib import Path

import lance
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from lance_assets.keys import NEAR_DUP as NEAR_DUP_COLUMN
from lance_assets.keys import NEAR_DUP_KEY
from lance_assets.table import Table, get_json_config
from lance_assets.table.columns import (
    ColumnWriteReport,
    Staged,
    fragments_missing,
    pinned_rows_end,
    write_columns,
)

NEAR_DUP_CLUSTER = pa.field("near_dup_cluster", pa.int64())
NEAR_DUP = pa.field(NEAR_DUP_COLUMN, pa.bool_())
DESCRIPTIONS = {
    NEAR_DUP_CLUSTER.name: "Near-duplicate cluster: rows with equal values are MinHash LSH "
                           "near-duplicates (word 5-grams, Jaccard confirmed).",
    NEAR_DUP.name: "True for every row of a cluster but its first (smallest id).",
    "minhash_bands": "The row's LSH band keys (one int64 per band); later runs match new rows "
                     "against them.",
}
BATCH_ROWS = 2048
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


def bands_field(settings: MinHashSettings) -> pa.Field:
    return pa.field("minhash_bands", pa.list_(pa.int64(), settings.bands))


def fields(settings: MinHashSettings) -> list[pa.Field]:
    return [NEAR_DUP_CLUSTER, NEAR_DUP, bands_field(settings)]


class SettingsMismatchError(ValueError):
    pass


# ---------------------------------------------------------------------------- shingles, MinHash

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


# ---------------------------------------------------------------------------- the index of known keys

EMPTY = np.int32(-1)
MAX_LOAD = 0.6


class BandIndex:
    """Every band key seen so far -> the first document (smallest id) that had it.

    An open-addressing hash table in numpy arrays (linear probing, vectorised over a batch of
    keys), so adding a batch costs the batch, not the index: linear in the corpus overall. A
    key maps to a *slot* in the per-document arrays ``ids`` / ``clusters``. Memory: 12 bytes per
    table entry at most ``MAX_LOAD`` full, plus 16 bytes per document: ~300 bytes per document
    with 14 bands. ``expected_docs`` sizes the table up front; past it, it doubles."""

    def __init__(self, expected_docs: int = 0, bands: int = 14) -> None:
        self.bands = bands
        self.capacity = 0
        self.entries = 0
        self._resize(max(1024, int(expected_docs * bands / MAX_LOAD) + 1))
        self.n_docs = 0
        self._ids = np.empty(max(expected_docs, 1024), dtype=np.int64)
        self._clusters = np.empty(max(expected_docs, 1024), dtype=np.int64)

    @property
    def ids(self) -> np.ndarray:
        return self._ids[:self.n_docs]

    @property
    def clusters(self) -> np.ndarray:
        return self._clusters[:self.n_docs]

    def _home(self, keys: np.ndarray) -> np.ndarray:
        # multiply-high onto [0, capacity): keys are hashes already; mixing once more keeps
        # the slots uniform whatever their low bits do
        mixed = (keys.view(np.uint64) * MIX) >> np.uint64(32)
        return ((mixed * np.uint64(self.capacity)) >> np.uint64(32)).astype(np.int64)

    def _resize(self, capacity: int) -> None:
        old_keys = getattr(self, "_keys", None)
        old_slots = getattr(self, "_slots", None)
        self.capacity = int(capacity)
        self._keys = np.zeros(self.capacity, dtype=np.int64)
        self._slots = np.full(self.capacity, EMPTY, dtype=np.int32)
        self.entries = 0
        if old_keys is not None:
            used = old_slots != EMPTY
            self._insert(old_keys[used], old_slots[used])

    def _find(self, keys: np.ndarray) -> np.ndarray:
        """The slot each key maps to, or -1."""
        out = np.full(len(keys), EMPTY, dtype=np.int32)
        at = self._home(keys)
        pending = np.arange(len(keys))
        while len(pending):
            pos = at[pending]
            slot = self._slots[pos]
            empty = slot == EMPTY
            hit = ~empty & (self._keys[pos] == keys[pending])
            out[pending[hit]] = slot[hit]
            go_on = ~(empty | hit)
            pending = pending[go_on]
            at[pending] = (pos[go_on] + 1) % self.capacity
        return out

    def _insert(self, keys: np.ndarray, slots: np.ndarray) -> None:
        """Insert keys that are absent and distinct."""
        if self.entries + len(keys) > MAX_LOAD * self.capacity:
            self._resize(max(2 * self.capacity, int((self.entries + len(keys)) / MAX_LOAD) + 1))
        at = self._home(keys)
        pending = np.arange(len(keys))
        while len(pending):
            pos = at[pending]
            free = self._slots[pos] == EMPTY
            # several keys may reach the same free position: the first of them takes it
            taken, first = np.unique(pos[free], return_index=True)
            winners = pending[np.flatnonzero(free)[first]]
            self._keys[taken] = keys[winners]
            self._slots[taken] = slots[winners]
            placed = np.zeros(len(keys), dtype=bool)
            placed[winners] = True
            pending = pending[~placed[pending]]
            at[pending] = (at[pending] + 1) % self.capacity
        self.entries += len(keys)

    def add(self, ids: np.ndarray, clusters: np.ndarray, keys: np.ndarray) -> None:
        """Add documents (ids ascending, all larger than those already in) and their keys
        ``[docs, bands]``; a key already known keeps its first document."""
        n = len(ids)
        if self.n_docs + n > len(self._ids):
            grow = max(2 * len(self._ids), self.n_docs + n)
            self._ids = np.resize(self._ids, grow)
            self._clusters = np.resize(self._clusters, grow)
        slots = np.arange(self.n_docs, self.n_docs + n, dtype=np.int32)
        self._ids[self.n_docs:self.n_docs + n] = ids
        self._clusters[self.n_docs:self.n_docs + n] = clusters
        self.n_docs += n
        flat = keys.reshape(-1)
        new = self._find(flat) == EMPTY
        # the first occurrence of each new key (row-major: the smallest id comes first)
        uniq, first = np.unique(flat[new], return_index=True)
        owner = np.repeat(slots, keys.shape[1])[np.flatnonzero(new)[first]]
        self._insert(uniq, owner)

    def lookup(self, keys: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """For each key: found?, the first id that had it, that id's cluster."""
        slot = self._find(keys.reshape(-1)).reshape(keys.shape)
        found = slot != EMPTY
        safe = np.where(found, slot, 0)
        if self.n_docs == 0:
            none = np.zeros(keys.shape, dtype=np.int64)
            return found, none, none
        return found, self.ids[safe], self.clusters[safe]


def load_index(ds: lance.LanceDataset, done_fragments: list, expected_new: int = 0,
               bands: int = 14, rows_end: int | None = None) -> BandIndex:
    """The keys already written, in id order, in an index sized for ``expected_new`` more;
    only rows with ids below ``rows_end`` (the pinned version's) when given."""
    done_rows = sum(f.count_rows() for f in done_fragments)
    index = BandIndex(done_rows + expected_new, bands)
    if not done_fragments:
        return index
    where = "minhash_bands IS NOT NULL" + (f" AND id < {int(rows_end)}" if rows_end is not None
                                           else "")
    scanner = ds.scanner(columns=["id", "near_dup_cluster", "minhash_bands"],
                         filter=where, fragments=done_fragments)
    parts = [(b.column("id").to_numpy(), b.column("near_dup_cluster").to_numpy(),
              b.column("minhash_bands").values.to_numpy().reshape(b.num_rows, bands))
             for b in scanner.to_batches() if b.num_rows]
    if not parts:
        return index
    ids = np.concatenate([p[0] for p in parts])
    order = np.argsort(ids, kind="stable")
    clusters = np.concatenate([p[1] for p in parts])[order]
    keys = np.concatenate([p[2] for p in parts])[order]
    ids = ids[order]
    step = 1 << 16
    for lo in range(0, len(ids), step):  # in id order, so the first document keeps each key
        index.add(ids[lo:lo + step], clusters[lo:lo + step], keys[lo:lo + step])
    return index


# ---------------------------------------------------------------------------- clustering a batch

@dataclass
class NearDupStats:
    documents: int = 0
    candidate_pairs: int = 0
    confirmed_pairs: int = 0
    flagged: int = 0
    joined_old_clusters: int = 0


def _find(parent: np.ndarray, i: int) -> int:
    while parent[i] != i:
        parent[i] = parent[parent[i]]
        i = parent[i]
    return i


SetsOf = Callable[[np.ndarray], dict[int, np.ndarray]]


def assign(
    ids: np.ndarray, keys: np.ndarray, has_words: np.ndarray, index: BandIndex,
    new_sets: SetsOf, old_sets: SetsOf, settings: MinHashSettings, stats: NearDupStats,
) -> tuple[np.ndarray, np.ndarray]:
    """Clusters and flags for a batch of new documents (ids ascending, larger than every id in
    ``index``). Shingle sets are fetched only for the documents of candidate pairs, and only
    when pairs are confirmed: ``new_sets(positions)`` for documents of the batch,
    ``old_sets(ids)`` for earlier ones."""
    n = len(ids)
    pairs_old: list[tuple[int, int, int]] = []  # (new position, old id, old cluster)
    pairs_new: set[tuple[int, int]] = set()  # (new position, earlier new position)
    rows = np.flatnonzero(has_words)
    k = keys[rows]
    found, hit_id, hit_cluster = index.lookup(k)
    for r, b in zip(*np.nonzero(found)):
        pairs_old.append((int(rows[r]), int(hit_id[r, b]), int(hit_cluster[r, b])))
    # within the batch: each document against the first earlier document with the same key
    flat = k.reshape(-1)
    pos = np.repeat(rows, keys.shape[1])
    order = np.lexsort((pos, flat))
    fk, fp = flat[order], pos[order]
    head = np.r_[True, fk[1:] != fk[:-1]]
    first_pos = fp[np.flatnonzero(head)[np.cumsum(head) - 1]]
    for i, j in zip(fp[~head], first_pos[~head]):
        if i != j:
            pairs_new.add((int(i), int(j)))
    pairs_old = sorted(set(pairs_old))
    stats.candidate_pairs += len(pairs_old) + len(pairs_new)

    sets: dict[int, np.ndarray] = {}
    old: dict[int, np.ndarray] = {}
    if settings.min_jaccard > 0:
        need_new = {i for pair in pairs_new for i in pair} | {p[0] for p in pairs_old}
        if need_new:
            sets = new_sets(np.array(sorted(need_new), dtype=np.int64))
        need = np.unique(np.array([p[1] for p in pairs_old], dtype=np.int64))
        if len(need):
            old = old_sets(need)

    def confirmed(a: np.ndarray | None, b: np.ndarray | None) -> bool:
        return settings.min_jaccard <= 0 or jaccard(a, b) >= settings.min_jaccard

    # union-find over the batch, only along confirmed pairs (few); the root of a component is
    # its smallest position, i.e. its smallest id
    parent = np.arange(n)
    for i, j in sorted(pairs_new):
        if confirmed(sets.get(i), sets.get(j)):
            ri, rj = _find(parent, i), _find(parent, j)
            parent[max(ri, rj)] = min(ri, rj)
            stats.confirmed_pairs += 1
    while True:  # pointer jumping: every position points at its root
        nxt = parent[parent]
        if np.array_equal(nxt, parent):
            break
        parent = nxt
    roots = parent
    # a component attached to an older cluster joins it (the smallest, if several)
    no_old = np.iinfo(np.int64).max
    old_cluster = np.full(n, no_old, dtype=np.int64)
    attach = [(i, oc) for i, oid, oc in pairs_old
              if confirmed(sets.get(i), old.get(oid, sets.get(i)))]
    stats.confirmed_pairs += len(attach)
    if attach:
        at = np.array(attach, dtype=np.int64)
        np.minimum.at(old_cluster, roots[at[:, 0]], at[:, 1])
    joined = old_cluster[roots] != no_old
    cluster = np.where(joined, old_cluster[roots], ids[roots])
    flag = joined | (roots != np.arange(n))
    stats.documents += n
    stats.flagged += int(flag.sum())
    stats.joined_old_clusters += int(joined.sum())
    return cluster, flag


def per_doc_sets(doc: np.ndarray, sh: np.ndarray, n_docs: int) -> list[np.ndarray]:
    """Each document's slice of the output of ``shingles`` (sorted, unique)."""
    cuts = np.searchsorted(doc, np.arange(n_docs + 1))
    return [sh[cuts[i]:cuts[i + 1]] for i in range(n_docs)]


def near_dup(
    table: Table | str | Path, settings: MinHashSettings = MinHashSettings(), *,
    fragments_per_commit: int | None = None, executor: str | None = None,
    log: Callable[[str], None] = print,
) -> tuple[ColumnWriteReport, NearDupStats]:
    """Write the near-duplicate columns for every fragment of one pinned version that lacks
    them: its new rows against every earlier row of that version (rows ingested meanwhile wait
    for the next run). Under the ``ray`` executor the MinHash signatures are Ray tasks and the
    clustering runs here, in id order."""
    table = Table.of(table)

    def run(ds: lance.LanceDataset) -> tuple[ColumnWriteReport, NearDupStats]:
        current = get_json_config(ds, NEAR_DUP_KEY)
        cols = [f.name for f in fields(settings)]
        if current is not None and current != settings.to_dict():
            written = all(c in ds.schema.names for c in cols) and \
                len(fragments_missing(ds, cols)) < len(ds.get_fragments())
            if written:
                raise SettingsMismatchError(
                    f"{table.uri}: near-duplicate columns were written with {current}, not "
                    f"{settings.to_dict()}. Keep the stored settings, or drop the columns first "
                    "(lance.dataset(uri).drop_columns(['near_dup_cluster', 'near_dup', "
                    "'minhash_bands'])).")
        if current != settings.to_dict():
            table.set_config(NEAR_DUP_KEY, settings.to_dict())
        stats = NearDupStats()
        compute = Staged(MinHashes(settings),
                         Clusterer(table, settings, stats, pinned_rows_end(table, ds)))
        report = write_columns(table, fields(settings), compute, pinned=ds,
                               fragments_per_commit=fragments_per_commit, executor=executor,
                               log=log)
        return report, stats

    return table.pinned(run, what="near_dup", log=log)


@dataclass(frozen=True)
class MinHashes:
    """The per-fragment part (shingles, signatures, band keys), independent of every other
    fragment: a Ray task under the ``ray`` executor. One entry per batch of ``BATCH_ROWS``:
    (ids, band keys, has words), ~130 bytes per document; no shingles or text leave the task."""

    settings: MinHashSettings

    def __call__(self, frag) -> list[tuple[np.ndarray, np.ndarray, np.ndarray]]:
        out = []
        for batch in frag.to_batches(columns=["id", "text"], batch_size=BATCH_ROWS):
            ids = batch.column("id").to_numpy()
            if len(ids) > 1 and not np.all(np.diff(ids) > 0):
                raise RuntimeError(f"fragment {frag.fragment_id}: ids are not ascending")
            doc, sh = shingle_stream(batch.column("text"), self.settings.ngram)
            keys = band_keys(signatures(doc, sh, len(ids), self.settings), self.settings)
            has_words = np.bincount(doc, minlength=len(ids)) > 0
            out.append((ids, keys, has_words))
        return out


def _sets_by_position(texts: pa.Array, keys, ngram: int) -> dict[int, np.ndarray]:
    doc, sh = shingles(texts, ngram)
    return dict(zip(keys, per_doc_sets(doc, sh, len(texts))))


class Clusterer:
    """The order-dependent part: each batch against every document before it (the band index
    of the table as it was before this run, plus the batches done since). Runs in the driver.

    The shingle sets that confirmation needs are made again from the text of the candidates
    alone: earlier documents are read by id (the table's stable row ids equal ``id``; a table
    where they do not is read with an ``id IN (...)`` filter instead)."""

    def __init__(self, table: Table, settings: MinHashSettings, stats: NearDupStats,
                 rows_end: int) -> None:
        self.table, self.settings, self.stats = table, settings, stats
        self.rows_end = rows_end  # the pinned version's rows: ids below this
        self.text_ds: lance.LanceDataset | None = None
        self.index: BandIndex | None = None
        self.rows_by_id = True

    def old_sets(self, wanted: np.ndarray) -> dict[int, np.ndarray]:
        texts = None
        if self.rows_by_id:
            try:
                t = self.text_ds._take_rows(wanted.tolist(), columns=["id", "text"])
                if t.column("id").to_numpy().tolist() == wanted.tolist():
                    texts = t
            except Exception:  # noqa: BLE001 - a table without stable row ids: filter instead
                pass
            self.rows_by_id = texts is not None
        if texts is None:
            parts = []
            for i in range(0, len(wanted), 4096):
                chunk = wanted[i:i + 4096]
                parts.append(self.text_ds.to_table(
                    columns=["id", "text"],
                    filter=f"id IN ({','.join(map(str, chunk.tolist()))})"))
            texts = pa.concat_tables(parts)
        return _sets_by_position(texts.column("text"), texts.column("id").to_pylist(),
                                 self.settings.ngram)

    def __call__(self, frag, minhashes) -> Iterator[pa.RecordBatch]:
        settings = self.settings
        if self.index is None:
            # the pinned version's rows: every text, and the keys already written
            ds0 = self.table.newest()
            missing = {f.fragment_id: f for f in fragments_missing(
                ds0, [f.name for f in fields(settings)])}
            self.text_ds = ds0
            self.index = load_index(ds0, [f for f in ds0.get_fragments()
                                          if f.fragment_id not in missing],
                                    expected_new=sum(f.count_rows() for f in missing.values()),
                                    bands=settings.bands, rows_end=self.rows_end)
        offset = 0
        for ids, keys, has_words in minhashes:
            n = len(ids)

            def new_sets(positions: np.ndarray, first: int = offset) -> dict[int, np.ndarray]:
                t = frag.take((positions + first).tolist(), columns=["text"])
                return _sets_by_position(t.column("text"), positions.tolist(), settings.ngram)

            cluster, flag = assign(ids, keys, has_words, self.index, new_sets, self.old_sets,
                                   settings, self.stats)
            self.index.add(ids[has_words], cluster[has_words], keys[has_words])
            offset += n
            bands = pa.FixedSizeListArray.from_arrays(pa.array(keys.reshape(-1)), settings.bands)
            bands = pc.if_else(pa.array(has_words), bands, pa.nulls(n, bands.type))
            yield pa.RecordBatch.from_arrays(
                [pa.array(cluster, pa.int64()), pa.array(flag), bands],
                schema=pa.schema(fields(settings)))
