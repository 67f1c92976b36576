"""Every column stage at growing corpus sizes, and side by side with datatrove, rensa and DuckDB.

    python -m benchmarks.scale --sizes 100000 400000            # add --large for 1,600,000
    python -m benchmarks.scale --sizes 100000 --peers --peer-rows 20000

Corpus: the FineWeb-shaped ``synthetic-web:N`` source (log-normal lengths, mean ~4.6 K
characters; planted exact, near and partial copies). Each stage runs alone, in a child process
of this one, on the table the stages before it wrote: ingest, ``dedup_flag``,
``quality_signals``, ``near_dup``, ``token_ids`` (cl100k_base). For each: wall and CPU seconds
(``os.wait4``), peak RSS, CPU microseconds per document, and the growth of that cost from the
smallest size to the largest (linear = 1.0).

``--peers`` (on a table of ``--peer-rows`` documents): ``near_dup`` against rensa (Rust MinHash
+ LSH bulk APIs, no Jaccard check) and HuggingFace datatrove's 4-stage MinHash pipeline, each
in its own environment (``scripts/peers_venv.sh``; an arm whose environment is missing is
skipped, saying so); ``dedup_flag`` against DuckDB's normalise + md5 + ``min(id) OVER
(PARTITION BY hash)`` on the same Lance table, whose ``is_dup`` must be equal. Near-duplicate
arms are scored against the planted ground truth (``synthetic_web.planted``): a planted copy
is a true duplicate when the exact Jaccard similarity of its word 5-grams to its original is
>= 0.8 (exact copies always are); recall is the share of those the arm flags, precision the
share of flagged documents that belong to a true pair (the copy, or its original for arms
that flag both).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
from pathlib import Path

import numpy as np

from benchmarks.measured import run_measured
from lance_assets.table import Table
from lance_assets.table.producer import produce

REPO = Path(__file__).resolve().parent.parent
STAGES = ["ingest", "dedup_flag", "quality_signals", "near_dup", "token_ids"]
PEER_VENVS = {"rensa": REPO / ".venv-rensa", "datatrove": REPO / ".venv-datatrove"}


def run_stage(stage: str, root: str, rows: int) -> None:
    """The body of one child process: one library call."""
    quiet = lambda _m: None  # noqa: E731
    if stage == "ingest":
        from lance_assets.ingest.raw_text import ingest
        ingest(Table.of(root), f"synthetic-web:{rows}", log=quiet)
    elif stage == "dedup_flag":
        from lance_assets.curation import dedup_flag
        produce(dedup_flag.PRODUCER, Table.of(root), log=quiet)
    elif stage == "quality_signals":
        from lance_assets.curation import quality_signals
        produce(quality_signals.PRODUCER, Table.of(root), log=quiet)
    elif stage == "near_dup":
        from lance_assets.curation import near_dup
        produce(near_dup.PRODUCER, Table.of(root), log=quiet)
    elif stage == "token_ids":
        from lance_assets.tokens import token_ids
        produce(token_ids.PRODUCER, Table.of(root), token_ids.TokenIdsSettings(tokenizer="cl100k_base"),
                log=quiet)
    elif stage == "duckdb_dedup":
        duckdb_dedup(root)
    else:
        raise SystemExit(f"unknown stage {stage!r}")


def duckdb_dedup(root: str) -> None:
    """The DuckDB baseline: ``is_dup`` by normalise + md5 + first id per hash, on the table."""
    import duckdb

    from lance_assets.curation.dedup_flag import NORMALISED_HASH_SQL
    from lance_assets.table import Table

    con = duckdb.connect()
    con.register("corpus", Table.of(root).newest())
    out = con.sql(f"SELECT id, id > min(id) OVER (PARTITION BY h) AS is_dup FROM "
                  f"(SELECT id, {NORMALISED_HASH_SQL} AS h FROM corpus) ORDER BY id").to_arrow_table()
    np.save(Path(root) / "duckdb_is_dup.npy", out.column("is_dup").to_numpy(zero_copy_only=False))


def child(stage: str, root: Path, rows: int, python: str = sys.executable):
    return run_measured(stage, [python, "-m", "benchmarks.scale", "--stage", stage,
                                "--root", str(root), "--rows", str(rows)],
                        env={**os.environ, "LANCE_LOG": "error", "LANCE_ASSETS_PROGRESS": "0"},
                        cwd=str(REPO))


def scaling(sizes: list[int], work: Path) -> dict:
    results: dict = {}
    for n in sizes:
        root = work / f"n{n}"
        shutil.rmtree(root, ignore_errors=True)
        for stage in STAGES:
            m = child(stage, root, n)
            if m.returncode != 0:
                raise SystemExit(f"{stage} at {n:,} documents failed (exit {m.returncode})")
            results.setdefault(stage, {})[n] = m.to_dict()
            print(f"{stage:>16} {n:>10,} docs: {m.wall_s:8.1f} s wall {m.cpu_s:8.1f} s CPU "
                  f"{1e6 * m.cpu_s / n:8.1f} us CPU/doc, peak RSS {m.peak_rss_mb:7.0f} MB",
                  flush=True)
        shutil.rmtree(root, ignore_errors=True)
    lo, hi = min(sizes), max(sizes)
    print(f"\nper-document cost growth, {hi:,} / {lo:,} documents (1.0 = linear):")
    for stage, by_n in results.items():
        cpu = (by_n[hi]["cpu_s"] / hi) / (by_n[lo]["cpu_s"] / lo)
        wall = (by_n[hi]["wall_s"] / hi) / (by_n[lo]["wall_s"] / lo)
        by_n["growth_cpu"], by_n["growth_wall"] = round(cpu, 3), round(wall, 3)
        print(f"{stage:>16}: CPU {cpu:.2f}x, wall {wall:.2f}x, peak RSS "
              f"{by_n[lo]['peak_rss_mb']:.0f} -> {by_n[hi]['peak_rss_mb']:.0f} MB")
    return results


def jaccard_truth(texts: list[str], kind: np.ndarray, source: np.ndarray) -> np.ndarray:
    """True for each planted copy whose 5-gram Jaccard to its original is >= 0.8."""
    import pyarrow as pa

    from lance_assets.curation import minhash
    from lance_assets.ingest import synthetic_web as sw

    copies = np.flatnonzero(kind != sw.ORIGINAL)
    truth = np.zeros(len(kind), dtype=bool)
    pair_texts = [texts[i] for i in copies] + [texts[int(source[i])] for i in copies]
    doc, sh = minhash.shingles(pa.array(pair_texts), 5)
    sets = minhash.per_doc_sets(doc, sh, len(pair_texts))
    for k, i in enumerate(copies):
        truth[i] = minhash.jaccard(sets[k], sets[len(copies) + k]) >= 0.8
    return truth


def score(flagged: np.ndarray, truth: np.ndarray, source: np.ndarray) -> dict:
    """Recall on true copies; precision: flagged documents that are a true copy or the
    original of one (arms that flag both members of a pair are not penalised for it)."""
    members = truth.copy()
    members[source[truth]] = True
    tp = int((flagged & truth).sum())
    return {"flagged": int(flagged.sum()), "true_copies": int(truth.sum()),
            "recall": round(tp / max(int(truth.sum()), 1), 4),
            "precision": round(int((flagged & members).sum()) / max(int(flagged.sum()), 1), 4)}


def peers(rows: int, work: Path, skip: list[str] = ()) -> dict:
    from lance_assets.ingest import synthetic_web as sw
    from lance_assets.table import Table

    root = work / "peers"
    shutil.rmtree(root, ignore_errors=True)
    if child("ingest", root, rows).returncode:
        raise SystemExit("ingest failed")
    table = Table.of(root).newest().to_table(columns=["id", "text"]).sort_by("id")
    texts = table.column("text").to_pylist()
    export = work / "peer_texts.parquet"  # the peers' input (not timed): the same documents
    import pyarrow as pa
    import pyarrow.parquet as pq
    pq.write_table(pa.table({"id": pa.array([str(i) for i in table.column("id").to_pylist()]),
                             "text": table.column("text")}), export)
    plan = sw.planted(sw.WebSpec(rows=rows))
    truth = jaccard_truth(texts, plan.kind, plan.source)
    out: dict = {"rows": rows, "planted": {k: int((plan.kind == v).sum()) for k, v in
                                           [("exact", sw.EXACT), ("respaced", sw.RESPACED_EXACT),
                                            ("near", sw.NEAR), ("partial", sw.PARTIAL)]},
                 "true_copies": int(truth.sum())}
    arms: dict = {}
    m = child("near_dup", root, rows)
    got = Table.of(root).newest().to_table(columns=["id", "near_dup"]).sort_by("id")
    arms["near_dup (ours)"] = {**m.to_dict(), **score(
        got.column("near_dup").to_numpy(zero_copy_only=False), truth, plan.source)}
    for name, venv in PEER_VENVS.items():
        if name in skip:
            continue
        python = venv / "bin" / "python"
        if not python.exists():
            print(f"{name}: skipped, no environment at {venv} (run scripts/peers_venv.sh {name})")
            arms[name] = {"skipped": f"no environment at {venv}"}
            continue
        result = work / f"{name}.npy"
        arm = REPO / "benchmarks" / "peers" / f"{name}_arm.py"
        cmd = [str(python), str(arm), str(export)] + (
            [str(work / "datatrove_work"), str(result)] if name == "datatrove" else [str(result)])
        shutil.rmtree(work / "datatrove_work", ignore_errors=True)
        m = run_measured(name, cmd, cwd=str(work))
        if m.returncode != 0:
            arms[name] = {"failed": m.returncode}
            print(f"{name}: failed (exit {m.returncode})")
            continue
        res = np.load(result)
        flags = res if res.dtype == bool else np.isin(np.arange(rows), res)
        arms[name] = {**m.to_dict(), **score(flags, truth, plan.source)}
    # exact dedup: ours against DuckDB's window, same table
    m_dedup = child("dedup_flag", root, rows)
    m_duck = child("duckdb_dedup", root, rows)
    ours = Table.of(root).newest().to_table(columns=["id", "is_dup"]).sort_by("id")
    theirs = np.load(root / "duckdb_is_dup.npy")
    equal = bool(np.array_equal(ours.column("is_dup").to_numpy(zero_copy_only=False), theirs))
    arms["dedup_flag (ours)"] = {**m_dedup.to_dict(), "is_dup": int(theirs.sum()),
                                 "equal_to_duckdb": equal}
    arms["duckdb normalise+md5+window"] = m_duck.to_dict()
    out["arms"] = arms
    base = arms["near_dup (ours)"]
    print(f"\nside by side, {rows:,} FineWeb-shaped documents ({out['true_copies']:,} true copies "
          f"planted; {out['planted']}):")
    print(f"{'arm':>32} {'wall s':>8} {'CPU s':>8} {'docs/CPU-s':>11} {'ours / arm':>10} "
          f"{'flagged':>8} {'recall':>7} {'precision':>9}")
    for name, a in arms.items():
        if "cpu_s" not in a:
            print(f"{name:>32} {json.dumps(a)}")
            continue
        rate = rows / a["cpu_s"]
        ref = base if "dedup" not in name and "duckdb" not in name else arms["dedup_flag (ours)"]
        ratio = (rows / ref["cpu_s"]) / rate
        a["docs_per_cpu_s"], a["ours_over_arm_per_cpu_s"] = round(rate), round(ratio, 3)
        a["ours_over_arm_wall"] = round(a["wall_s"] / ref["wall_s"], 3)
        print(f"{name:>32} {a['wall_s']:8.1f} {a['cpu_s']:8.1f} {rate:11,.0f} {ratio:10.2f} "
              f"{a.get('flagged', a.get('is_dup', '')):>8} {a.get('recall', ''):>7} "
              f"{a.get('precision', ''):>9}")
    print(f"dedup_flag is_dup equal to DuckDB's: {equal}")
    shutil.rmtree(root, ignore_errors=True)
    return out


def main(argv: list[str] | None = None) -> dict | None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--sizes", type=int, nargs="*", default=[100_000, 400_000])
    p.add_argument("--large", action="store_true", help="add 1,600,000 documents")
    p.add_argument("--peers", action="store_true", help="the side-by-side arms")
    p.add_argument("--peer-rows", type=int, default=20_000)
    p.add_argument("--skip", nargs="*", default=[], choices=sorted(PEER_VENVS),
                   help="peer arms to leave out (datatrove takes ~8 ms per document)")
    p.add_argument("--no-scaling", action="store_true", help="only the side-by-side arms")
    p.add_argument("--work", default=None, help="folder for the tables (default: a temp folder)")
    p.add_argument("--json", default=None, help="also write the results here")
    p.add_argument("--stage", help=argparse.SUPPRESS)
    p.add_argument("--root", help=argparse.SUPPRESS)
    p.add_argument("--rows", type=int, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.stage:
        run_stage(args.stage, args.root, args.rows)
        return None
    work = Path(args.work or tempfile.mkdtemp(prefix="scale_"))
    work.mkdir(parents=True, exist_ok=True)
    results: dict = {"load_avg_at_start": os.getloadavg()}
    try:
        if not args.no_scaling:
            sizes = sorted(set(args.sizes + ([1_600_000] if args.large else [])))
            results["scaling"] = scaling(sizes, work)
        if args.peers:
            results["peers"] = peers(args.peer_rows, work, args.skip)
    finally:
        if not args.work:
            shutil.rmtree(work, ignore_errors=True)
    results["load_avg_at_end"] = os.getloadavg()
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))
    return results


if __name__ == "__main__":
    main()
