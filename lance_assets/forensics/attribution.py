"""Where did this text come from? Training documents ranked by the verbatim token spans they
share with a text (OLMoTrace-style n-gram matching over ``input_ids``) and by meaning (vector
kNN on ``embedding``).

1. **Candidates.** (a) Every n-gram of ``min_span`` tokens of the text is looked up in an
   n-gram index of the training documents' ``input_ids`` at the pinned table version: any
   document sharing a span of ``min_span`` tokens or more shares at least one such n-gram.
   N-grams found in more than ``max_df`` documents (template phrases, boilerplate) say nothing
   about where a text came from and are not used to find candidates. (b) The ``k_vector``
   nearest training documents of the text's embedding.
2. **Exact spans.** For every candidate, the longest common token substrings with the text
   (dynamic programming over the two token arrays): the longest shared span, and ``coverage``,
   the share of the text's tokens inside spans of at least ``min_span`` tokens shared with it.
3. **Score** = ``coverage + VECTOR_WEIGHT * cosine``: verbatim evidence first, meaning second.
4. **Verdict.** *near-verbatim* when the best document shares one span of at least
   ``NEAR_VERBATIM_CHARS`` characters with the text; otherwise *remixed*: the text is made of
   short pieces and themes found across documents, not copied from one.

``min_span`` is set in characters (``MIN_SPAN_CHARS``) and turned into tokens with the table's
bytes per token, so the byte tokenizer and a BPE demand the same amount of shared text. The
n-gram index lives in memory (16 bytes per indexed n-gram); above ``MAX_INDEX_NGRAMS``
positions only n-grams whose hash is divisible by ``sample_mod`` are kept, which still finds any
shared span a few times longer than ``min_span`` (the same n-gram is kept on both sides).
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

import lance
import numpy as np

from lance_assets import paths
from lance_assets.corpus.tokenizers import load_tokenizer
from lance_assets.forensics.embed import EMBEDDING, Embedder, read_embeddings
from lance_assets.forensics.pinned import Pin, resolve_pin
from lance_assets.forensics.search import (
    MissingInputError,
    checked_filter,
    nearest,
    table_embedder,
)
from lance_assets.forensics.search import snippet as text_snippet
from lance_assets.forensics.vector_index import current_settings
from lance_assets.keys import TOKENIZER_KEY
from lance_assets.progress import progress

MIN_SPAN_CHARS = 48
NEAR_VERBATIM_CHARS = 120
VECTOR_WEIGHT = 0.25
MAX_INDEX_NGRAMS = 50_000_000
MAX_CANDIDATES = 64
K_VECTOR = 20
_P = np.uint64(0x100000001B3)


def ngram_hashes(values: np.ndarray, n: int) -> np.ndarray:
    """64-bit hash of every window of ``n`` consecutive tokens (len(values) - n + 1 of them)."""
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
    """Sorted (n-gram hash, document) pairs over the training documents' tokens."""

    n: int
    sample_mod: int
    ids: np.ndarray  # row id of each document
    offsets: np.ndarray  # document i's tokens: values[offsets[i]:offsets[i + 1]]
    values: np.ndarray
    hashes: np.ndarray  # sorted
    docs: np.ndarray  # document index of each hash entry
    max_df: int
    build_s: float = 0.0

    @property
    def tokens(self) -> int:
        return int(len(self.values))

    def doc_tokens(self, doc: int) -> np.ndarray:
        return self.values[self.offsets[doc]:self.offsets[doc + 1]]

    def candidates(self, tokens: np.ndarray, limit: int = MAX_CANDIDATES) -> list[tuple[int, int]]:
        """(document index, shared n-grams) for the documents sharing the most n-grams."""
        h = ngram_hashes(tokens, self.n)
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


def read_tokens(ds: lance.LanceDataset, filter: str | None,
                log: Callable[[str], None] | None = None
                ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(ids, offsets, flat int32 values) of ``input_ids`` for the rows passing ``filter``; the
    rows read are counted on a progress bar and in ``log``."""
    ids, lengths, values = [], [], []
    with progress(ds.count_rows(filter=filter), "n-gram index", "row", log) as bar:
        for batch in ds.to_batches(columns=["id", "input_ids"], filter=filter):
            col = batch.column("input_ids")
            if col.null_count:
                raise MissingInputError(f"{col.null_count} rows passing {filter!r} have no "
                                        "input_ids; materialize `token_ids` first")
            off = col.offsets.to_numpy()
            ids.append(batch.column("id").to_numpy(zero_copy_only=False))
            lengths.append(np.diff(off))
            values.append(col.values.to_numpy(zero_copy_only=False)[off[0]:off[-1]])
            bar.update(batch.num_rows)
    if not ids:
        return np.zeros(0, np.int64), np.zeros(1, np.int64), np.zeros(0, np.int32)
    lengths = np.concatenate(lengths)
    offsets = np.zeros(len(lengths) + 1, np.int64)
    np.cumsum(lengths, out=offsets[1:])
    return np.concatenate(ids), offsets, np.concatenate(values).astype(np.int32)


def build_ngram_index(ds: lance.LanceDataset, filter: str | None, n: int,
                      max_df: int | None = None,
                      max_ngrams: int = MAX_INDEX_NGRAMS,
                      log: Callable[[str], None] | None = None) -> NgramIndex:
    start = time.perf_counter()
    ids, offsets, values = read_tokens(ds, filter, log)
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
    return NgramIndex(n, sample_mod, ids, offsets, values, h[first], doc_of[first], max_df,
                      time.perf_counter() - start)


def shared_spans(text: np.ndarray, doc: np.ndarray, min_span: int) -> tuple[int, int, np.ndarray]:
    """(longest common substring length, its end position in ``text``, mask of the ``text``
    tokens inside common substrings of at least ``min_span`` tokens)."""
    m = len(text)
    covered = np.zeros(m, bool)
    if m == 0 or len(doc) == 0:
        return 0, -1, covered
    best_end = np.zeros(m, np.int32)  # longest match ending at each text position
    if m <= len(doc):  # iterate over the shorter array
        run = np.zeros(len(doc) + 1, np.int32)
        for i in range(m):
            nxt = np.zeros_like(run)
            nxt[1:] = np.where(doc == text[i], run[:-1] + 1, 0)
            run = nxt
            best_end[i] = run.max()
    else:
        run = np.zeros(m + 1, np.int32)
        for j in range(len(doc)):
            nxt = np.zeros_like(run)
            nxt[1:] = np.where(text == doc[j], run[:-1] + 1, 0)
            run = nxt
            np.maximum(best_end, run[1:], out=best_end)
    end = int(best_end.argmax())
    longest = int(best_end[end])
    long_enough = np.flatnonzero(best_end >= min_span)
    if len(long_enough):
        delta = np.zeros(m + 1, np.int32)
        np.add.at(delta, long_enough - best_end[long_enough] + 1, 1)
        np.add.at(delta, long_enough + 1, -1)
        covered = np.cumsum(delta[:-1]) > 0
    return longest, end, covered


@dataclass
class Source:
    rank: int
    id: int
    score: float
    longest_span_tokens: int
    longest_span_chars: int
    coverage: float  # share of the text's tokens in spans >= min_span shared with this document
    cosine: float | None
    span: str  # the longest shared span, decoded
    snippet: str  # the document around that span
    found_by: list[str] = field(default_factory=list)  # "ngram", "vector"

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass
class Attribution:
    verdict: str  # "near-verbatim" or "remixed"
    reason: str
    sources: list[Source]
    text_tokens: int
    covered_share: float  # share of the text's tokens inside spans >= min_span of any candidate
    min_span_tokens: int
    candidates: dict
    table_version: int
    timings_ms: dict = field(default_factory=dict)

    def to_dict(self) -> dict:
        return {**asdict(self), "sources": [s.to_dict() for s in self.sources]}


class Attributor:
    """Holds the pinned training documents' n-gram index, the tokenizer and the model, so many
    texts (every sample of a run) are attributed for the price of one build."""

    def __init__(self, root: str | Path, pin: Pin | None = None, embedder: Embedder | None = None,
                 min_span_chars: int = MIN_SPAN_CHARS, max_ngrams: int = MAX_INDEX_NGRAMS,
                 log: Callable[[str], None] = print):
        self.root = paths.data_dir(root)
        uri = paths.table_uri(root)
        self.pin = pin or resolve_pin(root)
        self.latest = lance.dataset(uri)
        self.pinned = lance.dataset(uri, version=self.pin.version)
        info = self.pinned.config().get(TOKENIZER_KEY)
        if info is None or "input_ids" not in self.pinned.schema.names:
            raise MissingInputError(f"table version {self.pin.version} has no token columns; "
                               "materialize `token_ids` first")
        self.tok_info = json.loads(info)
        self.tok = load_tokenizer(self.tok_info["name"], root)
        train_rows = checked_filter(self.pinned, self.pin.rows_filter(training_only=True),
                                    f"the training filter recorded for {self.pin.source}")
        self.filter = train_rows.lance if train_rows is not None else None
        bpt = bytes_per_token(self.pinned, self.filter, self.tok_info["name"])
        self.min_span = max(4, math.ceil(min_span_chars / bpt))
        self.index = build_ngram_index(self.pinned, self.filter, self.min_span,
                                       max_ngrams=max_ngrams, log=log)
        self.doc_of_id = {int(r): i for i, r in enumerate(self.index.ids)}
        log(f"n-gram index: {len(self.index.ids)} training documents, {self.index.tokens} tokens, "
            f"{len(self.index.hashes)} {self.min_span}-grams (1 in {self.index.sample_mod}) in "
            f"{self.index.build_s:.1f}s")
        self.has_vectors = EMBEDDING.name in self.latest.schema.names
        self.settings = current_settings(self.latest)
        self._embedder = embedder

    @property
    def embedder(self) -> Embedder:
        if self._embedder is None:
            self._embedder = table_embedder(self.latest)
        return self._embedder

    def encode(self, text: str) -> np.ndarray:
        return np.asarray(self.tok.encode(text), np.int32)

    def attribute(self, text: str, k: int = 5, tokens: np.ndarray | None = None,
                  k_vector: int = K_VECTOR) -> Attribution:
        """Rank the training documents ``text`` most likely draws on; ``tokens`` (the model's own
        ids, when known) are matched instead of re-encoding the text."""
        timings: dict[str, float] = {}
        t = time.perf_counter()
        q = self.encode(text) if tokens is None else np.asarray(tokens, np.int32)
        special = {self.tok_info["eos_id"], self.tok_info["pad_id"]}
        q = q[~np.isin(q, list(special))]
        by_ngram = self.index.candidates(q)
        timings["ngram_lookup"] = time.perf_counter() - t
        found_by: dict[int, list[str]] = {}
        for doc, _ in by_ngram:
            found_by.setdefault(int(self.index.ids[doc]), []).append("ngram")
        cos: dict[int, float] = {}
        if self.has_vectors and text.strip():
            t = time.perf_counter()
            qvec = self.embedder.encode([text])[0]
            for rid, cosine in nearest(self.latest, self.settings, qvec, k_vector, self.filter):
                cos[rid] = cosine
                found_by.setdefault(rid, []).append("vector")
            missing = [r for r in found_by if r not in cos]
            for rid, vec in read_embeddings(self.latest, missing).items():
                cos[int(rid)] = float(np.dot(vec, qvec))
            timings["vector"] = time.perf_counter() - t
        t = time.perf_counter()
        scored = []
        union = np.zeros(len(q), bool)
        for rid, how in found_by.items():
            doc = self.doc_of_id.get(rid)
            if doc is None:  # a vector hit outside the n-gram index: no tokens to compare
                longest, end, covered = 0, -1, np.zeros(len(q), bool)
            else:
                longest, end, covered = shared_spans(q, self.index.doc_tokens(doc), self.min_span)
            union |= covered
            coverage = float(covered.mean()) if len(q) else 0.0
            c = cos.get(rid)
            score = coverage + VECTOR_WEIGHT * max(c or 0.0, 0.0)
            scored.append((score, rid, longest, end, coverage, c, how))
        scored.sort(key=lambda s: (-s[0], s[1]))
        timings["spans"] = time.perf_counter() - t
        top = scored[:k]
        texts = self._texts([s[1] for s in top])
        sources = []
        for rank, (score, rid, longest, end, coverage, c, how) in enumerate(top, start=1):
            span = self.tok.decode(q[end - longest + 1:end + 1].tolist()) if longest else ""
            doc_text = texts.get(rid, "")
            sources.append(Source(rank, rid, round(score, 4), longest, len(span), round(coverage, 4),
                                  None if c is None else round(c, 4), span,
                                  _around(doc_text, span), how))
        verdict, reason = _verdict(sources, float(union.mean()) if len(q) else 0.0, self.min_span)
        return Attribution(verdict, reason, sources, int(len(q)),
                           round(float(union.mean()) if len(q) else 0.0, 4), self.min_span,
                           {"ngram": len(by_ngram),
                            "vector": sum("vector" in how for how in found_by.values()),
                            "index_documents": int(len(self.index.ids))},
                           self.pin.version,
                           {key: round(v * 1e3, 2) for key, v in timings.items()})

    def _texts(self, ids: list[int]) -> dict[int, str]:
        if not ids:
            return {}
        tbl = self.pinned.to_table(columns=["id", "text"],
                                   filter=f"id IN ({', '.join(map(str, ids))})")
        return dict(zip(tbl.column("id").to_pylist(), tbl.column("text").to_pylist()))


def _around(doc_text: str, span: str, width: int = 200) -> str:
    at = doc_text.find(span) if span else -1
    if at < 0:
        return text_snippet(doc_text, "", width)
    start = max(0, at - (width - min(len(span), width)) // 2)
    out = " ".join(doc_text[start:start + max(width, len(span))].split())
    return ("…" if start > 0 else "") + out + ("…" if start + width < len(doc_text) else "")


def _verdict(sources: list[Source], covered: float, min_span: int) -> tuple[str, str]:
    if not sources:
        return "remixed", "no training document shares a span or is near in meaning"
    best = max(sources, key=lambda s: s.longest_span_chars)
    if best.longest_span_chars >= NEAR_VERBATIM_CHARS:
        return "near-verbatim", (
            f"document {best.id} shares a verbatim span of {best.longest_span_chars} characters "
            f"({best.longest_span_tokens} tokens) with the text")
    near = max(sources, key=lambda s: s.cosine or -1)
    return "remixed", (
        f"no document shares more than {best.longest_span_chars} characters verbatim; "
        f"{covered:.0%} of the text lies in spans of >= {min_span} tokens found across "
        f"{sum(s.coverage > 0 for s in sources)} of the top documents"
        + (f"; closest in meaning: document {near.id} (cosine {near.cosine:.2f})"
           if near.cosine is not None else ""))


def bytes_per_token(ds: lance.LanceDataset, filter: str | None, tokenizer: str) -> float:
    """UTF-8 bytes per token of the training rows (from ``n_bytes`` when the table has it)."""
    if tokenizer == "byte":
        return 1.0
    if "n_bytes" in ds.schema.names:
        n_bytes = tokens = 0
        for b in ds.to_batches(columns=["n_bytes", "n_tokens"], filter=filter):
            n_bytes += int(b.column(0).to_numpy(zero_copy_only=False).sum())
            tokens += int(b.column(1).to_numpy(zero_copy_only=False).sum())
        if tokens:
            return n_bytes / tokens
    return 4.0


def attribute(root: str | Path, text: str, k: int = 5, *, version: int | None = None,
              log: Callable[[str], None] = print) -> Attribution:
    """Rank the training documents ``text`` most likely draws on (see the module docstring)."""
    return Attributor(root, resolve_pin(root, version), log=log).attribute(text, k)
