"""Near-duplicates with MinHash LSH: the ``near_dup_cluster``, ``near_dup`` and ``minhash_bands``
columns.

Candidates come from :mod:`lance_assets.curation.minhash` (FineWeb's settings: word 5-grams,
112 MinHash values in 14 bands of 8; documents sharing a band are candidates, confirmed when the
exact Jaccard similarity of their 5-gram sets is at least ``min_jaccard``); the band keys of
every earlier document are looked up in a :class:`~lance_assets.curation.band_index.BandIndex`.
Confirmed pairs are joined into clusters.

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
against every document written before it. Invariant: values already written never change, so a
run costs its new rows (plus reading the stored keys), never a rewrite of old fragments. A new
document that bridges two older clusters therefore joins the smaller one; the older clusters are
not merged (that would rewrite old values). The settings are stored in the table's config, and
mixing settings in one column is refused.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import lance
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from lance_assets.curation.band_index import BandIndex
from lance_assets.curation.minhash import (
    MinHashSettings,
    band_keys,
    jaccard,
    per_doc_sets,
    shingle_stream,
    shingles,
    signatures,
)
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
from lance_assets.table.producer import ColumnProducer, Json, Produced, WriteOptions, setting

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


def bands_field(settings: MinHashSettings) -> pa.Field:
    return pa.field("minhash_bands", pa.list_(pa.int64(), settings.bands))


def fields(settings: MinHashSettings) -> list[pa.Field]:
    return [NEAR_DUP_CLUSTER, NEAR_DUP, bands_field(settings)]


class SettingsMismatchError(ValueError):
    pass


# ---------------------------------------------------------------------------- the keys already written

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


def near_dup(
    table: Table | str | Path,
    settings: MinHashSettings = MinHashSettings(),  # noqa: B008 - a frozen dataclass
    *,
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


@dataclass(frozen=True)
class NearDupSettings:
    min_jaccard: float = setting(
        0.8, "A candidate pair (a shared LSH band) is confirmed when the exact Jaccard similarity "
        "of its word 5-gram sets reaches this; 0 confirms every candidate (FineWeb's behaviour).")


def write(table: Table, settings: NearDupSettings, options: WriteOptions) -> Produced:
    from lance_assets.curation.profile import flag_rate

    minhash = MinHashSettings(min_jaccard=settings.min_jaccard)
    report, stats = near_dup(table, minhash, fragments_per_commit=options.fragments_per_commit,
                             executor=options.executor, log=options.log)
    return Produced(write=report, fields=fields(minhash), summary={
        "candidate_pairs": stats.candidate_pairs,
        "confirmed_pairs": stats.confirmed_pairs,
        "new_rows_flagged": stats.flagged,
        "new_rows_joining_old_clusters": stats.joined_old_clusters,
        "near_dup_rate": round(flag_rate(table, NEAR_DUP.name), 4),
        "settings": Json(minhash.to_dict()),
    })


PRODUCER = ColumnProducer(
    name="near_dup",
    doc="`near_dup_cluster` (int64: equal ids form a cluster), `near_dup` (bool: true for all but "
        "the first document of a cluster) and `minhash_bands` (the LSH keys later runs match new "
        "documents against). MinHash LSH with FineWeb's settings: word 5-grams, 14 bands x 8 "
        "hashes; candidates confirmed by exact Jaccard. New documents are matched against old "
        "ones; old values are never rewritten.",
    fields=fields(MinHashSettings()), descriptions=DESCRIPTIONS, write=write,
    settings=NearDupSettings, kinds=("lance", "numpy"),
    reads={NEAR_DUP_CLUSTER.name: [("raw_text", "text"), ("raw_text", "id")],
           NEAR_DUP.name: [("raw_text", "text"), ("raw_text", "id")],
           "minhash_bands": [("raw_text", "text")]})
