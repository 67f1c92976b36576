"""Paragraphs repeated across documents: the ``dup_paragraph_frac`` and ``paragraph_hashes``
columns.

A paragraph is a block of text between blank lines; it is normalised (lowercase, runs of
whitespace collapsed to one space, trimmed) and hashed (64-bit blake2b). ``dup_paragraph_frac``
is the share of a document's paragraph characters (normalised) that belong to paragraphs whose
hash appeared in an *earlier* document (smaller ``id``); repeats inside one document do not
count (``dup_para_char_share`` of ``quality_signals`` covers those). An exact copy of an earlier
document scores 1.0, a document with no paragraph text 0.0.

Order-dependent like ``near_dup``, and incremental the same way: ``paragraph_hashes`` keeps each
document's distinct paragraph hashes in the table, so a later run loads the hashes of every
document already written and goes on from there; values already written never change because
ids only grow. Hashing is the parallel part of a ``Staged`` compute (a Ray task under the ``ray``
executor); the comparison with every earlier document runs in the driver, in fragment order.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from lance_assets.table import Table
from lance_assets.table.columns import ColumnWriteReport, Staged, fragments_missing
from lance_assets.table.producer import ColumnProducer, Run, Step

DUP_PARAGRAPH_FRAC = pa.field("dup_paragraph_frac", pa.float32())
PARAGRAPH_HASHES = pa.field("paragraph_hashes", pa.list_(pa.int64()))
FIELDS = [DUP_PARAGRAPH_FRAC, PARAGRAPH_HASHES]
DESCRIPTIONS = {
    DUP_PARAGRAPH_FRAC.name: "Share of the document's paragraph characters (paragraphs split on "
                             "blank lines, lowercased, whitespace collapsed) in paragraphs that "
                             "appeared in an earlier document (smaller id). 1.0 for a copy.",
    PARAGRAPH_HASHES.name: "The document's distinct normalised paragraph hashes (64-bit); later "
                           "runs compare new documents against them.",
}
BATCH_ROWS = 2048
PARAGRAPH_SPLIT_RE = r"\n[ \t\r\f\v]*\n"


def _hash64(values: list[str]) -> np.ndarray:
    return np.fromiter(
        (int.from_bytes(hashlib.blake2b(v.encode(), digest_size=8).digest(), "little",
                        signed=True) for v in values), dtype=np.int64, count=len(values))


def paragraphs(texts: pa.Array) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(document index, paragraph hash, paragraph characters) of every non-empty normalised
    paragraph of every text, in document order."""
    texts = pc.fill_null(pc.cast(texts, pa.string()), "")
    if isinstance(texts, pa.ChunkedArray):
        texts = texts.combine_chunks()
    paras = pc.split_pattern_regex(texts, PARAGRAPH_SPLIT_RE)
    parent = pc.list_parent_indices(paras).to_numpy(zero_copy_only=False)
    flat = pc.utf8_trim_whitespace(pc.replace_substring_regex(
        pc.utf8_lower(paras.flatten()), r"\s+", " "))
    length = pc.utf8_length(flat).to_numpy(zero_copy_only=False).astype(np.int64)
    keep = length > 0
    flat = flat.filter(pa.array(keep))
    enc = pc.dictionary_encode(flat)
    hashes = _hash64(enc.dictionary.to_pylist())[enc.indices.to_numpy(zero_copy_only=False)]
    return parent[keep].astype(np.int64), hashes, length[keep]


@dataclass(frozen=True)
class ParagraphHashes:
    """The parallel part: per batch of a fragment, (ids, document index, hash, characters)."""

    def __call__(self, frag) -> list[tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]]:
        out = []
        for batch in frag.to_batches(columns=["id", "text"], batch_size=BATCH_ROWS):
            ids = batch.column("id").to_numpy()
            if len(ids) > 1 and not np.all(np.diff(ids) > 0):
                raise RuntimeError(f"fragment {frag.fragment_id}: ids are not ascending")
            out.append((ids, *paragraphs(batch.column("text"))))
        return out


class KnownHashes:
    """A growing set of int64 hashes: a large sorted base and a small sorted tail merged into
    it now and then, so adding a batch costs about the batch, not the whole set."""

    def __init__(self, initial: np.ndarray) -> None:
        self.base, self.tail = np.unique(initial.astype(np.int64)), np.empty(0, np.int64)

    @staticmethod
    def _isin(sorted_values: np.ndarray, h: np.ndarray) -> np.ndarray:
        if len(sorted_values) == 0:
            return np.zeros(len(h), dtype=bool)
        pos = np.minimum(np.searchsorted(sorted_values, h), len(sorted_values) - 1)
        return sorted_values[pos] == h

    def contains(self, h: np.ndarray) -> np.ndarray:
        return self._isin(self.base, h) | self._isin(self.tail, h)

    def add(self, h: np.ndarray) -> None:
        self.tail = np.union1d(self.tail, h)
        if len(self.tail) > max(1 << 16, len(self.base) // 8):
            self.base, self.tail = np.union1d(self.base, self.tail), np.empty(0, np.int64)


def _seen_before(doc: np.ndarray, h: np.ndarray, known: KnownHashes) -> np.ndarray:
    """For each (document, hash) pair of a batch: did the hash appear in ``known`` (earlier
    batches) or in an earlier document of this batch?"""
    if len(h) == 0:
        return np.zeros(0, dtype=bool)
    in_known = known.contains(h)
    order = np.lexsort((doc, h))  # by hash, then document
    hs, ds = h[order], doc[order]
    head = np.r_[True, hs[1:] != hs[:-1]]
    first_doc = ds[np.flatnonzero(head)[np.cumsum(head) - 1]]
    earlier = np.empty(len(h), dtype=bool)
    earlier[order] = first_doc < ds
    return in_known | earlier


class ParagraphMatcher:
    """The ordered part: each batch against the hashes of every document before it (those
    stored in the table before this run, plus the batches done since). Runs in the driver."""

    def __init__(self, table: Table, stats: dict, rows_end: int) -> None:
        self.table, self.stats = table, stats
        self.rows_end = rows_end  # the pinned version's rows: ids below this
        self.known: KnownHashes | None = None

    def _load(self) -> KnownHashes:
        ds = self.table.newest()
        missing = {f.fragment_id for f in fragments_missing(ds, [f.name for f in FIELDS])}
        done = [f for f in ds.get_fragments() if f.fragment_id not in missing]
        if not done:
            return KnownHashes(np.empty(0, np.int64))
        col = ds.scanner(columns=[PARAGRAPH_HASHES.name], fragments=done,
                         filter=f"id < {int(self.rows_end)}").to_table().column(0)
        return KnownHashes(pc.list_flatten(col).to_numpy(zero_copy_only=False))

    def __call__(self, frag, payload) -> Iterator[pa.RecordBatch]:
        if self.known is None:
            self.known = self._load()
        for ids, doc, h, chars in payload:
            n = len(ids)
            dup = _seen_before(doc, h, self.known)
            total = np.bincount(doc, weights=chars, minlength=n)[:n]
            repeated = np.bincount(doc[dup], weights=chars[dup], minlength=n)[:n]
            frac = np.zeros(n, dtype=np.float64)
            np.divide(repeated, total, out=frac, where=total > 0)
            # each document's distinct hashes, in document order
            pairs = np.unique(np.stack([doc, h], axis=1), axis=0) if len(h) else \
                np.empty((0, 2), np.int64)
            counts = np.bincount(pairs[:, 0], minlength=n)[:n]
            offsets = np.concatenate([[0], np.cumsum(counts)]).astype(np.int32)
            hashes = pa.ListArray.from_arrays(pa.array(offsets), pa.array(pairs[:, 1], pa.int64()))
            self.known.add(h)
            self.stats["documents"] = self.stats.get("documents", 0) + n
            self.stats["with_repeated_paragraphs"] = (self.stats.get("with_repeated_paragraphs", 0)
                                                      + int((repeated > 0).sum()))
            yield pa.RecordBatch.from_arrays([pa.array(frac.astype(np.float32)), hashes],
                                             schema=pa.schema(FIELDS))


def matcher(run: Run, before: None) -> ParagraphMatcher:
    """The state: the ordered part, on the pinned version (it loads the hashes of the documents
    written before, below the pinned version's end, when the first fragment comes)."""
    return ParagraphMatcher(run.table, {}, run.rows_end)


def staged(settings, state: ParagraphMatcher) -> Staged:
    return Staged(ParagraphHashes(), state)


@dataclass
class ParagraphDupsReport(ColumnWriteReport):
    """The write's report, with the counts of the rows it wrote (documents,
    with_repeated_paragraphs)."""

    stats: dict = field(default_factory=dict)


def counted(run: Run, state: ParagraphMatcher, written: ColumnWriteReport) -> ParagraphDupsReport:
    return ParagraphDupsReport(**asdict(written), stats=dict(state.stats))


def summary(table: Table, report: ParagraphDupsReport) -> dict:
    return {
        "new_rows_with_repeated_paragraphs": report.stats.get("with_repeated_paragraphs", 0),
        "rows_with_half_repeated": table.newest().count_rows(
            filter=f"{DUP_PARAGRAPH_FRAC.name} >= 0.5")}


STEPS = (Step(fields=FIELDS, state=matcher, compute=staged, after=counted),)


PRODUCER = ColumnProducer(
    name="paragraph_dups",
    doc="`dup_paragraph_frac`: the share of a document's paragraph characters in paragraphs "
        "(normalised, hashed) that appeared in an earlier document, and `paragraph_hashes`, the "
        "state later runs match new documents against. Order-dependent: hashing runs per fragment "
        "(Ray tasks when asked), the comparison in id order; values already written never change.",
    descriptions=DESCRIPTIONS, steps=STEPS, summary=summary, kinds=("lance", "numpy"),
    reads={DUP_PARAGRAPH_FRAC.name: [("raw_text", "text"), ("raw_text", "id")],
           PARAGRAPH_HASHES.name: [("raw_text", "text")]})
