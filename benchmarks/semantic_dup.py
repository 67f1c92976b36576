"""Semantic duplicates benchmark: recall and precision of ``semantic_dup`` with the real
all-MiniLM-L6-v2 model on planted rewordings, against ``near_dup`` on the same table, and the
cost per document at two sizes against ``near_dup``'s in the same run.

    LANCE_LOG=error python -m benchmarks.semantic_dup
    python -m benchmarks.semantic_dup --quality-only / --cost-only / --demo-only

- Quality: ``lance_assets/testing/semantic_planted.py`` sets (``--originals`` originals with
  ``--copies`` reworded copies each, as many distractors on the same topics), at two rewording
  strengths. The table gets `embedding`, `chunk_embeddings` (the real model on CPU), `near_dup`
  and `semantic_dup` (the defaults). Then the threshold sweep: the producer's own comparison
  (``semantic_dup.compare_batch``, the clusters of the run) on the chunk-mean vectors it uses, and on
  the first-chunk vectors (`embedding`, what NeMo's eps=0.01 is meant for) for contrast.
  Recall: planted copies flagged with their original as representative, among the copies
  ``near_dup`` does not flag. Precision: flagged rows that are planted copies.
- Cost: ``synthetic:ROWS`` tables (the demo corpus's generator) at ``--sizes``, chunk vectors
  from a stand-in embedder (the cost of ``semantic_dup`` does not depend on the model that made
  them); µs/document of the whole ``semantic_dup`` write (read `chunk_embeddings`, k-means,
  compare, write four columns) and of ``near_dup`` on the same table; then 10% new rows against
  the rest. The model's own cost is measured in the quality part (``chunk_embeddings`` and
  ``embeddings`` µs/document on CPU).
- Demo: the demo corpus (``synthetic:2000``) with the real model: the write's time and what it
  flags next to ``near_dup``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import tempfile
import time
from pathlib import Path

import lance
import numpy as np

from lance_assets import keys, paths
from lance_assets.curation import near_dup as nd
from lance_assets.curation import semantic_compare as cmp
from lance_assets.curation import semantic_dup as sd
from lance_assets.embeddings import chunk_embeddings as chunks
from lance_assets.embeddings import embeddings as embed
from lance_assets.embeddings.chunk_embeddings import vector_rows
from lance_assets.ingest.raw_text import ingest
from lance_assets.ingest.synthetic import SyntheticSpec, generate
from lance_assets.table import Table
from lance_assets.table.producer import produce
from lance_assets.testing.semantic_planted import SynonymBagEmbedder, planted_set

STRENGTHS = {  # drop share of sentences, share of synonym-able words replaced, share moved
    "mild": {"drop": 0.1, "synonyms": 0.4, "shuffle": 0.5},
    "heavy": {"drop": 0.2, "synonyms": 0.7, "shuffle": 0.6},
}
THRESHOLDS = (0.80, 0.85, 0.87, 0.88, 0.90, 0.92, 0.95, 0.99)
ALL_LANGUAGES = sd.SemanticDupSettings(languages=[])  # the planted sets have no `lang`


def quiet(_msg: str) -> None:
    pass


def write_jsonl(path: Path, texts: list[str]) -> None:
    path.write_text("".join(json.dumps({"text": t}) + "\n" for t in texts))


def scores(flags: np.ndarray, reps: np.ndarray, planted, missed_by_near_dup: set[int]) -> dict:
    copies = set(planted.copy_of)
    flagged = set(np.flatnonzero(flags).tolist())
    found = {c for c in missed_by_near_dup if flags[c] and reps[c] == planted.copy_of[c]}
    return {"recall": len(found) / len(missed_by_near_dup) if missed_by_near_dup else 1.0,
            "precision": len(flagged & copies) / len(flagged) if flagged else 1.0,
            "flagged": len(flagged)}


def quality(work: Path, originals: int, copies: int, seed: int, backend: str = "auto") -> None:
    print(f"\n## Quality: {originals} originals x {copies} copies + {originals} distractors, real "
          "model (CPU)")
    for name, reword in STRENGTHS.items():
        planted = planted_set(originals, copies, originals, seed=seed, **reword)
        root = work / f"planted-{name}"
        write_jsonl(work / f"{name}.jsonl", planted.texts)
        ingest(Table.of(root), str(work / f"{name}.jsonl"), rows_per_fragment=64, log=quiet)
        t = time.perf_counter()
        e = produce(embed.PRODUCER, Table.of(root), embed.EmbeddingsSettings(backend=backend), log=quiet)
        embed_s = time.perf_counter() - t
        t = time.perf_counter()
        c = produce(chunks.PRODUCER, Table.of(root), chunks.ChunkEmbeddingsSettings(backend=backend),
                    log=quiet)
        chunk_s = time.perf_counter() - t
        produce(nd.PRODUCER, Table.of(root), log=quiet)
        t = time.perf_counter()
        sd_report = produce(sd.PRODUCER, Table.of(root), ALL_LANGUAGES, log=quiet)
        stats = sd_report.stats
        sd_s = time.perf_counter() - t
        ds = lance.dataset(paths.table_uri(root))
        tbl = ds.to_table(columns=["id", "near_dup", "near_dup_cluster", keys.EMBEDDING,
                                   keys.CHUNK_EMBEDDINGS, *sd.COLUMNS]).sort_by("id")
        n = tbl.num_rows
        words = np.mean([len(x.split()) for x in planted.texts])
        near = np.asarray(tbl.column("near_dup").to_pylist())
        near_cluster = np.asarray(tbl.column("near_dup_cluster").to_pylist())
        missed = {cp for cp, o in planted.copy_of.items()
                  if not (near[cp] and near_cluster[cp] == near_cluster[o])}
        near_flagged = set(np.flatnonzero(near).tolist())
        n_chunks = c.chunks_embedded + c.chunks_reused
        print(f"\n### {name} rewording {reword}: {n} documents, {words:.0f} words and "
              f"{n_chunks / n:.2f} chunks per document on average")
        embed_s -= e.model_load_s
        chunk_s -= c.model_load_s
        print(f"embeddings: {embed_s / n * 1e6:,.0f} µs/doc ({e.rows_written} docs, model load "
              f"excluded); chunk_embeddings: {chunk_s / n * 1e6:,.0f} µs/doc ({c.chunks_embedded} chunks "
              f"embedded, {c.chunks_reused} copied from `embedding`); semantic_dup write: "
              f"{sd_s / n * 1e6:,.0f} µs/doc ({stats.clusters} cluster(s))")
        print(f"near_dup: flags {len(near_flagged & set(planted.copy_of))} of "
              f"{len(planted.copy_of)} copies (recall {1 - len(missed) / len(planted.copy_of):.3f}), "
              "precision " + (f"{len(near_flagged & set(planted.copy_of)) / len(near_flagged):.3f}"
                              if near_flagged else "n/a") +
              f" ({len(near_flagged)} flagged); semantic_dup is scored on the {len(missed)} "
              "copies near_dup misses")
        got = scores(np.asarray(tbl.column(sd.SEMANTIC_DUP.name).to_pylist()),
                     np.asarray(tbl.column(sd.SEMANTIC_REP.name).to_pylist()), planted, missed)
        print(f"semantic_dup as written (default threshold "
              f"{sd.SemanticDupSettings().threshold}): recall {got['recall']:.3f}, precision "
              f"{got['precision']:.3f} ({got['flagged']} flagged)")
        ids = tbl.column("id").to_numpy()
        cluster = np.asarray(tbl.column(sd.SEMANTIC_CLUSTER.name).to_pylist())
        mean_vecs, _ = cmp.document_vectors(tbl.column(keys.CHUNK_EMBEDDINGS))
        first = vector_rows(tbl.column(keys.EMBEDDING).combine_chunks())
        copy_cos = [float(mean_vecs[cp] @ mean_vecs[o]) for cp, o in planted.copy_of.items()]
        print(f"cosine copy-original, chunk mean: median {np.median(copy_cos):.3f}, p10 "
              f"{np.percentile(copy_cos, 10):.3f}; first chunk: median "
              f"{np.median([float(first[cp] @ first[o]) for cp, o in planted.copy_of.items()]):.3f}")
        src = [planted.copy_of.get(i, i) for i in range(n)]
        sims = mean_vecs @ mean_vecs.T
        other = [sims[i, j] for i in range(n) for j in range(i) if src[i] != src[j]]
        print(f"cosine of unrelated pairs (chunk mean): p99 {np.percentile(other, 99):.3f}, max "
              f"{np.max(other):.3f}")
        print("\n| threshold | recall (chunk mean) | precision (chunk mean) | recall (first chunk) "
              "| precision (first chunk) |\n|---|---|---|---|---|")
        for th in THRESHOLDS:
            row = []
            for vecs in (mean_vecs, first):
                dup, rep, _ = cmp.compare_batch(ids, vecs, cluster, th)
                s = scores(dup, rep, planted, missed)
                row += [f"{s['recall']:.3f}", f"{s['precision']:.3f}"]
            print(f"| {th:.2f} | " + " | ".join(row) + " |")


def cost(work: Path, sizes: list[int]) -> None:
    print("\n## Cost: synthetic corpus, chunk vectors from a stand-in embedder")
    print("\n| documents | clusters | semantic_dup µs/doc | near_dup µs/doc | ratio | "
          "incremental: 10% new, semantic_dup µs/new doc | near_dup µs/new doc |\n"
          "|---|---|---|---|---|---|---|")
    for rows in sizes:
        texts = generate(SyntheticSpec(rows=rows, seed=0)).column("text").to_pylist()
        cut = rows - rows // 10
        root = work / f"cost-{rows}"
        write_jsonl(work / f"cost-{rows}-a.jsonl", texts[:cut])
        write_jsonl(work / f"cost-{rows}-b.jsonl", texts[cut:])
        ingest(Table.of(root), str(work / f"cost-{rows}-a.jsonl"), rows_per_fragment=4096, log=quiet)
        produce(chunks.PRODUCER, Table.of(root),
                chunks.ChunkEmbeddingsSettings(embedder=SynonymBagEmbedder()), log=quiet)
        t = time.perf_counter()
        report = produce(sd.PRODUCER, Table.of(root), ALL_LANGUAGES, log=quiet)
        stats = report.stats
        sd_s = time.perf_counter() - t
        t = time.perf_counter()
        produce(nd.PRODUCER, Table.of(root), log=quiet)
        nd_s = time.perf_counter() - t
        ingest(Table.of(root), str(work / f"cost-{rows}-b.jsonl"), rows_per_fragment=4096, log=quiet)
        produce(chunks.PRODUCER, Table.of(root),
                chunks.ChunkEmbeddingsSettings(embedder=SynonymBagEmbedder()), log=quiet)
        t = time.perf_counter()
        produce(sd.PRODUCER, Table.of(root), ALL_LANGUAGES, log=quiet)
        sd_inc = time.perf_counter() - t
        t = time.perf_counter()
        produce(nd.PRODUCER, Table.of(root), log=quiet)
        nd_inc = time.perf_counter() - t
        new = rows - cut
        print(f"| {cut:,} | {stats.clusters} | {sd_s / cut * 1e6:,.0f} | {nd_s / cut * 1e6:,.0f} | "
              f"{sd_s / nd_s:.2f} | {sd_inc / new * 1e6:,.0f} | {nd_inc / new * 1e6:,.0f} |")


def demo(work: Path, rows: int) -> None:
    """The demo corpus (``synthetic:ROWS``, what ``make demo`` ingests) with the real model: what
    ``semantic_dup`` costs there and what it flags, next to ``near_dup``."""
    print(f"\n## The demo corpus (synthetic:{rows}), real model (CPU)")
    root = work / "demo"
    ingest(Table.of(root), f"synthetic:{rows}", log=quiet)
    produce(embed.PRODUCER, Table.of(root), log=quiet)
    produce(chunks.PRODUCER, Table.of(root), log=quiet)
    produce(nd.PRODUCER, Table.of(root), log=quiet)
    t = time.perf_counter()
    report = produce(sd.PRODUCER, Table.of(root), ALL_LANGUAGES, log=quiet)
    stats = report.stats
    sd_s = time.perf_counter() - t
    ds = lance.dataset(paths.table_uri(root))
    n = ds.count_rows()
    flagged = {c: ds.count_rows(filter=c) for c in ("near_dup", "semantic_dup")}
    only = ds.count_rows(filter="semantic_dup AND NOT near_dup")
    print(f"semantic_dup write: {sd_s:.2f} s for {n} documents ({sd_s / n * 1e6:,.0f} µs/doc, "
          f"{stats.clusters} cluster(s)); flagged: near_dup {flagged['near_dup']}, semantic_dup "
          f"{flagged['semantic_dup']}, of which {only} not by near_dup")
    tbl = ds.to_table(columns=["id", keys.CHUNK_EMBEDDINGS, sd.SEMANTIC_CLUSTER.name]).sort_by("id")
    vecs, _ = cmp.document_vectors(tbl.column(keys.CHUNK_EMBEDDINGS))
    shares = []
    for th in THRESHOLDS:
        dup, _, _ = cmp.compare_batch(tbl.column("id").to_numpy(), vecs,
                                     np.asarray(tbl.column(sd.SEMANTIC_CLUSTER.name).to_pylist()),
                                     th)
        shares.append(f"{th:.2f}: {dup.mean():.1%}")
    print("share flagged by threshold: " + ", ".join(shares))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--originals", type=int, default=48)
    ap.add_argument("--copies", type=int, default=2)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--sizes", type=lambda s: [int(x) for x in s.split(",")],
                    default=[5000, 50000])
    ap.add_argument("--demo-rows", type=int, default=2000)
    ap.add_argument("--quality-only", action="store_true")
    ap.add_argument("--demo-only", action="store_true")
    ap.add_argument("--cost-only", action="store_true")
    ap.add_argument("--backend", default="auto", help="the embeddings' backend (quality part)")
    args = ap.parse_args()
    print(f"machine: {platform.processor() or platform.machine()}, {os.cpu_count()} CPUs")
    work = Path(tempfile.mkdtemp(prefix="semantic-dup-bench-"))
    try:
        if args.demo_only:
            demo(work, args.demo_rows)
            return
        if not args.cost_only:
            quality(work, args.originals, args.copies, args.seed, args.backend)
        if not args.quality_only:
            cost(work, args.sizes)
        if not (args.quality_only or args.cost_only):
            demo(work, args.demo_rows)
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
