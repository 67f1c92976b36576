"""Where did this text come from? Training documents ranked by the spans of words they share
with a text, whatever its layout (OLMoTrace-style n-gram matching on a normalised view), and by
meaning over their whole length (late interaction over ``chunk_embeddings``).

1. **The view**: text and documents are compared as their words (``words.py``: case-folded,
   punctuation and whitespace dropped), so a re-flowed passage is the same words as its source.
2. **Candidates**: (a) documents sharing an n-gram of ``min_span`` words with the text, from an
   n-gram index of the pinned version's training documents (n-grams in more than ``max_df``
   documents, boilerplate, are not used); (b) the ``k_vector`` documents whose best chunk is
   nearest each chunk of the text (MaxSim on ``chunk_embeddings``, else ``embedding``).
3. **Shared spans**: the longest common word runs of each candidate and the text (*matches*);
   ``coverage`` is the share of the text's words in runs of at least ``min_span`` words. Matches
   in order with gaps of at most ``MAX_GAP_WORDS`` words chain into a *passage*, whose
   ``unmatched`` share is its words outside the matches.
4. **Score** = ``coverage + MEANING_WEIGHT * meaning`` (the cosine of the closest chunks).
5. **Verdict**, from the largest passage of at least ``PASSAGE_MIN_WORDS`` matched words and at
   most ``EDITED_COPY_MAX_UNMATCHED`` unmatched: *near-verbatim* (at most
   ``NEAR_VERBATIM_MAX_UNMATCHED`` unmatched), *edited copy* otherwise, *remixed* when there is
   no such passage (thresholds and how they were chosen: docs/forensics.md).

The n-gram index lives in memory (32-bit word fingerprints); above ``MAX_INDEX_NGRAMS``
positions only n-grams whose hash is divisible by ``sample_mod`` are kept on both sides, which
still finds any shared span a few times longer than ``min_span``.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field

import lance
import numpy as np

from lance_assets import paths
from lance_assets.embeddings.chunk_embeddings import (
    CHUNK_EMBEDDINGS,
    QueryChunks,
    read_chunk_vectors,
    shared_chunker,
    table_chunk_spec,
)
from lance_assets.embeddings.embeddings import EMBEDDING, Embedder, read_embeddings, shared_embedder
from lance_assets.embeddings.vector_index import CHUNKS, current_settings, knn_ids
from lance_assets.forensics.pinned import Pin, resolve_pin
from lance_assets.forensics.search import (
    MissingInputError,
    checked_filter,
    nearest,
    table_embedder,
)
from lance_assets.forensics.words import TextWords, text_words, words
from lance_assets.progress import progress
from lance_assets.table import Table

MIN_SPAN_WORDS = 8
PASSAGE_MIN_WORDS = 20
NEAR_VERBATIM_MAX_UNMATCHED = 0.02
EDITED_COPY_MAX_UNMATCHED = 0.5
MAX_GAP_WORDS = 24
MEANING_WEIGHT = 0.25
MAX_INDEX_NGRAMS = 50_000_000
MAX_CANDIDATES = 64
K_VECTOR = 20
MAX_MATCHES_LISTED = 20
EXCERPT_CHARS = 160
_P = np.uint64(0x100000001B3)


def ngram_hashes(values: np.ndarray, n: int) -> np.ndarray:
    """64-bit hash of every window of ``n`` consecutive values (len(values) - n + 1 of them)."""
    v = np.asarray(values).astype(np.uint64) + np.uint64(1)
    m = len(v) - n + 1
    if m <= 0:
        return np.zeros(0, np.uint64)
    h = np.zeros(m, np.uint64)
    for j in range(n):  # wraps mod 2**64, as intended
        h = h * _P + v[j:j + m]
    h ^= h >> np.uint64(30)  # splitmix64 finaliser: low bits usable for sampling
    h *= np.uint64(0xBF58476D1CE4E5B9)
    h ^= h >> np.uint64(27)
    h *= np.uint64(0x94D049BB133111EB)
    h ^= h >> np.uint64(31)
    return h


@dataclass
class NgramIndex:
    """Sorted (n-gram hash, document) pairs over the training documents' words (or any other
    sequences of integers: the benchmark indexes token ids with it, as a baseline)."""

    n: int
    sample_mod: int
    ids: np.ndarray  # row id of each document
    offsets: np.ndarray  # document i's values: values[offsets[i]:offsets[i + 1]]
    values: np.ndarray
    hashes: np.ndarray  # sorted
    docs: np.ndarray  # document index of each hash entry
    max_df: int
    build_s: float = 0.0

    @property
    def size(self) -> int:
        return int(len(self.values))

    def doc_values(self, doc: int) -> np.ndarray:
        return self.values[self.offsets[doc]:self.offsets[doc + 1]]

    @classmethod
    def build(cls, ids: np.ndarray, offsets: np.ndarray, values: np.ndarray, n: int,
              max_df: int | None = None, max_ngrams: int = MAX_INDEX_NGRAMS) -> NgramIndex:
        start = time.perf_counter()
        h = ngram_hashes(values, n)
        lengths = np.diff(offsets)
        doc_of = np.repeat(np.arange(len(ids), dtype=np.int32), lengths)[:len(h)]
        valid = np.arange(len(h)) + n <= offsets[1:][doc_of]  # windows inside one document
        sample_mod = max(1, math.ceil(int(valid.sum()) / max_ngrams))
        if sample_mod > 1:
            valid &= h % np.uint64(sample_mod) == 0
        h, doc_of = h[valid], doc_of[valid]
        order = np.lexsort((doc_of, h))
        h, doc_of = h[order], doc_of[order]
        first = np.ones(len(h), bool)  # one entry per (hash, document)
        first[1:] = (h[1:] != h[:-1]) | (doc_of[1:] != doc_of[:-1])
        if max_df is None:
            max_df = max(20, len(ids) // 200)  # in more than 0.5% of documents: boilerplate
        return cls(n, sample_mod, ids, offsets, values, h[first], doc_of[first], max_df,
                   time.perf_counter() - start)

    def candidates(self, values: np.ndarray, limit: int = MAX_CANDIDATES) -> list[tuple[int, int]]:
        """(document index, shared n-grams) for the documents sharing the most n-grams."""
        h = ngram_hashes(values, self.n)
        if self.sample_mod > 1:
            h = h[h % np.uint64(self.sample_mod) == 0]
        h = np.unique(h)
        lo = np.searchsorted(self.hashes, h, "left")
        hi = np.searchsorted(self.hashes, h, "right")
        df = hi - lo
        use = (df > 0) & (df <= self.max_df)
        if not use.any():
            return []
        found = np.concatenate([self.docs[a:b] for a, b in zip(lo[use], hi[use])])
        docs, counts = np.unique(found, return_counts=True)
        order = np.lexsort((docs, -counts))[:limit]
        return [(int(docs[i]), int(counts[i])) for i in order]


def read_words(ds: lance.LanceDataset, filter: str | None,
               log: Callable[[str], None] | None = None
               ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(ids, offsets, flat uint32 word fingerprints) of ``text`` for the rows passing
    ``filter``; the rows read are counted on a progress bar and in ``log``."""
    ids, counts, values = [], [], []
    with progress(ds.count_rows(filter=filter), "n-gram index", "row", log) as bar:
        for batch in ds.to_batches(columns=["id", "text"], filter=filter):
            w = words(batch.column("text"))
            ids.append(batch.column("id").to_numpy(zero_copy_only=False))
            counts.append(np.diff(w.offsets))
            values.append(w.values)
            bar.update(batch.num_rows)
    if not ids:
        return np.zeros(0, np.int64), np.zeros(1, np.int64), np.zeros(0, np.uint32)
    counts = np.concatenate(counts)
    offsets = np.zeros(len(counts) + 1, np.int64)
    np.cumsum(counts, out=offsets[1:])
    return np.concatenate(ids), offsets, np.concatenate(values)


def build_ngram_index(ds: lance.LanceDataset, filter: str | None, n: int = MIN_SPAN_WORDS,
                      max_df: int | None = None, max_ngrams: int = MAX_INDEX_NGRAMS,
                      log: Callable[[str], None] | None = None) -> NgramIndex:
    """The word n-gram index of the rows passing ``filter``."""
    start = time.perf_counter()
    index = NgramIndex.build(*read_words(ds, filter, log), n, max_df, max_ngrams)
    index.build_s = time.perf_counter() - start
    return index


@dataclass
class Alignment:
    """Where ``text`` and ``doc`` (two value arrays) share runs of at least ``min_span``."""

    longest: int  # longest common run, in values
    covered: np.ndarray  # mask of the text's values inside shared runs >= min_span
    segments: list[tuple[int, int, int, int]]  # (text start, text end, doc start, doc end), ends
    # exclusive, non-overlapping in the text, in text order


def align(text: np.ndarray, doc: np.ndarray, min_span: int) -> Alignment:
    """Longest common runs of ``text`` and ``doc`` by dynamic programming (iterating over the
    shorter array): for every text position, the longest run ending there and where it ends in
    ``doc``. Segments are read greedily from the end of the text."""
    m = len(text)
    covered = np.zeros(m, bool)
    if m == 0 or len(doc) == 0:
        return Alignment(0, covered, [])
    best = np.zeros(m, np.int32)  # longest run ending at each text position
    doc_end = np.zeros(m, np.int64)  # ... and the doc position it ends at
    if m <= len(doc):
        run = np.zeros(len(doc) + 1, np.int32)
        for i in range(m):
            nxt = np.zeros_like(run)
            nxt[1:] = np.where(doc == text[i], run[:-1] + 1, 0)
            run = nxt
            j = int(run.argmax())
            best[i], doc_end[i] = run[j], j - 1
    else:
        run = np.zeros(m + 1, np.int32)
        for j in range(len(doc)):
            nxt = np.zeros_like(run)
            nxt[1:] = np.where(text == doc[j], run[:-1] + 1, 0)
            run = nxt
            better = run[1:] > best
            best[better] = run[1:][better]
            doc_end[better] = j
    longest = int(best.max())
    long_enough = np.flatnonzero(best >= min_span)
    if len(long_enough):
        delta = np.zeros(m + 1, np.int32)
        np.add.at(delta, long_enough - best[long_enough] + 1, 1)
        np.add.at(delta, long_enough + 1, -1)
        covered = np.cumsum(delta[:-1]) > 0
    segments = []
    i = m - 1
    while i >= 0:
        n = int(best[i])
        if n >= min_span:
            segments.append((i - n + 1, i + 1, int(doc_end[i]) - n + 1, int(doc_end[i]) + 1))
            i -= n
        else:
            i -= 1
    return Alignment(longest, covered, segments[::-1])


@dataclass
class Passage:
    """Segments that follow each other in both texts with small gaps: a copied stretch."""

    first: int  # index of its first segment
    last: int
    matched: int  # words inside the segments
    unmatched: int  # words in the gaps (the larger of the two sides per gap)

    @property
    def unmatched_share(self) -> float:
        total = self.matched + self.unmatched
        return self.unmatched / total if total else 0.0


def passages(segments: list[tuple[int, int, int, int]], max_gap: int = MAX_GAP_WORDS
             ) -> list[Passage]:
    """Chain segments (in text order) whose text and document gaps are both 0..``max_gap``."""
    out: list[Passage] = []
    for k, (ts, te, ds_, _) in enumerate(segments):
        if out:
            prev = segments[out[-1].last]
            t_gap, d_gap = ts - prev[1], ds_ - prev[3]
            if 0 <= t_gap <= max_gap and 0 <= d_gap <= max_gap:
                p = out[-1]
                p.last, p.matched, p.unmatched = k, p.matched + te - ts, \
                    p.unmatched + max(t_gap, d_gap)
                continue
        out.append(Passage(k, k, te - ts, 0))
    return out


@dataclass
class Source:
    rank: int
    id: int
    score: float
    coverage: float  # share of the text's words in spans >= min_span shared with this document
    cosine: float | None  # meaning: closest chunk pair (or document vectors), None when unknown
    longest_span_words: int
    longest_span_chars: int  # in the attributed text
    passage_words: int  # matched words of the longest passage
    passage_unmatched: float  # share of that passage's words outside the matches
    span: str  # the longest shared span, as it reads in the attributed text
    snippet: str  # the document around that span (or its closest chunk)
    matches: list[dict] = field(default_factory=list)  # text/doc character ranges, words
    closest_chunk: dict | None = None  # {"text": [s, e], "doc": [s, e], "cosine"}
    found_by: list[str] = field(default_factory=list)  # "ngram", "vector"

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass
class Attribution:
    verdict: str  # "near-verbatim", "edited copy" or "remixed"
    reason: str
    sources: list[Source]
    text_words: int
    covered_share: float  # share of the text's words inside spans >= min_span of any candidate
    min_span_words: int
    meaning: str  # "chunks" (chunk_embeddings), "document" (embedding) or "none"
    candidates: dict
    table_version: int
    timings_ms: dict = field(default_factory=dict)

    def to_dict(self) -> dict:
        return {**asdict(self), "sources": [s.to_dict() for s in self.sources]}


@dataclass
class _Scored:
    rid: int
    score: float
    alignment: Alignment | None
    passage: Passage | None
    coverage: float
    cosine: float | None
    chunk_pair: tuple[int, int] | None  # (query chunk, document chunk) closest in meaning
    found_by: list[str]


class Attributor:
    """Holds the pinned training documents' word n-gram index and the model, so many texts
    (every sample of a run) are attributed for the price of one build."""

    def __init__(self, table: Table, pin: Pin | None = None,
                 embedder: Embedder | None = None,
                 min_span: int = MIN_SPAN_WORDS, max_ngrams: int = MAX_INDEX_NGRAMS,
                 meaning: str = "auto", log: Callable[[str], None] = print):
        """``meaning``: ``auto`` (chunks when the table has them, else document vectors, else
        none), or one of ``chunks``, ``document``, ``none`` (comparisons)."""
        self.table = table
        self.root = paths.data_dir(self.table.root)
        self.pin = pin or resolve_pin(self.table)
        self.latest = self.table.open()
        self.pinned = self.table.open(self.pin.version)
        train_rows = checked_filter(self.pinned, self.pin.rows_filter(training_only=True),
                                    f"the training filter recorded for {self.pin.source}")
        self.filter = train_rows.lance if train_rows is not None else None
        names = self.latest.schema.names
        self.chunk_spec = table_chunk_spec(self.latest)
        available = [m for m, ok in (("chunks", self.chunk_spec is not None
                                      and CHUNK_EMBEDDINGS.name in names),
                                     ("document", EMBEDDING.name in names), ("none", True)) if ok]
        if meaning not in ("auto", "chunks", "document", "none"):
            raise ValueError(f"meaning={meaning!r}: use 'auto', 'chunks', 'document' or 'none'")
        if meaning != "auto" and meaning not in available:
            raise MissingInputError(
                f"meaning={meaning!r}: the table has no "
                f"{'chunk_embeddings' if meaning == 'chunks' else 'embedding'} column; "
                f"materialize `{'chunk_embeddings' if meaning == 'chunks' else 'embeddings'}`")
        self.meaning = available[0] if meaning == "auto" else meaning
        self.settings = {"chunks": current_settings(self.latest, CHUNKS),
                         "document": current_settings(self.latest)}.get(self.meaning)
        self.min_span = min_span
        self.index = build_ngram_index(self.pinned, self.filter, min_span,
                                       max_ngrams=max_ngrams, log=log)
        self.doc_of_id = {int(r): i for i, r in enumerate(self.index.ids)}
        log(f"n-gram index: {len(self.index.ids)} training documents, {self.index.size} words, "
            f"{len(self.index.hashes)} {min_span}-word n-grams (1 in {self.index.sample_mod}) "
            f"in {self.index.build_s:.1f}s")
        self._embedder = embedder
        self._query_chunks: QueryChunks | None = None

    @property
    def has_vectors(self) -> bool:
        return self.meaning != "none"

    @property
    def embedder(self) -> Embedder:
        if self._embedder is None:
            self._embedder = table_embedder(self.latest)
        return self._embedder

    @property
    def query_chunks(self) -> QueryChunks:
        """The text cut and embedded as the table's chunks were (the model reads each chunk
        whole: its window is the chunk's)."""
        if self._query_chunks is None:
            self._query_chunks = QueryChunks(self.chunk_spec,
                                             shared_embedder(self.chunk_spec.chunk_tokens,
                                                             backend=self.chunk_spec.backend))
        return self._query_chunks

    def _meaning(self, text: str, found_by: dict[int, list[str]], k_vector: int
                 ) -> tuple[dict[int, float], dict[int, tuple[int, int]], list[tuple[int, int]]]:
        """Cosines by meaning for the vector hits and every other candidate (added to
        ``found_by``), the closest (query chunk, document chunk) pairs, the query's chunks."""
        cos: dict[int, float] = {}
        pairs: dict[int, tuple[int, int]] = {}
        if self.meaning == "document":
            qvec = self.embedder.encode([text])[0]
            for rid, cosine in nearest(self.latest, self.settings, qvec, k_vector, self.filter):
                cos[rid] = cosine
                found_by.setdefault(rid, []).append("vector")
            missing = [r for r in found_by if r not in cos]
            for rid, vec in read_embeddings(self.latest, missing).items():
                cos[int(rid)] = float(np.dot(vec, qvec))
            return cos, pairs, [(0, len(text))]
        spans, qvecs = self.query_chunks(text)
        # one search per query chunk: a document is near when one of its chunks is near one
        # of the text's chunks (a quote inside unrelated text), not on average over all of them
        for hits in knn_ids(self.latest, qvecs, k_vector, self.settings, self.filter, CHUNKS):
            for rid in hits:
                if "vector" not in found_by.setdefault(rid, []):
                    found_by[rid].append("vector")
        for rid, dvecs in read_chunk_vectors(self.latest, list(found_by)).items():
            sims = qvecs @ dvecs.T
            q, d = np.unravel_index(int(sims.argmax()), sims.shape)
            cos[int(rid)], pairs[int(rid)] = float(sims[q, d]), (int(q), int(d))
        return cos, pairs, spans

    def attribute(self, text: str, k: int = 5, k_vector: int = K_VECTOR) -> Attribution:
        """Rank the training documents ``text`` most likely draws on."""
        timings: dict[str, float] = {}
        t = time.perf_counter()
        tw = text_words(text)
        by_ngram = self.index.candidates(tw.values)
        timings["ngram_lookup"] = time.perf_counter() - t
        found_by: dict[int, list[str]] = {}
        for doc, _ in by_ngram:
            found_by.setdefault(int(self.index.ids[doc]), []).append("ngram")
        cos: dict[int, float] = {}
        pairs: dict[int, tuple[int, int]] = {}
        query_spans: list[tuple[int, int]] = []
        if self.has_vectors and text.strip():
            t = time.perf_counter()
            cos, pairs, query_spans = self._meaning(text, found_by, k_vector)
            timings["meaning"] = time.perf_counter() - t
        t = time.perf_counter()
        scored: list[_Scored] = []
        union = np.zeros(len(tw), bool)
        for rid, how in found_by.items():
            doc = self.doc_of_id.get(rid)
            if doc is None:  # a vector hit outside the training rows' index: no words to compare
                al, best = None, None
            else:
                al = align(tw.values, self.index.doc_values(doc), self.min_span)
                union |= al.covered
                best = max(passages(al.segments), key=lambda p: p.matched, default=None)
            coverage = float(al.covered.mean()) if al is not None and len(tw) else 0.0
            c = cos.get(rid)
            scored.append(_Scored(rid, coverage + MEANING_WEIGHT * max(c or 0.0, 0.0), al, best,
                                  coverage, c, pairs.get(rid), how))
        scored.sort(key=lambda s: (-s.score, s.rid))
        timings["spans"] = time.perf_counter() - t
        top = scored[:k]
        texts = self._texts([s.rid for s in top])
        sources = [self._source(rank, s, tw, texts.get(s.rid, ""), query_spans)
                   for rank, s in enumerate(top, start=1)]
        covered = float(union.mean()) if len(tw) else 0.0
        verdict, reason = verdict_of(sources, covered, self.min_span)
        return Attribution(verdict, reason, sources, len(tw), round(covered, 4), self.min_span,
                           self.meaning,
                           {"ngram": len(by_ngram),
                            "vector": sum("vector" in how for how in found_by.values()),
                            "index_documents": int(len(self.index.ids))},
                           self.pin.version,
                           {key: round(v * 1e3, 2) for key, v in timings.items()})

    def _source(self, rank: int, s: _Scored, tw: TextWords, doc_text: str,
                query_spans: list[tuple[int, int]]) -> Source:
        dw = text_words(doc_text)
        matches, longest_words, span, snippet = [], 0, "", ""
        al = s.alignment
        if al is not None and al.segments and len(dw):
            for ts, te, ds_, de in al.segments:
                if de > len(dw):  # the stored text changed under us: never at a pinned version
                    continue
                t0, t1 = tw.chars(ts, te - 1)
                d0, d1 = dw.chars(ds_, de - 1)
                matches.append({"text": [t0, t1], "doc": [d0, d1], "words": te - ts,
                                "excerpt": _excerpt(doc_text, d0, d1)})
            if matches:
                longest = max(matches, key=lambda m: (m["words"], -m["text"][0]))
                longest_words = longest["words"]
                span = tw.text[longest["text"][0]:longest["text"][1]]
                snippet = _around(doc_text, *longest["doc"])
        closest = None
        if s.chunk_pair is not None and query_spans and doc_text is not None:
            q, d = s.chunk_pair
            doc_spans = shared_chunker(self.chunk_spec).spans([doc_text])[0]
            if d < len(doc_spans) and q < len(query_spans):
                closest = {"text": list(query_spans[q]), "doc": list(doc_spans[d]),
                           "cosine": round(s.cosine, 4)}
                if not snippet:
                    snippet = _around(doc_text, *doc_spans[d])
        if not snippet:
            snippet = _around(doc_text, 0, 0)
        p = s.passage
        return Source(rank, s.rid, round(s.score, 4), round(s.coverage, 4),
                      None if s.cosine is None else round(s.cosine, 4), longest_words, len(span),
                      p.matched if p else 0, round(p.unmatched_share, 4) if p else 0.0, span,
                      snippet, matches[:MAX_MATCHES_LISTED], closest, s.found_by)

    def _texts(self, ids: list[int]) -> dict[int, str]:
        if not ids:
            return {}
        tbl = self.pinned.to_table(columns=["id", "text"],
                                   filter=f"id IN ({', '.join(map(str, ids))})")
        return dict(zip(tbl.column("id").to_pylist(), tbl.column("text").to_pylist()))


def _excerpt(text: str, start: int, end: int, width: int = EXCERPT_CHARS) -> str:
    """``text[start:end]`` on one line, its middle cut when longer than ``width``."""
    out = " ".join(text[start:end].split())
    if len(out) <= width:
        return out
    half = (width - 3) // 2
    return out[:half] + " … " + out[-half:]


def _around(doc_text: str, start: int, end: int, width: int = 200) -> str:
    """About ``width`` characters of ``doc_text`` around [start, end), on one line."""
    pad = max(0, (width - (end - start)) // 2)
    lo, hi = max(0, start - pad), min(len(doc_text), max(end, start + width - pad))
    out = " ".join(doc_text[lo:hi].split())
    return ("…" if lo > 0 else "") + out + ("…" if hi < len(doc_text) else "")


def verdict_of(sources: list[Source], covered: float, min_span: int) -> tuple[str, str]:
    """The verdict and its reason, from the largest copied passage of any of ``sources`` (see
    the module docstring). The largest decides: a text that edits a long passage of one
    document and so also holds, unbroken, a shorter piece that another document shares is an
    edited copy of the first."""
    if not sources:
        return "remixed", "no training document shares a span or is near in meaning"
    copies = [s for s in sources if s.passage_words >= PASSAGE_MIN_WORDS
              and s.passage_unmatched <= EDITED_COPY_MAX_UNMATCHED]
    if copies:
        best = max(copies, key=lambda s: (s.passage_words, -s.passage_unmatched))
        verdict, what = (("near-verbatim", "copied, layout aside")
                         if best.passage_unmatched <= NEAR_VERBATIM_MAX_UNMATCHED
                         else ("edited copy", "a copy with words changed"))
        return verdict, (
            f"document {best.id} shares a passage of {best.passage_words} matched words with "
            f"the text, {best.passage_unmatched:.0%} of its words changed or unmatched (longest "
            f"unbroken span: {best.longest_span_words} words): {what}")
    best = max(sources, key=lambda s: (s.passage_words, -s.passage_unmatched))
    near = max(sources, key=lambda s: s.cosine if s.cosine is not None else -1)
    return "remixed", (
        f"no document shares a passage of {PASSAGE_MIN_WORDS}+ words with at most "
        f"{EDITED_COPY_MAX_UNMATCHED:.0%} changed (longest: {best.passage_words} words, document "
        f"{best.id}); {covered:.0%} of the text lies in spans of >= {min_span} words found "
        f"across {sum(s.coverage > 0 for s in sources)} of the top documents"
        + (f"; closest in meaning: document {near.id} (cosine {near.cosine:.2f})"
           if near.cosine is not None else ""))


def attribute(table: Table, text: str, k: int = 5, *,
              version: int | None = None, log: Callable[[str], None] = print) -> Attribution:
    """Rank the training documents ``text`` most likely draws on (see the module docstring);
   """
    return Attributor(table, resolve_pin(table, version), log=log).attribute(text, k)
