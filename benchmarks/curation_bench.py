"""Curation benchmark: quality signals, near-duplicates and exact dedup on one synthetic table.

    python -m benchmarks.curation_bench --rows 100000

Builds a synthetic corpus (``synthetic.generate``) with planted near-duplicates (copies of a
document with a few words edited), ingests it, then times, on the same table in the same run:

- exact dedup (``dedup_flag``: whitespace-normalised md5, joined per fragment, written as
  ``is_dup``) against the bare DuckDB baseline ``SELECT md5(text), count(*) ... GROUP BY``;
- ``quality_signals`` (vectorised) against the per-document reference implementation on a
  sample (plain Python, the way the rules are usually written);
- ``near_dup`` (MinHash LSH, FineWeb settings), and its precision and recall against
  brute-force Jaccard similarity on a sample enriched with the planted pairs.
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
import tempfile
import time
from pathlib import Path

import duckdb
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from lance_assets.curation import quality_signals as quality
from lance_assets.table import Table
from lance_assets.table.producer import produce
from lance_assets.testing.curation_reference import (
    brute_force_pairs,
    plant_near_duplicates,
    precision_recall,
    reference_signals,
)


def lsh_only_clusters(texts: list[str], settings) -> list[int]:
    """FineWeb's behaviour on a sample: every pair sharing a band is a duplicate (no Jaccard
    confirmation); clusters by union-find."""
    from lance_assets.curation import minhash

    doc, sh = minhash.shingles(pa.array(texts), settings.ngram)
    keys = minhash.band_keys(minhash.signatures(doc, sh, len(texts), settings), settings)
    has = np.bincount(doc, minlength=len(texts)) > 0
    parent = list(range(len(texts)))

    def find(i):
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    first: dict[int, int] = {}
    for i in np.flatnonzero(has):
        for k in keys[i].tolist():
            j = first.setdefault(k, int(i))
            if j != i:
                a, b = find(i), find(j)
                parent[max(a, b)] = min(a, b)
    return [find(i) for i in range(len(texts))]


def build_corpus(root: Path, rows: int, planted: float, seed: int) -> tuple[list[str], list[tuple[int, int]]]:
    from lance_assets.ingest.raw_text import ingest
    from lance_assets.ingest.synthetic import SyntheticSpec, generate

    texts = generate(SyntheticSpec(rows=rows, seed=seed)).column("text").to_pylist()
    texts, pairs = plant_near_duplicates(texts, planted, seed=seed)
    # copies are spread through the corpus (not all at its end), later than their source
    rng = random.Random(seed)
    key = list(range(rows)) + [rng.uniform(src + 0.5, rows) for _, src in pairs]
    order = sorted(range(len(texts)), key=key.__getitem__)
    position = {old: new for new, old in enumerate(order)}
    texts = [texts[i] for i in order]
    pairs = [(position[c], position[s]) for c, s in pairs]
    src = root.parent / "source.parquet"
    pq.write_table(pa.table({"text": texts}), src)
    ingest(Table.of(root), str(src), log=lambda _m: None)
    return texts, pairs


def timed(fn, *args, **kwargs):
    start = time.perf_counter()
    out = fn(*args, **kwargs)
    return out, time.perf_counter() - start


def main(argv: list[str] | None = None) -> dict:
    from lance_assets.curation import dedup_flag, minhash
    from lance_assets.curation import near_dup as nd

    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rows", type=int, default=100_000, help="synthetic documents before planting")
    p.add_argument("--planted", type=float, default=0.05, help="share of documents given an edited copy")
    p.add_argument("--sample", type=int, default=1500, help="documents in the brute-force sample")
    p.add_argument("--reference-docs", type=int, default=2000, help="documents for the Python baseline")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--work", default=None, help="folder for the table (default: a temp folder, removed)")
    p.add_argument("--json", default=None, help="also write the results here")
    args = p.parse_args(argv)
    work = Path(args.work or tempfile.mkdtemp(prefix="curation_bench_"))
    root = work / "data"
    quiet = lambda _m: None  # noqa: E731
    results: dict = {"rows_before_planting": args.rows}
    try:
        (texts, pairs), t = timed(build_corpus, root, args.rows, args.planted, args.seed)
        n = len(texts)
        ds = Table.of(root).newest()
        results.update(rows=n, planted_pairs=len(pairs), fragments=len(ds.get_fragments()),
                       mean_chars=round(float(np.mean([len(x) for x in texts])), 1),
                       build_and_ingest_s=round(t, 2))
        print(f"corpus: {n} documents ({len(pairs)} planted near-duplicates), "
              f"{results['fragments']} fragments, mean {results['mean_chars']} chars")

        # exact dedup: the bare DuckDB GROUP BY md5(text) against dedup_flag, same table
        con = duckdb.connect()
        con.register("corpus", ds)
        (groups, dup_rows), t_base = timed(lambda: con.execute(
            "SELECT count(*), sum(c - 1) FROM (SELECT md5(text) AS h, count(*) AS c FROM corpus "
            "GROUP BY h)").fetchone())
        _, t_dedup = timed(produce, dedup_flag.PRODUCER, Table.of(root), log=quiet)
        flagged = Table.of(root).newest().count_rows(filter="is_dup")
        results["exact_dedup"] = {
            "duckdb_group_by_md5_docs_per_s": round(n / t_base), "duckdb_s": round(t_base, 3),
            "dedup_flag_docs_per_s": round(n / t_dedup), "dedup_flag_s": round(t_dedup, 3),
            "ratio_dedup_flag_vs_group_by": round(t_base / t_dedup, 3),
            "duplicates_group_by_md5": int(dup_rows), "duplicates_is_dup": flagged,
        }
        print(f"exact dedup: GROUP BY md5(text) {n / t_base:,.0f} docs/s; dedup_flag (normalise, "
              f"hash, join, write is_dup) {n / t_dedup:,.0f} docs/s = "
              f"{t_base / t_dedup:.2f}x the baseline's rate; duplicates {dup_rows} (raw md5) vs "
              f"{flagged} (whitespace-normalised)")

        # quality signals: vectorised column write vs the per-document Python reference
        report, t_q = timed(produce, quality.PRODUCER, Table.of(root), log=quiet)
        ref_docs = texts[: args.reference_docs]
        _, t_ref = timed(lambda: [reference_signals(x) for x in ref_docs])
        sample_batch, t_vec = timed(quality.compute_signals, pa.array(ref_docs))
        results["quality_signals"] = {
            "docs_per_s": round(n / t_q), "seconds": round(t_q, 2),
            "compute_only_docs_per_s": round(len(ref_docs) / t_vec),
            "python_reference_docs_per_s": round(len(ref_docs) / t_ref),
            "ratio_vs_python_reference": round(t_ref / t_vec, 1),
        }
        print(f"quality_signals: {n / t_q:,.0f} docs/s written ({len(quality.COLUMNS)} columns); "
              f"compute alone {len(ref_docs) / t_vec:,.0f} docs/s vs per-document Python "
              f"{len(ref_docs) / t_ref:,.0f} docs/s ({t_ref / t_vec:.1f}x)")

        # near-duplicates
        settings = minhash.MinHashSettings()
        report, t_nd = timed(produce, nd.PRODUCER, Table.of(root), nd.NearDupSettings(minhash=settings),
                             log=quiet)
        stats = report.stats
        table = Table.of(root).newest().to_table(
            columns=["id", "near_dup_cluster", "near_dup"]).sort_by("id")
        clusters = table.column("near_dup_cluster").to_pylist()
        results["near_dup"] = {
            "docs_per_s": round(n / t_nd), "seconds": round(t_nd, 2),
            "candidate_pairs": stats.candidate_pairs, "confirmed_pairs": stats.confirmed_pairs,
            "near_dup_rate": round(float(np.mean(
                table.column("near_dup").to_numpy(zero_copy_only=False))), 4),
        }
        print(f"near_dup: {n / t_nd:,.0f} docs/s; {stats.candidate_pairs} candidate pairs, "
              f"{stats.confirmed_pairs} confirmed; near_dup rate "
              f"{results['near_dup']['near_dup_rate']:.2%}")

        # precision / recall on a sample: planted pairs + random documents, brute-force Jaccard
        rng = np.random.default_rng(args.seed)
        half = args.sample // 2
        chosen = rng.choice(len(pairs), min(len(pairs), half // 2), replace=False)
        sample = {i for k in chosen for i in pairs[k]}
        sample |= set(rng.choice(n, args.sample - len(sample), replace=False).tolist())
        sample = sorted(sample)[: args.sample]
        doc, sh = minhash.shingles(pa.array([texts[i] for i in sample]), settings.ngram)
        sets = [set(s.tolist()) for s in minhash.per_doc_sets(doc, sh, len(sample))]
        truth, t_bf = timed(brute_force_pairs, sets, 0.8)
        ours = precision_recall([clusters[i] for i in sample], truth)
        fineweb = precision_recall(lsh_only_clusters([texts[i] for i in sample], settings), truth)
        results["near_dup"]["sample"] = {"documents": len(sample), "brute_force_s": round(t_bf, 2),
                                         "confirmed_jaccard_0.8": ours, "lsh_only": fineweb}
        print(f"sample of {len(sample)} documents, {ours['true_pairs']} pairs with Jaccard >= 0.8: "
              f"precision {ours['precision']:.3f}, recall {ours['recall']:.3f} "
              f"(LSH alone, as FineWeb: precision {fineweb['precision']:.3f}, recall "
              f"{fineweb['recall']:.3f})")

        # incremental: a new source unit of edited copies of old documents, matched against them
        from lance_assets.ingest.raw_text import ingest

        extra_rng = random.Random(args.seed + 1)
        sources = extra_rng.sample(range(n), max(1, n // 20))
        new_texts, new_pairs = plant_near_duplicates([texts[i] for i in sources], 1.0,
                                                     seed=args.seed + 1, max_edits=1, min_words=0)
        copies = [new_texts[c] for c, _ in new_pairs]
        extra = work / "extra.parquet"
        pq.write_table(pa.table({"text": copies}), extra)
        ingest(Table.of(root), str(extra), log=quiet)
        report, t_inc = timed(produce, nd.PRODUCER, Table.of(root),
                              nd.NearDupSettings(minhash=settings), log=quiet)
        stats2 = report.stats
        results["near_dup"]["incremental"] = {
            "new_docs": report.rows_written, "seconds": round(t_inc, 2),
            "docs_per_s": round(report.rows_written / t_inc),
            "joined_old_clusters": stats2.joined_old_clusters,
        }
        print(f"near_dup incremental: {report.rows_written} new documents against {n} old in "
              f"{t_inc:.2f} s ({report.rows_written / t_inc:,.0f} docs/s), "
              f"{stats2.joined_old_clusters} joined old clusters")
    finally:
        if not args.work:
            shutil.rmtree(work, ignore_errors=True)
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2))
    print(json.dumps(results, indent=2))
    return results


if __name__ == "__main__":
    main()
