"""Attribution on real text, before and after: recall at rank 1 for re-formatted and edited
passages, the cost of the chunk embeddings, and the latency of one attribution.

    python -m benchmarks.attribution [--docs '/usr/share/doc/git/RelNotes/*.txt'] [--passages 50]

In one run, on one table of real long technical documents (by default Git's release notes as
Debian ships them, 485 files; any glob of text files with ``--docs``):

1. **Cost.** ``embedding`` (one vector per document, the first 128 word pieces) and then
   ``chunk_embeddings`` (one vector per chunk of 128 word pieces, overlap 32, the whole
   document; first chunks copied from ``embedding``), each timed; documents/s and the bytes each
   column stores per document (its data files on disk).
2. **Passages.** From every document of at least ``--min-words`` words, a passage of
   ``--passage-words`` words starting at a random point of its second half, kept only when no
   other document holds more than half of it (so rank 1 has one right answer). Each passage is quoted inside
   unrelated prose (paragraphs of the GPL-3 text in /usr/share/common-licenses) in the variants
   the issue lists: verbatim; whitespace-flattened; re-wrapped at another width; ~8% of its
   words replaced (by words drawn from the corpus); and re-wrapped with 8% replaced. Heavier
   edits (15%, 30%) and texts of short pieces (10-15 words) of 8 documents map where the
   verdicts change.
3. **Methods**, each ranking the training documents for every text:
   - *before, byte* / *before, BPE*: the previous attribution: n-grams of token ids (48
     characters' worth of tokens, the byte tokenizer or a BPE trained on this corpus) plus the
     document ``embedding`` kNN, score = coverage + 0.25 cosine;
   - *after*: ``Attributor`` (words, ``chunk_embeddings``); and *after, words only* (no
     meaning) and *after, document vectors* (words + ``embedding``) to split the two changes;
   - *meaning only*: the document ranked first by cosine alone, ``embedding`` against the best
     chunk of ``chunk_embeddings``.
4. **Latency** of one attribution (p50/p95; the query is embedded inside it), before and after.

Prints a table of recall@1 per variant and method, the verdict counts and the share of
unmatched words in the passages found, the costs, and ratios against the baselines of the same
run. ``--json-out`` writes every figure.
"""

from __future__ import annotations

import argparse
import glob
import json
import math
import os
import random
import re
import shutil
import tempfile
import textwrap
import time
from pathlib import Path

import lance
import numpy as np

from lance_assets.curation import dedup_flag
from lance_assets.embeddings import chunk_embeddings as chunks
from lance_assets.embeddings import embeddings as embed
from lance_assets.embeddings import vector_index as vindex
from lance_assets.forensics.attribution import (
    MEANING_WEIGHT,
    Attributor,
    NgramIndex,
    align,
)
from lance_assets.forensics.pinned import Pin, max_id
from lance_assets.forensics.search import nearest
from lance_assets.forensics.words import text_words
from lance_assets.ingest.raw_text import ingest
from lance_assets.table import Table
from lance_assets.table.producer import produce
from lance_assets.tokens.bpe import train_bpe
from lance_assets.tokens.tokenizers import load_tokenizer

DEFAULT_DOCS = "/usr/share/doc/git/RelNotes/*.txt"
UNRELATED_SOURCE = "/usr/share/common-licenses/GPL-3"
OLD_MIN_SPAN_CHARS = 48  # the previous attribution's shared-span threshold, in characters
ISSUE_VARIANTS = ("verbatim", "flattened", "re-wrapped (width 50)", "8% words replaced",
                  "re-wrapped + 8% replaced")


def quiet(_msg: str) -> None:
    pass


def pct(values: list[float], q: float) -> float:
    return float(np.percentile(np.asarray(values), q)) if values else float("nan")


def data_bytes(ds: lance.LanceDataset, column: str) -> int:
    """Bytes on disk of the data files holding ``column``."""
    from lance_assets.table import data_files_by_field

    root = Path(ds.uri)
    return sum((root / "data" / f).stat().st_size
               for files in data_files_by_field(ds, column).values() for f in files)


class TokenBaseline:
    """The previous attribution: token n-grams (``min_span`` = 48 characters of tokens) and the
    document-embedding kNN, score = coverage + 0.25 cosine."""

    def __init__(self, tok, texts: list[str], ids: list[int], ds, model, k_vector: int = 20):
        start = time.perf_counter()
        self.tok, self.ds, self.model, self.k_vector = tok, ds, model, k_vector
        arrays = [np.asarray(tok.encode(t), np.int64) for t in texts]
        lengths = np.array([len(a) for a in arrays])
        offsets = np.zeros(len(arrays) + 1, np.int64)
        np.cumsum(lengths, out=offsets[1:])
        bytes_per_token = sum(len(t.encode()) for t in texts) / max(1, int(lengths.sum()))
        self.min_span = max(4, math.ceil(OLD_MIN_SPAN_CHARS / bytes_per_token))
        self.index = NgramIndex.build(np.asarray(ids), offsets, np.concatenate(arrays),
                                      self.min_span)
        self.doc_of = {int(r): i for i, r in enumerate(ids)}
        self.settings = vindex.current_settings(ds)
        self.build_s = time.perf_counter() - start

    def rank(self, text: str) -> list[int]:
        q = np.asarray(self.tok.encode(text), np.int64)
        found = {int(self.index.ids[d]) for d, _ in self.index.candidates(q)}
        qvec = self.model.encode([text])[0]
        cos = dict(nearest(self.ds, self.settings, qvec, self.k_vector, None))
        found |= set(cos)
        missing = [r for r in found if r not in cos]
        for rid, vec in embed.read_embeddings(self.ds, missing).items():
            cos[int(rid)] = float(vec @ qvec)
        scored = []
        for rid in found:
            covered = align(q, self.index.doc_values(self.doc_of[rid]), self.min_span).covered
            coverage = float(covered.mean()) if len(q) else 0.0
            scored.append((coverage + MEANING_WEIGHT * max(cos.get(rid, 0.0), 0.0), rid))
        return [rid for _, rid in sorted(scored, key=lambda s: (-s[0], s[1]))]


def unrelated_paragraphs() -> list[str]:
    text = Path(UNRELATED_SOURCE).read_text()
    paras = [" ".join(p.split()) for p in re.split(r"\n\s*\n", text)]
    return [p for p in paras if len(p.split()) >= 40]


def quote(passage: str, paragraphs: list[str], rng: random.Random) -> str:
    head, tail = rng.sample(paragraphs, 2)
    head = " ".join(head.split()[:50])
    tail = " ".join(tail.split()[:40])
    return "\n".join(textwrap.wrap(head, 72)) + "\n\n" + passage + "\n\n" + \
        "\n".join(textwrap.wrap(tail, 72))


def replace_words(text: str, share: float, vocab: list[str], rng: random.Random) -> str:
    pieces = re.split(r"(\s+)", text)
    spots = [i for i, p in enumerate(pieces) if p and not p.isspace()]
    for i in rng.sample(spots, max(1, round(len(spots) * share))):
        pieces[i] = rng.choice(vocab)
    return "".join(pieces)


def rewrap(text: str, width: int) -> str:
    return "\n".join(textwrap.wrap(" ".join(text.split()), width))


def pick_passages(texts: list[str], n_words: int, min_words: int, limit: int, seed: int
                  ) -> list[tuple[int, str]]:
    """(document index, passage) from the second half of every long document, of which no
    other document holds more than half (in shared spans of 8+ words, whatever the layout):
    rank 1 has one right answer. At most ``limit``."""
    rng = random.Random(seed)
    all_words = [text_words(t) for t in texts]
    ids = np.arange(len(texts))
    offsets = np.zeros(len(texts) + 1, np.int64)
    np.cumsum([len(w) for w in all_words], out=offsets[1:])
    index = NgramIndex.build(ids, offsets, np.concatenate([w.values for w in all_words]), 12,
                             max_df=len(texts))
    out = []
    for i in rng.sample(range(len(texts)), len(texts)):
        spans = list(re.finditer(r"\S+", texts[i]))
        if len(spans) < min_words:
            continue
        for _ in range(20):
            start = rng.randrange(len(spans) // 2, len(spans) - n_words)
            passage = texts[i][spans[start].start():spans[start + n_words - 1].end()]
            pw = text_words(passage).values
            elsewhere = [d for d, _ in index.candidates(pw, limit=len(texts)) if d != i
                         and align(pw, all_words[d].values, 8).covered.mean() > 0.5]
            if not elsewhere:
                out.append((i, passage))
                break
        if len(out) == limit:
            break
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--docs", default=DEFAULT_DOCS, help="glob of text files, one document each")
    p.add_argument("--passages", type=int, default=50)
    p.add_argument("--passage-words", type=int, default=80)
    p.add_argument("--min-words", type=int, default=600)
    p.add_argument("--remixes", type=int, default=30)
    p.add_argument("--flat-below", type=int, default=100,
                   help="rows below which the vector indexes are exact scans")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--workdir", default=None)
    p.add_argument("--json-out", default=None)
    p.add_argument("--backend", default="auto", help="the embeddings' backend (onnx_backend.py)")
    args = p.parse_args(argv)
    os.environ.setdefault("LANCE_LOG", "error")
    work = Path(args.workdir or tempfile.mkdtemp(prefix="attribution_bench_"))
    root = work / "data"
    shutil.rmtree(root, ignore_errors=True)
    files = sorted(glob.glob(args.docs))
    if not files:
        raise SystemExit(f"--docs {args.docs!r} matches no file")
    texts_in = [Path(f).read_text(errors="replace") for f in files]
    src = work / "docs.jsonl"
    src.write_text("".join(json.dumps({"text": t}) + "\n" for t in texts_in))
    ingest(Table.of(root), str(src), log=quiet)
    produce(dedup_flag.PRODUCER, Table.of(root), log=quiet)
    table = Table.of(root)
    ds = table.newest()
    tbl = ds.to_table(columns=["id", "text"])
    ids, texts = tbl.column("id").to_pylist(), tbl.column("text").to_pylist()
    words_total = sum(len(text_words(t)) for t in texts)
    res: dict = {"docs": args.docs, "documents": len(texts), "bytes": sum(len(t.encode())
                                                                      for t in texts),
                 "words": words_total, "load_average_start": os.getloadavg()}
    print(f"corpus: {len(texts)} documents, {res['bytes'] / 1e6:.2f} MB, {words_total} words "
          f"({args.docs})", flush=True)

    # 1. cost of the two embedding columns
    t = time.perf_counter()
    model = embed.shared_embedder(backend=args.backend)
    res["model_load_s"] = time.perf_counter() - t
    res["backend"] = model.backend
    print(f"backend: {model.backend}", flush=True)
    emb = produce(embed.PRODUCER, Table.of(root), embed.EmbeddingsSettings(backend=args.backend), log=quiet)
    ch = produce(chunks.PRODUCER, Table.of(root), chunks.ChunkEmbeddingsSettings(backend=args.backend),
                 log=quiet)
    ds = table.newest()
    n = ds.count_rows()
    cost = {
        "embedding": {"s": emb.duration_s, "docs_per_s": n / emb.duration_s,
                      "bytes_per_doc": data_bytes(ds, "embedding") / n, "vectors": n},
        "chunk_embeddings": {"s": ch.duration_s, "docs_per_s": n / ch.duration_s,
                             "bytes_per_doc": data_bytes(ds, "chunk_embeddings") / n,
                             "vectors": ch.chunks_embedded + ch.chunks_reused,
                             "embedded": ch.chunks_embedded, "copied": ch.chunks_reused},
    }
    res["cost"] = cost
    for name, c in cost.items():
        print(f"{name:17s} {c['s']:7.1f} s  {c['docs_per_s']:6.2f} documents/s  "
              f"{c['bytes_per_doc']:8.0f} bytes/document  {c['vectors']} vectors", flush=True)
    print(f"chunk_embeddings vs embedding: {cost['chunk_embeddings']['s'] / cost['embedding']['s']:.2f}x "
          f"the time, {cost['chunk_embeddings']['bytes_per_doc'] / cost['embedding']['bytes_per_doc']:.1f}x "
          f"the bytes ({ch.chunks_embedded} chunks embedded, {ch.chunks_reused} copied)",
          flush=True)
    res["index"] = {}
    for target in (vindex.DOCUMENTS, vindex.CHUNKS):
        r = vindex.vector_index(Table.of(root), flat_below=args.flat_below, target=target)
        res["index"][target.column] = {"build_s": r.build_s, **r.settings.to_dict()}
        print(f"index on {target.column}: {r.settings.index_type}, {r.build_s:.1f} s, recall@10 "
              f"{r.settings.recall_at_10}", flush=True)

    # 2. passages and variants
    rng = random.Random(args.seed)
    paragraphs = unrelated_paragraphs()
    vocab = sorted({w for t in texts[:200] for w in t.split() if w.isalpha() and len(w) > 3})
    picked = pick_passages(texts, args.passage_words, args.min_words, args.passages, args.seed)
    print(f"{len(picked)} passages of {args.passage_words} words from the second half of "
          f"documents of >= {args.min_words} words, no other document holding half of one",
          flush=True)
    variants = {
        "verbatim": lambda s, r: s,
        "flattened": lambda s, r: " ".join(s.split()),
        "re-wrapped (width 50)": lambda s, r: rewrap(s, 50),
        "8% words replaced": lambda s, r: replace_words(s, 0.08, vocab, r),
        "re-wrapped + 8% replaced": lambda s, r: rewrap(replace_words(s, 0.08, vocab, r), 100),
        "15% words replaced": lambda s, r: replace_words(s, 0.15, vocab, r),
        "30% words replaced": lambda s, r: replace_words(s, 0.30, vocab, r),
    }
    queries = []  # (variant, source id, text)
    for doc, passage in picked:
        for name, make in variants.items():
            queries.append((name, ids[doc], quote(make(passage, rng), paragraphs, rng)))
    remixes = []  # 8 pieces of 10-15 words (as attribution counts them) of 8 documents
    for _ in range(args.remixes):
        pieces = []
        for d in rng.sample(range(len(texts)), 8):
            dw, k = text_words(texts[d]), rng.randint(10, 15)
            if len(dw) > k:
                s = rng.randrange(0, len(dw) - k)
                pieces.append(" ".join(dw.excerpt(s, s + k - 1).split()))
        remixes.append(" ".join(pieces))

    # 3. methods
    pin = Pin(ds.version, max_id(ds), None, None, "benchmark")
    t = time.perf_counter()
    after = Attributor(Table.of(root), pin, log=quiet)
    after_build_s = time.perf_counter() - t
    words_only = Attributor(Table.of(root), pin, meaning="none", log=quiet)
    doc_vectors = Attributor(Table.of(root), pin, meaning="document", log=quiet)
    bpe_report = train_bpe(Table.of(root), log=quiet)
    before = {"byte": TokenBaseline(load_tokenizer("byte"), texts, ids, ds, model),
              "BPE": TokenBaseline(load_tokenizer(bpe_report.name, root), texts, ids, ds, model)}
    res["index_build_s"] = {"words (after)": after_build_s,
                            **{f"tokens ({k})": b.build_s for k, b in before.items()}}
    res["min_span"] = {"words (after)": after.min_span,
                       **{f"tokens ({k})": b.min_span for k, b in before.items()}}
    chunk_vecs = chunks.read_chunk_vectors(ds, ids)
    doc_vecs = embed.read_embeddings(ds, ids)
    chunk_ids = list(chunk_vecs)
    chunk_stack = [chunk_vecs[r] for r in chunk_ids]
    doc_ids = list(doc_vecs)
    doc_matrix = np.stack([doc_vecs[r] for r in doc_ids])

    methods = ["before, byte", "before, BPE", "after, words only", "after, document vectors",
               "after", "meaning only: embedding", "meaning only: chunk_embeddings"]
    hits = {v: dict.fromkeys(methods, 0) for v in variants}
    totals = dict.fromkeys(variants, 0)
    verdicts: dict[str, dict[str, int]] = {v: {} for v in variants}
    unmatched: dict[str, list[float]] = {v: [] for v in variants}
    latency = {"before, byte": [], "before, BPE": [], "after": []}
    for vi_, (variant, source, text) in enumerate(queries):
        totals[variant] += 1
        t = time.perf_counter()
        got = after.attribute(text, k=5)
        latency["after"].append(time.perf_counter() - t)
        top = got.sources[0] if got.sources else None
        hits[variant]["after"] += top is not None and top.id == source
        verdicts[variant][got.verdict] = verdicts[variant].get(got.verdict, 0) + 1
        if top is not None and top.id == source and top.passage_words:
            unmatched[variant].append(top.passage_unmatched)
        for name, att in (("after, words only", words_only),
                          ("after, document vectors", doc_vectors)):
            r = att.attribute(text, k=1)
            hits[variant][name] += bool(r.sources) and r.sources[0].id == source
        for name, b in before.items():
            if variant not in ISSUE_VARIANTS:  # the heavier edits map the verdicts only
                continue
            t = time.perf_counter()
            ranked = b.rank(text)
            latency[f"before, {name}"].append(time.perf_counter() - t)
            hits[variant][f"before, {name}"] += bool(ranked) and ranked[0] == source
        _, qvecs = after.query_chunks(text)
        best_chunk = chunk_ids[int(np.argmax([float((qvecs @ m.T).max()) for m in chunk_stack]))]
        hits[variant]["meaning only: chunk_embeddings"] += best_chunk == source
        qdoc = model.encode([text])[0]
        hits[variant]["meaning only: embedding"] += \
            doc_ids[int(np.argmax(doc_matrix @ qdoc))] == source
        if vi_ % 50 == 49:
            print(f"  {vi_ + 1}/{len(queries)} texts attributed", flush=True)
    remix_verdicts: dict[str, int] = {}
    remix_longest = []
    for text in remixes:
        r = after.attribute(text, k=10)
        remix_verdicts[r.verdict] = remix_verdicts.get(r.verdict, 0) + 1
        remix_longest.append(max((s.passage_words for s in r.sources), default=0))

    res["recall_at_1"] = {v: {m: hits[v][m] / totals[v] for m in methods
                              if v in ISSUE_VARIANTS or not m.startswith("before")}
                          for v in variants}
    res["queries_per_variant"] = totals
    res["verdicts"] = verdicts
    res["unmatched_share"] = {v: {"n": len(u), "min": min(u, default=None),
                                  "p50": pct(u, 50), "max": max(u, default=None)}
                              for v, u in unmatched.items()}
    res["remixes"] = {"texts": len(remixes), "verdicts": remix_verdicts,
                      "longest_passage_words_max": max(remix_longest, default=0),
                      "longest_passage_words_p50": pct(remix_longest, 50)}
    res["latency_ms"] = {m: {"p50": pct(v, 50) * 1e3, "p95": pct(v, 95) * 1e3, "n": len(v)}
                         for m, v in latency.items()}
    res["load_average_end"] = os.getloadavg()

    n_p = len(picked)
    print(f"\nrecall@1 ({n_p} passages per variant, quoted inside unrelated text):")
    print("variant".ljust(26) + "".join(m[:22].rjust(24) for m in methods))
    for v in variants:
        print(v.ljust(26) + "".join(
            (f"{hits[v][m]:>3}/{totals[v]:<3} {hits[v][m] / totals[v]:5.2f}"
             if m in res["recall_at_1"][v] else "-").rjust(24) for m in methods))
    print("\nverdicts (after) and unmatched share of the source's passage:")
    for v in variants:
        u = res["unmatched_share"][v]
        print(f"  {v:26s} {verdicts[v]}  unmatched p50 {u['p50']:.3f} max {u['max']}")
    print(f"  {'remixes (8 pieces of 10-15 words)':26s} {remix_verdicts}  longest passage "
          f"p50 {res['remixes']['longest_passage_words_p50']:.0f}, max "
          f"{res['remixes']['longest_passage_words_max']} words")
    print("\nlatency of one attribution (ms, query embedding included):")
    for m, v in res["latency_ms"].items():
        print(f"  {m:14s} p50 {v['p50']:7.1f}  p95 {v['p95']:7.1f}")
    base = res["latency_ms"]["before, BPE"]["p50"]
    print(f"after vs before (BPE): {res['latency_ms']['after']['p50'] / base:.2f}x the p50 latency")
    print(f"load average: start {res['load_average_start']}, end {res['load_average_end']}")
    if args.json_out:
        Path(args.json_out).write_text(json.dumps(res, indent=2, default=float))
    if not args.workdir:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
