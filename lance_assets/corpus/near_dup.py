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
from dataclasses import asdict, dataclass, field
from pathlib import Path

import lance
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from lance_assets import paths
from lance_assets.corpus.columns import (
    ColumnWriteReport,
    Staged,
    fragments_missing,
    write_columns,
)
from lance_assets.corpus.table import get_json_config, open_table, set_json_config
from lance_assets.keys import NEAR_DUP as NEAR_DUP_COLUMN
from lance_assets.keys import NEAR_DUP_KEY

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
SHINGLES_PER_CHUNK = 1 << 15  # bounds the (shingles × permutations) matrix to ~30 MB
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


def _word_hashes(words: pa.Array) -> np.ndarray:
    """A stable 64-bit hash per word: blake2b over the distinct words of the batch only."""
    enc = pc.dictionary_encode(words)
    uniq = enc.dictionary.to_pylist()
    table = np.fromiter(
        (int.from_bytes(hashlib.blake2b(w.encode(), digest_size=8).digest(), "little") for w in uniq),
        dtype=np.uint64, count=len(uniq),
    )
    return table[enc.indices.to_numpy(zero_copy_only=False)]


def shingles(texts: pa.Array, ngram: int) -> tuple[np.ndarray, np.ndarray]:
    """(document index, 32-bit shingle hash) for every word n-gram of every document, sorted
    and unique per document. A document shorter than ``n`` words is one shingle of all its
    words; a document without words has none."""
    n_docs = len(texts)
    tokens = pc.utf8_split_whitespace(simplify(texts))
    parents = pc.list_parent_indices(tokens).to_numpy(zero_copy_only=False)
    flat = tokens.flatten()
    keep = pc.greater(pc.utf8_length(flat), 0).to_numpy(zero_copy_only=False)
    parents = parents[keep]
    h = _word_hashes(flat.filter(pa.array(keep)))
    n_words = np.bincount(parents, minlength=n_docs)
    starts = np.concatenate([[0], np.cumsum(n_words)])[:-1]
    # windows starting at each word: valid if they end inside the document, or if the document
    # is shorter than n and the window starts at its first word
    pos = np.arange(len(h)) - starts[parents]
    remaining = n_words[parents] - pos
    valid = (remaining >= ngram) | ((n_words[parents] < ngram) & (pos == 0))
    width = np.minimum(remaining, ngram)
    idx = np.flatnonzero(valid)
    key = np.zeros(len(idx), dtype=np.uint64)
    for j in range(ngram):
        take = j < width[idx]
        nxt = np.where(take, h[np.minimum(idx + j, len(h) - 1)], np.uint64(0))
        key = np.where(take, (key ^ nxt) * np.uint64(0x100000001B3), key)
    key ^= key >> np.uint64(29)
    key *= MIX
    doc = parents[idx].astype(np.int64)
    sh = (key >> np.uint64(32)).astype(np.uint64)
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
    (multiply-shift hashing), and a document's value is the minimum over its shingles."""
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
        vals = ((sh[start:end, None] * a[None, :] + b[None, :]) >> np.uint64(32)).astype(np.uint32)
        heads = bounds[lo:hi] - start
        sig[doc[bounds[lo:hi]]] = np.minimum.reduceat(vals, heads, axis=0)
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

@dataclass
class BandIndex:
    """Every band key seen so far -> the first document (smallest id) that had it."""

    keys: np.ndarray = field(default_factory=lambda: np.empty(0, np.int64))
    ids: np.ndarray = field(default_factory=lambda: np.empty(0, np.int64))
    clusters: np.ndarray = field(default_factory=lambda: np.empty(0, np.int64))

    def add(self, ids: np.ndarray, clusters: np.ndarray, keys: np.ndarray) -> None:
        """Add documents (ids ascending, all larger than those already in) and their keys."""
        k = keys.reshape(-1)
        rep = np.repeat(np.arange(len(ids)), keys.shape[1])
        all_keys = np.concatenate([self.keys, k])
        all_ids = np.concatenate([self.ids, ids[rep]])
        all_clusters = np.concatenate([self.clusters, clusters[rep]])
        # np.unique keeps the first occurrence: existing entries, then the smallest new id
        self.keys, first = np.unique(all_keys, return_index=True)
        self.ids, self.clusters = all_ids[first], all_clusters[first]

    def lookup(self, keys: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """For each key: found?, the first id that had it, that id's cluster."""
        if len(self.keys) == 0:
            none = np.zeros(keys.shape, dtype=np.int64)
            return np.zeros(keys.shape, dtype=bool), none, none
        pos = np.minimum(np.searchsorted(self.keys, keys), len(self.keys) - 1)
        return self.keys[pos] == keys, self.ids[pos], self.clusters[pos]


def load_index(ds: lance.LanceDataset, done_fragments: list) -> BandIndex:
    index = BandIndex()
    if not done_fragments:
        return index
    table = ds.scanner(columns=["id", "near_dup_cluster", "minhash_bands"],
                       filter="minhash_bands IS NOT NULL", fragments=done_fragments).to_table()
    if table.num_rows:
        table = table.sort_by("id")
        bands = table.column("minhash_bands").combine_chunks()
        keys = bands.values.to_numpy().reshape(table.num_rows, bands.type.list_size)
        index.add(table.column("id").to_numpy(), table.column("near_dup_cluster").to_numpy(), keys)
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


def assign(
    ids: np.ndarray, sets: list[np.ndarray], keys: np.ndarray, has_words: np.ndarray,
    index: BandIndex, old_sets: Callable[[np.ndarray], dict[int, np.ndarray]],
    settings: MinHashSettings, stats: NearDupStats,
) -> tuple[np.ndarray, np.ndarray]:
    """Clusters and flags for a batch of new documents (ids ascending, larger than every id in
    ``index``); ``old_sets(ids)`` returns the shingle sets of earlier documents."""
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

    need = np.unique(np.array([p[1] for p in pairs_old], dtype=np.int64))
    old = old_sets(need) if settings.min_jaccard > 0 and len(need) else {}

    def confirmed(a: np.ndarray, b: np.ndarray) -> bool:
        return settings.min_jaccard <= 0 or jaccard(a, b) >= settings.min_jaccard

    # union-find over the batch, only along confirmed pairs (few); the root of a component is
    # its smallest position, i.e. its smallest id
    parent = np.arange(n)
    for i, j in sorted(pairs_new):
        if confirmed(sets[i], sets[j]):
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
    attach = [(i, oc) for i, oid, oc in pairs_old if confirmed(sets[i], old.get(oid, sets[i]))]
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
    root: str | Path, settings: MinHashSettings = MinHashSettings(), *,
    fragments_per_commit: int = 4, executor: str | None = None,
    log: Callable[[str], None] = print,
) -> tuple[ColumnWriteReport, NearDupStats]:
    """Write the near-duplicate columns for every fragment that lacks them. Under the ``ray``
    executor the MinHash signatures are Ray tasks and the clustering runs here, in id order."""
    uri = paths.table_uri(root)
    ds = open_table(root)
    current = get_json_config(ds, NEAR_DUP_KEY)
    cols = [f.name for f in fields(settings)]
    if current is not None and current != settings.to_dict():
        written = all(c in ds.schema.names for c in cols) and \
            len(fragments_missing(ds, cols)) < len(ds.get_fragments())
        if written:
            raise SettingsMismatchError(
                f"{uri}: near-duplicate columns were written with {current}, not "
                f"{settings.to_dict()}. Keep the stored settings, or drop the columns first "
                "(lance.dataset(uri).drop_columns(['near_dup_cluster', 'near_dup', "
                "'minhash_bands'])).")
    if current != settings.to_dict():
        set_json_config(ds, NEAR_DUP_KEY, settings.to_dict())
        ds = lance.dataset(uri)
    stats = NearDupStats()
    compute = Staged(MinHashes(settings), Clusterer(uri, settings, stats))
    report = write_columns(uri, fields(settings), compute,
                           fragments_per_commit=fragments_per_commit, executor=executor, log=log)
    return report, stats


@dataclass(frozen=True)
class MinHashes:
    """The per-fragment part (shingles, signatures, band keys), independent of every other
    fragment: a Ray task under the ``ray`` executor. One entry per batch of ``BATCH_ROWS``."""

    settings: MinHashSettings

    def __call__(self, frag) -> list[tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]]:
        out = []
        for batch in frag.to_batches(columns=["id", "text"], batch_size=BATCH_ROWS):
            ids = batch.column("id").to_numpy()
            if len(ids) > 1 and not np.all(np.diff(ids) > 0):
                raise RuntimeError(f"fragment {frag.fragment_id}: ids are not ascending")
            doc, sh = shingles(batch.column("text"), self.settings.ngram)
            keys = band_keys(signatures(doc, sh, len(ids), self.settings), self.settings)
            out.append((ids, doc, sh, keys))
        return out


class Clusterer:
    """The order-dependent part: each batch against every document before it (the band index
    of the table as it was before this run, plus the batches done since). Runs in the driver."""

    def __init__(self, uri: str, settings: MinHashSettings, stats: NearDupStats) -> None:
        self.uri, self.settings, self.stats = uri, settings, stats
        self.text_ds: lance.LanceDataset | None = None
        self.index: BandIndex | None = None

    def old_sets(self, wanted: np.ndarray) -> dict[int, np.ndarray]:
        out = {}
        for i in range(0, len(wanted), 4096):
            chunk = wanted[i:i + 4096]
            t = self.text_ds.to_table(
                columns=["id", "text"], filter=f"id IN ({','.join(map(str, chunk.tolist()))})")
            doc, sh = shingles(t.column("text"), self.settings.ngram)
            for oid, s in zip(t.column("id").to_pylist(), per_doc_sets(doc, sh, t.num_rows)):
                out[oid] = s
        return out

    def __call__(self, frag, minhashes) -> Iterator[pa.RecordBatch]:
        settings = self.settings
        if self.index is None:
            # the table as it was before this run: every text, and the keys already written
            ds0 = lance.dataset(self.uri)
            missing = {f.fragment_id for f in fragments_missing(ds0, [f.name for f in
                                                                      fields(settings)])}
            self.text_ds = ds0
            self.index = load_index(ds0, [f for f in ds0.get_fragments()
                                          if f.fragment_id not in missing])
        for ids, doc, sh, keys in minhashes:
            n = len(ids)
            sets = per_doc_sets(doc, sh, n)
            has_words = np.array([len(s) > 0 for s in sets])
            cluster, flag = assign(ids, sets, keys, has_words, self.index, self.old_sets,
                                   settings, self.stats)
            self.index.add(ids[has_words], cluster[has_words], keys[has_words])
            bands = pa.FixedSizeListArray.from_arrays(pa.array(keys.reshape(-1)), settings.bands)
            bands = pc.if_else(pa.array(has_words), bands, pa.nulls(n, bands.type))
            yield pa.RecordBatch.from_arrays(
                [pa.array(cluster, pa.int64()), pa.array(flag), bands],
                schema=pa.schema(fields(settings)))
