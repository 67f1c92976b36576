"""Forensics benchmark: embedding throughput, index builds, search latency and ANN recall.

    python -m benchmarks.forensics --rows 100000 --embed-docs 1000

In one run, on one synthetic table of ``--rows`` documents:

1. **Embedding** ``--embed-docs`` documents with all-MiniLM-L6-v2 the way the ``embeddings``
   asset does (length-sorted batches of 64, truncated to 128 word pieces), against one document
   per forward pass (the baseline) on a subset.
2. **The vectors of the big table.** The first ``--embed-docs`` rows get the real embeddings of
   their text. Embedding 100,000 documents on 2 CPU cores takes about an hour, so every other
   row gets a vector derived from two real ones, ``normalise(e_a + 0.5 e_b + noise)`` (noise of
   norm ~0.5): the same dimension, a realistic spread of similarities, and many close
   neighbours per query, which is what makes ANN recall hard. With ``--embed-all`` (a GPU
   machine) every row gets its real embedding instead.
3. **Index builds**: the full-text index (``corpus.fts.text_index``) and the vector index
   (``forensics.vector_index``: IVF_HNSW_SQ, nprobes tuned on 100 of the table's own vectors).
4. **Latency** (p50/p95 over ``--queries`` queries, embedding the query excluded and reported
   apart): vector (ANN), vector (exact scan: the baseline), full-text (BM25) and hybrid (both +
   RRF), through the same ``Searcher`` the CLI uses.
5. **Recall@10** of the ANN index against exact search for the benchmark's own query strings
   (queries that are not rows of the table).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow as pa

from lance_assets.embeddings import embeddings as embed
from lance_assets.embeddings import vector_index as vindex
from lance_assets.forensics import text_index as fts
from lance_assets.forensics.pinned import Pin, max_id
from lance_assets.forensics.search import Searcher, rrf
from lance_assets.ingest.raw_text import ingest
from lance_assets.ingest.synthetic import TOPICS
from lance_assets.table import Table
from lance_assets.table.columns import write_columns


def quiet(_msg: str) -> None:
    pass


def pct(values: list[float], q: float) -> float:
    return float(np.percentile(np.asarray(values), q))


def make_queries(n: int, seed: int = 0) -> list[str]:
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        nouns, verbs, adjs = TOPICS[rng.choice(list(TOPICS))]
        out.append(rng.choice([
            f"why does the {rng.choice(adjs)} {rng.choice(nouns)} {rng.choice(verbs)}",
            f"{rng.choice(nouns)} and {rng.choice(nouns)}",
            f"how scientists {rng.choice(verbs)} a {rng.choice(nouns)}",
            f"{rng.choice(adjs)} {rng.choice(nouns)}",
        ]))
    return out


def bench_embedding(model: embed.Embedder, texts: list[str], baseline_docs: int) -> dict:
    t = time.perf_counter()
    vecs = model.encode(texts)
    batched = len(texts) / (time.perf_counter() - t)
    sub = texts[:baseline_docs]
    t = time.perf_counter()
    for text in sub:
        model.model.encode([text], batch_size=1, normalize_embeddings=True,
                           show_progress_bar=False)
    one_by_one = len(sub) / (time.perf_counter() - t)
    return {"vectors": vecs, "docs_per_s": batched, "baseline_docs_per_s": one_by_one,
            "docs": len(texts), "baseline_docs": len(sub)}


def derived_vectors(real: np.ndarray, ids: np.ndarray, seed: int) -> np.ndarray:
    """Row ``id``'s vector: its real embedding when it has one, else e_a + 0.5 e_b + noise."""
    n_real = len(real)
    out = np.empty((len(ids), embed.DIM), np.float32)
    have = ids < n_real
    out[have] = real[ids[have]]
    rest = ids[~have]
    if len(rest):
        rng = np.random.default_rng(seed + int(rest[0]))
        a = real[rng.integers(0, n_real, len(rest))]
        b = real[rng.integers(0, n_real, len(rest))]
        noise = rng.standard_normal((len(rest), embed.DIM)).astype(np.float32) * (
            0.5 / np.sqrt(embed.DIM))
        v = a + 0.5 * b + noise
        out[~have] = v / np.linalg.norm(v, axis=1, keepdims=True)
    return out


def latencies(fn, items, warmup: int = 3) -> list[float]:
    for x in items[:warmup]:
        fn(x)
    out = []
    for x in items:
        t = time.perf_counter()
        fn(x)
        out.append((time.perf_counter() - t) * 1e3)
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rows", type=int, default=100_000)
    p.add_argument("--embed-docs", type=int, default=1000)
    p.add_argument("--baseline-docs", type=int, default=150)
    p.add_argument("--embed-all", action="store_true", help="real embeddings for every row")
    p.add_argument("--queries", type=int, default=200)
    p.add_argument("--workdir", default=None)
    p.add_argument("--json-out", default=None)
    args = p.parse_args(argv)
    os.environ.setdefault("LANCE_LOG", "error")
    work = Path(args.workdir or tempfile.mkdtemp(prefix="forensics_bench_"))
    root = work / "data"
    shutil.rmtree(root, ignore_errors=True)
    res: dict = {"rows": args.rows}

    t = time.perf_counter()
    ingest(Table.of(root), f"synthetic:{args.rows}", log=quiet)
    res["ingest_s"] = time.perf_counter() - t
    table = Table.of(root)
    ds = table.newest()
    print(f"table: {ds.count_rows()} rows, {len(ds.get_fragments())} fragments "
          f"({res['ingest_s']:.1f}s)", flush=True)

    t = time.perf_counter()
    model = embed.Embedder()
    res["model_load_s"] = time.perf_counter() - t
    n_real = args.rows if args.embed_all else args.embed_docs
    texts = ds.to_table(columns=["text"], filter=f"id < {n_real}").column("text").to_pylist()
    emb = bench_embedding(model, texts, args.baseline_docs)
    real = emb.pop("vectors")
    res["embedding"] = {**emb, "device": model.device, "max_tokens": model.spec.max_tokens,
                        "batch_size": model.batch_size}
    print(f"embedding ({model.device}, max_tokens {model.spec.max_tokens}): "
          f"{emb['docs_per_s']:.1f} docs/s batched vs {emb['baseline_docs_per_s']:.1f} docs/s one "
          f"at a time = {emb['docs_per_s'] / emb['baseline_docs_per_s']:.2f}x "
          f"(model load {res['model_load_s']:.1f}s)", flush=True)

    def compute(frag):
        ids = frag.to_table(columns=["id"]).column("id").to_numpy()
        vecs = derived_vectors(real, ids, seed=1)
        return [pa.RecordBatch.from_arrays([embed.to_arrow(vecs)],
                                           schema=pa.schema([embed.EMBEDDING]))]

    t = time.perf_counter()
    write_columns(table, [embed.EMBEDDING], compute, log=quiet)
    res["vector_column_write_s"] = time.perf_counter() - t

    t = time.perf_counter()
    fts.text_index(Table.of(root))
    res["fts_build_s"] = time.perf_counter() - t
    print(f"full-text index: {res['fts_build_s']:.1f}s", flush=True)
    rep = vindex.vector_index(Table.of(root))
    s = rep.settings
    res["vector_index"] = {"build_s": rep.build_s, "total_s": rep.duration_s, **s.to_dict()}
    print(f"vector index {s.index_type}: built in {rep.build_s:.1f}s ({s.num_partitions} "
          f"partitions), nprobes {s.nprobes}, refine {s.refine_factor}, recall@10 on the "
          f"table's own vectors {s.recall_at_10:.3f} (tuning {s.tuning})", flush=True)

    queries = make_queries(args.queries)
    t = time.perf_counter()
    qvecs = model.encode(queries)
    res["embed_query_ms"] = (time.perf_counter() - t) / len(queries) * 1e3
    ds = table.newest()
    searcher = Searcher(Table.of(root), Pin(ds.version, max_id(ds), None, None, "benchmark"), model)
    k = 10
    lat = {
        "vector_ann": latencies(lambda i: searcher.vector(qvecs[i], k), list(range(len(queries)))),
        "full_text": latencies(lambda q: searcher.text(q, k), queries),
    }
    exact_settings = searcher.settings
    searcher.settings = None  # flat scan: the exact baseline
    n_exact = min(len(queries), 100)
    lat["vector_exact"] = latencies(lambda i: searcher.vector(qvecs[i], k), list(range(n_exact)))
    exact_ids = vindex.knn_ids(ds, qvecs, k, None)
    searcher.settings = exact_settings
    ann_ids = vindex.knn_ids(ds, qvecs, k, exact_settings)
    recall = float(np.mean([len(set(a) & set(e)) / k for a, e in zip(ann_ids, exact_ids)]))

    def hybrid(i):
        vec = searcher.vector(qvecs[i], k * 4)
        txt = searcher.text(queries[i], k * 4)
        return sorted(rrf([[r for r, _ in vec], [r for r, _ in txt]]).items(),
                      key=lambda kv: -kv[1])[:k]

    lat["hybrid"] = latencies(hybrid, list(range(len(queries))))
    lat["hybrid_with_snippets"] = latencies(lambda q: searcher.search(q, k), queries[:50])
    res["latency_ms"] = {name: {"p50": pct(v, 50), "p95": pct(v, 95), "n": len(v)}
                         for name, v in lat.items()}
    res["recall_at_10_query_strings"] = recall
    print(f"\nquery latency over {ds.count_rows()} rows (ms; query embedding "
          f"{res['embed_query_ms']:.1f} ms/query not included):")
    for name, v in res["latency_ms"].items():
        print(f"  {name:22s} p50 {v['p50']:7.2f}  p95 {v['p95']:7.2f}  (n={v['n']})")
    exact_p50 = res["latency_ms"]["vector_exact"]["p50"]
    print(f"ANN vs exact scan: {exact_p50 / res['latency_ms']['vector_ann']['p50']:.1f}x faster "
          f"(p50); recall@10 on {len(queries)} query strings: {recall:.3f}")
    res["load_average"] = os.getloadavg()
    print(f"load average during the run: {res['load_average']}")
    if args.json_out:
        Path(args.json_out).write_text(json.dumps(res, indent=2, default=float))
    if not args.workdir:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
