"""Hybrid search over the corpus: BM25 (the ``text_index`` inverted index on ``text``) and vector
kNN (``vector_index`` on ``embedding``), fused by reciprocal rank fusion.

RRF: a document's score is ``sum over the lists it appears in of 1 / (RRF_K + rank)`` (rank from
1, ``RRF_K = 60`` as in Cormack et al. 2009), computed by lancedb's ``RRFReranker``. Ranks, not
raw scores, are fused, so BM25's unbounded scores and cosine similarities need no calibration.
Each list is fetched ``k * 4`` deep so a document ranked moderately by both can still make the
fused top ``k``.

Why the two lists are fetched here and not by lancedb's hybrid query
(``table.search(query_type="hybrid").rerank(RRFReranker())``): that query runs both legs with
the same ``limit`` it then cuts the fused list to, so a hit's rank in each list (``vector_rank``,
``text_rank``, printed by the CLI) cannot be recovered once a better-ranked row of one list was
cut for its low fused score (on a 300-row test table, ``limit`` 20: 10 of the 20 vector results
came back). Filters (``prefilter``), the tuned nprobes / refine factor and our ``text_fts`` index
it would all support; the lists are fetched with Lance, the fusion is lancedb's.

Only the pinned rows are searched (``pinned.py``): by default those of the table version the
newest model trained on. Every filter (``--filter``, and the training filter a checkpoint
recorded) is parsed by ``corpus.predicate`` against the table's columns; only the rendered tree
reaches Lance.
"""

from __future__ import annotations

import re
import time
from dataclasses import asdict, dataclass, field

import lance
import numpy as np
import pyarrow as pa
from lancedb.rerankers import RRFReranker

from lance_assets import paths
from lance_assets.curation.predicate import Predicate, PredicateError, safe_predicate
from lance_assets.embeddings.embeddings import (
    DEFAULT_MAX_TOKENS,
    EMBEDDING,
    Embedder,
    shared_embedder,
    table_embedding_spec,
)
from lance_assets.embeddings.vector_index import current_settings, nearest_arg
from lance_assets.forensics import text_index as fts
from lance_assets.forensics.pinned import Pin, max_id, resolve_pin
from lance_assets.table import Table

RRF_K = 60
DEPTH = 4  # each list is fetched k * DEPTH deep before fusing
SNIPPET_CHARS = 160
MODES = ("hybrid", "vector", "text")


class MissingInputError(RuntimeError):
    """What a forensics command reads has not been materialized; the message names the asset."""


def checked_filter(ds: lance.LanceDataset, text: str | Predicate | None, what: str
                   ) -> Predicate | None:
    """``text`` parsed as a predicate over ``ds``'s columns (``PredicateError`` naming
    ``what``), or None when there is no filter."""
    if text is None or isinstance(text, Predicate):
        return text
    try:
        return safe_predicate(text, ds.schema.names)
    except PredicateError as err:
        raise PredicateError(f"{what}: {err}", err.reason) from None


def and_filters(*preds: Predicate | None) -> str | None:
    """The predicates that are set, joined with AND, as Lance SQL (None when none is set)."""
    out = None
    for p in preds:
        if p is not None:
            out = p if out is None else out.and_(p)
    return out.lance if out is not None else None


@dataclass
class Hit:
    id: int
    score: float  # RRF score (hybrid), cosine similarity (vector) or BM25 (text)
    snippet: str
    vector_rank: int | None = None
    text_rank: int | None = None
    cosine: float | None = None
    bm25: float | None = None

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass
class SearchResult:
    query: str
    mode: str
    hits: list[Hit]
    table_version: int  # the version searched (the newest: it holds the indexes)
    pinned: dict  # which rows were searchable, and why
    notes: list[str] = field(default_factory=list)
    timings_ms: dict = field(default_factory=dict)

    def to_dict(self) -> dict:
        return {**asdict(self), "hits": [h.to_dict() for h in self.hits]}


def rrf(rankings: list[list[int]], k: int = RRF_K) -> dict[int, float]:
    """Reciprocal rank fusion of the vector and the full-text ranking (ids, best first; either
    may be empty): id -> sum of 1 / (k + rank), by lancedb's ``RRFReranker``."""
    if len(rankings) > 2:
        raise ValueError(f"rrf fuses a vector and a full-text ranking, not {len(rankings)}")
    vector_ids, text_ids = (list(rankings) + [[], []])[:2]

    def ranked(ids: list[int], score: str) -> pa.Table:
        # The reranker keys rows by `_rowid`; our ids are unique per row, so they serve.
        return pa.table({"_rowid": pa.array(ids, pa.uint64()),
                         score: pa.array(range(len(ids)), pa.float32())})

    fused = RRFReranker(K=k, return_score="all").rerank_hybrid(
        "", ranked(vector_ids, "_distance"), ranked(text_ids, "_score"))
    return {int(rid): float(score) for rid, score in
            zip(fused["_rowid"].to_pylist(), fused["_relevance_score"].to_pylist())}


def snippet(text: str, query: str, width: int = SNIPPET_CHARS) -> str:
    """``width`` characters of ``text`` around the first query word it contains, on one line."""
    text = " ".join((text or "").split())
    words = [w for w in re.findall(r"\w+", query.lower()) if len(w) > 2]
    low = text.lower()
    at = min((m.start() for w in words if (m := re.search(rf"\b{re.escape(w)}", low))),
             default=0)
    start = max(0, min(at - width // 3, len(text) - width))
    out = text[start:start + width]
    return ("…" if start > 0 else "") + out + ("…" if start + width < len(text) else "")


def table_embedder(ds: lance.LanceDataset) -> Embedder:
    """The shared model, truncating queries as the table's ``embedding`` column was computed
    (so a query and the documents it is compared with are embedded alike)."""
    spec = table_embedding_spec(ds)
    if spec is None:
        return shared_embedder(DEFAULT_MAX_TOKENS)
    return shared_embedder(spec.max_tokens, backend=spec.backend)


def nearest(ds: lance.LanceDataset, settings, qvec: np.ndarray, k: int, filter: str | None,
            with_text: bool = False) -> list[tuple]:
    """(id, cosine similarity[, text]) of the ``k`` rows nearest ``qvec`` among those passing
    ``filter`` (Lance SQL), with the index settings ``vector_index`` tuned (``settings``)."""
    tbl = ds.to_table(columns=["id", "_distance"] + (["text"] if with_text else []),
                      nearest=nearest_arg(settings, np.asarray(qvec, np.float32), k),
                      filter=filter, prefilter=filter is not None)
    rows = zip(tbl.column("id").to_pylist(), (1.0 - d for d in tbl.column("_distance").to_pylist()),
               *([tbl.column("text").to_pylist()] if with_text else []))
    return [(int(r[0]), float(r[1]), *r[2:]) for r in rows]


def has_text_index(ds: lance.LanceDataset) -> bool:
    return fts.INDEX_NAME in {i.name for i in ds.describe_indices()} or any(
        i.index_type.upper().startswith("INVERTED") for i in ds.describe_indices())


class Searcher:
    """Vector, full-text and hybrid search over one table; keeps the model and table open."""

    def __init__(self, table: Table, pin: Pin | None = None,
                 embedder: Embedder | None = None):
        self.table = table
        self.root = paths.data_dir(self.table.root)
        self.ds = self.table.newest()
        self.pin = pin or resolve_pin(self.table)
        self.filter = checked_filter(self.ds, self.pin.rows_filter(latest_max_id=max_id(self.ds)),
                                     "the pinned rows' filter")
        self.settings = current_settings(self.ds)
        self._embedder = embedder
        self.has_vectors = EMBEDDING.name in self.ds.schema.names and \
            self.ds.count_rows(filter=f"{EMBEDDING.name} IS NOT NULL") > 0
        self.has_text = has_text_index(self.ds)

    @property
    def embedder(self) -> Embedder:
        if self._embedder is None:
            self._embedder = table_embedder(self.ds)
        return self._embedder

    def user_filter(self, filter: str | Predicate | None) -> Predicate | None:
        return checked_filter(self.ds, filter, "--filter")

    def vector(self, qvec: np.ndarray, k: int, filter: str | Predicate | None = None,
               with_text: bool = False) -> list[tuple]:
        """(id, cosine similarity[, text]) of the ``k`` nearest rows."""
        flt = and_filters(self.filter, self.user_filter(filter))
        return nearest(self.ds, self.settings, qvec, k, flt, with_text)

    def text(self, query: str, k: int, filter: str | Predicate | None = None,
             with_text: bool = False) -> list[tuple]:
        """(id, BM25 score[, text]) of the ``k`` best keyword matches."""
        flt = and_filters(self.filter, self.user_filter(filter))
        tbl = self.ds.to_table(full_text_query=query, limit=k, filter=flt,
                               columns=["id", "_score"] + (["text"] if with_text else []),
                               prefilter=flt is not None)
        rows = zip(tbl.column("id").to_pylist(), tbl.column("_score").to_pylist(),
                   *([tbl.column("text").to_pylist()] if with_text else []))
        return [(int(r[0]), float(r[1]), *r[2:]) for r in rows]

    def search(self, query: str, k: int = 10, mode: str = "hybrid",
               filter: str | Predicate | None = None) -> SearchResult:
        if mode not in MODES:
            raise ValueError(f"mode {mode!r}: use one of {MODES}")
        filter = self.user_filter(filter)  # refused before any search runs
        notes, timings = [], {}
        vec: list[tuple] = []
        txt: list[tuple] = []
        depth = k * DEPTH if mode == "hybrid" else k
        if mode in ("hybrid", "vector"):
            if self.has_vectors:
                t = time.perf_counter()
                qvec = self.embedder.encode([query])[0]
                timings["embed_query"] = (time.perf_counter() - t) * 1e3
                t = time.perf_counter()
                vec = self.vector(qvec, depth, filter, with_text=True)
                timings["vector"] = (time.perf_counter() - t) * 1e3
            else:
                notes.append("no `embedding` column: materialize `embeddings` (vector search skipped)")
        if mode in ("hybrid", "text"):
            if self.has_text:
                t = time.perf_counter()
                txt = self.text(query, depth, filter, with_text=True)
                timings["text"] = (time.perf_counter() - t) * 1e3
            else:
                notes.append("no full-text index on `text`: materialize `text_index` "
                             "(full-text search skipped)")
        vrank = {row[0]: r for r, row in enumerate(vec, start=1)}
        trank = {row[0]: r for r, row in enumerate(txt, start=1)}
        cos = {rid: score for rid, score, _ in vec}
        bm = {rid: score for rid, score, _ in txt}
        texts = {rid: text for rid, _, text in vec + txt}
        if mode == "hybrid":
            fused = rrf([[row[0] for row in vec], [row[0] for row in txt]])
            ranked = sorted(fused.items(), key=lambda kv: (-kv[1], kv[0]))[:k]
        else:
            ranked = [(rid, score) for rid, score, _ in (vec if mode == "vector" else txt)[:k]]
        hits = [Hit(rid, round(score, 6), snippet(texts.get(rid, ""), query), vrank.get(rid),
                    trank.get(rid), None if rid not in cos else round(cos[rid], 4),
                    None if rid not in bm else round(bm[rid], 4)) for rid, score in ranked]
        timings = {key: round(v, 2) for key, v in timings.items()}
        if self.settings is not None and self.settings.index_type == "FLAT":
            notes.append(f"vector search is exact (flat): {self.settings.rows} rows is below the "
                         "size where an ANN index pays off")
        return SearchResult(query, mode, hits, self.ds.version, self.pin.to_dict(), notes, timings)


def search(table: Table, query: str, k: int = 10, *,
           mode: str = "hybrid", version: int | None = None,
           filter: str | None = None) -> SearchResult:
    """Hybrid (default), vector or full-text search over the pinned rows; each hit has id, score
    and a snippet. ``version`` pins another table
    version; ``filter`` adds a SQL predicate."""
    pin = resolve_pin(table, version)
    return Searcher(table, pin).search(query, k, mode, filter)
