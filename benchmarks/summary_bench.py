"""What the public training-data summary (``python -m lance_assets summary``) costs for a run that
read 1 M documents, against a plain scan of the same columns.

    python -m benchmarks.summary_bench [--rows 1000000] [--read-share 0.9] [--rounds 3]

The table is written with pylance directly, shaped like a curated web corpus with short texts:
three sources (two file sets and a Hugging Face dataset), urls over 50,000 domains with
Zipf-distributed sizes, a crawl date, a language, ``n_tokens``, ``n_bytes``, ``is_dup``, and the
rules in force in its config. A run tagged at that version read ``--read-share`` of the rows
(a synthetic read record: one stored permutation, as the trainer writes it).

It prints, per round: the summary's wall and CPU seconds, its parts (the read records, the
rules evaluated on the version), and the same columns read by one plain ``to_table`` as the
baseline; then the ratio of the summary to that scan.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import tempfile
import time
from pathlib import Path

import lance
import numpy as np
import pyarrow as pa

from lance_assets import keys, paths
from lance_assets.curation import rules as rules_mod
from lance_assets.curation.rules import Curation
from lance_assets.forensics.summary import summarize
from lance_assets.table import Table
from lance_assets.table import read_record as records
from lance_assets.table import snapshots as snaps

DOMAINS = 50_000
SOURCES = ["file:/data/web/part-{}.parquet#fp.d", "file:/data/books/shelf.jsonl@0-99#fp.d",
           "hf:HuggingFaceFW/fineweb-edu:sample-10BT/train@0123abcd#d"]
RULES = {"exact_dup": "NOT is_dup", "not_tiny": "n_tokens >= 8"}


def build(root: Path, rows: int, read_share: float, seed: int = 0) -> int:
    rng = np.random.default_rng(seed)
    uri = paths.table_uri(root)
    per = 250_000
    for start in range(0, rows, per):
        n = min(per, rows - start)
        ids = np.arange(start, start + n, dtype=np.int64)
        src = rng.choice(3, size=n, p=[0.7, 0.1, 0.2])
        dom = np.minimum(rng.zipf(1.3, size=n), DOMAINS) - 1
        urls = np.char.add(np.char.add("https://www.site", dom.astype(str)), ".com/page")
        urls = np.where(src == 1, None, urls)
        day = rng.integers(0, 365 * 3, size=n)
        dates = (np.datetime64("2021-01-01") + day).astype(str)
        tokens = rng.integers(4, 400, size=n).astype(np.int32)
        batch = pa.table({
            "id": pa.array(ids), "doc_id": pa.nulls(n, pa.string()),
            "url": pa.array(urls, pa.string()),
            "source": pa.array(np.array(SOURCES, dtype=object)[src].tolist(), pa.string()),
            "source_part": pa.array(np.zeros(n, np.int32)),
            "dump": pa.nulls(n, pa.string()),
            "date": pa.array(np.where(src == 1, None, dates), pa.string()),
            "language": pa.array(np.array(["en", "fr", "de", "es"], dtype=object)[
                rng.choice(4, size=n, p=[0.7, 0.1, 0.1, 0.1])].tolist()),
            "text": pa.array(["a short document"] * n),
            keys.N_TOKENS: pa.array(tokens), keys.N_BYTES: pa.array(tokens * 4),
            keys.IS_DUP: pa.array(rng.random(n) < 0.05)})
        lance.write_dataset(batch, uri, mode="create" if start == 0 else "append",
                            enable_stable_row_ids=True, max_rows_per_file=per)
    table = Table.of(root)
    table.set_config(keys.CURATION_KEY, Curation(rules=RULES).to_dict())
    version = table.newest().version
    table.snapshots.hold("train-bench", version, owner="pretrained_model", kind=snaps.RUN)
    kept = table.newest().to_table(columns=["id"], filter=rules_mod.training_filter(table)) \
        .column(0).to_numpy()
    read = rng.permutation(kept)[:int(read_share * rows)]
    run = paths.run_dir(root, "bench")
    run.mkdir(parents=True)
    order = run / "permutations" / "epoch-0.lance"
    lance.write_dataset(pa.table({"row_id": pa.array(read.astype(np.uint64))}), str(order))
    records.write(run, table_version=version, step=1, epochs=[
        {"epoch": 0, "rows": str(order), "split_sizes": [len(read)], "positions": None}])
    (run / "summary.json").write_text(json.dumps({"table_version": version,
                                                  "table_tag": "train-bench"}))
    return len(read)


def timed(fn):
    wall, cpu = time.perf_counter(), time.process_time()
    out = fn()
    return out, time.perf_counter() - wall, time.process_time() - cpu


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--read-share", type=float, default=0.9)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="summary_bench_"))
    try:
        root = tmp / "data"
        _, build_s, _ = timed(lambda: build(root, args.rows, args.read_share))
        table = Table.of(root)
        ds = table.newest()
        print(f"table: {args.rows:,} rows, {len(ds.get_fragments())} fragments, built in "
              f"{build_s:.1f} s; cores: {os.cpu_count()}")
        cols = ["id", "source", "url", "date", "language", keys.N_TOKENS, keys.N_BYTES]
        walls, cpus, scans = [], [], []
        for r in range(args.rounds):
            _, scan_s, _ = timed(lambda: ds.to_table(columns=cols))
            read, read_s, read_cpu = timed(lambda: records.read_by([paths.run_dir(root, "bench")]))
            _, rules_s, rules_cpu = timed(lambda: (rules_mod.evaluate(ds, RULES),
                                                   rules_mod.token_hits(ds, RULES)))
            got, wall, cpu = timed(lambda: summarize(table, "bench"))
            size = got["general_information"]["training_data_size"]
            walls.append(wall)
            cpus.append(cpu)
            scans.append(scan_s)
            print(f"round {r + 1}: summary {wall:.2f} s wall, {cpu:.2f} s CPU "
                  f"({size['documents_read']:,} documents read, "
                  f"{got['data_sources']['crawled_domains']['domains']:,} domains); of it: read "
                  f"records {read_s:.2f} s ({read_cpu:.2f} s CPU), rules on the version "
                  f"{rules_s:.2f} s ({rules_cpu:.2f} s CPU); plain scan of the {len(cols)} "
                  f"columns {scan_s:.2f} s")
        med = statistics.median(walls)
        print(f"median summary {med:.2f} s wall, {statistics.median(cpus):.2f} s CPU; "
              f"{med / statistics.median(scans):.1f}x a plain scan of the columns it reads; "
              f"{args.rows / med:,.0f} rows/s")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
