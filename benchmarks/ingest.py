"""Ingest throughput and memory: `raw_text`'s ingest against a plain pyarrow read + Lance write.

    python -m benchmarks.ingest [--gb 1.0] [--scale 4] [--workdir /tmp/ingest-bench]

Writes a FineWeb-shaped parquet corpus holding GB gigabytes of text (synthetic documents, each
copy made unique), then, each in a fresh subprocess so peak RSS is its own:
- baseline: ``pq.ParquetFile.iter_batches`` straight into ``lance.write_dataset`` (no mapping,
  no validation, no watermark, one commit per file);
- ingest: ``lance_assets.ingest.raw_text.ingest`` on the same folder;
- ingest again on a corpus ``--scale`` times larger, to show peak RSS does not grow with size.
Prints MB/s, rows/s, peak RSS and the ratios.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

FILE_BYTES = 128 << 20  # text bytes per parquet file
ROW_GROUP_ROWS = 8192


def write_corpus(folder: Path, gb: float) -> tuple[int, int]:
    """(rows, text bytes) of a corpus of ``gb`` GB of text in ~128 MB parquet files."""
    from lance_assets.ingest.synthetic import SyntheticSpec, generate

    folder.mkdir(parents=True, exist_ok=True)
    base = generate(SyntheticSpec(rows=20_000, seed=11, dup_fraction=0.0))
    texts = base.column("text")
    base_bytes = pc.sum(pc.binary_length(texts)).as_py()
    target = int(gb * (1 << 30))
    rows = written = copy = 0
    file_idx = 0
    batch: list[pa.Table] = []
    batch_bytes = 0
    while written < target:
        suffix = pa.scalar(f"\n\n(copy {copy})")
        unique = pc.binary_join_element_wise(texts, pa.array([suffix.as_py()] * len(texts)), "")
        table = pa.table({
            "text": unique,
            "id": pc.binary_join_element_wise(base.column("doc_id"),
                                              pa.array([f"-{copy}"] * len(texts)), ""),
            "url": base.column("url"), "score": base.column("score"),
            "dump": pa.array(["CC-MAIN-2024-10"] * len(texts)),
        })
        batch.append(table)
        batch_bytes += base_bytes
        rows += len(texts)
        written += base_bytes
        copy += 1
        if batch_bytes >= FILE_BYTES or written >= target:
            pq.write_table(pa.concat_tables(batch), folder / f"{file_idx:05d}.parquet",
                           row_group_size=ROW_GROUP_ROWS)
            file_idx += 1
            batch, batch_bytes = [], 0
    return rows, written


BASELINE = """
import sys, glob, lance, pyarrow as pa, pyarrow.parquet as pq
folder, uri = sys.argv[1:3]
for i, path in enumerate(sorted(glob.glob(folder + "/*.parquet"))):
    pf = pq.ParquetFile(path)
    reader = pa.RecordBatchReader.from_batches(pf.schema_arrow, pf.iter_batches(batch_size=1024))
    lance.write_dataset(reader, uri, mode="append" if i else "create", max_rows_per_file=4096)
"""

OURS = """
import sys
from lance_assets.ingest.raw_text import ingest
from lance_assets.table import Table
report = ingest(Table.of(sys.argv[2]), sys.argv[1], log=lambda m: None)
assert not report.files_failed, report.files_failed
"""


def run_measured(code: str, *args: str) -> dict:
    """Wall time and peak RSS (MB) of ``code`` run in a fresh interpreter."""
    env = {**os.environ, "LANCE_LOG": "error"}
    start = time.perf_counter()
    wrapper = (code + "\nimport resource, json, sys\n"
               "print(json.dumps({'rss_mb': resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}))")
    out = subprocess.run([sys.executable, "-c", wrapper, *args], env=env, check=True,
                         capture_output=True, text=True)
    return {"seconds": time.perf_counter() - start, **json.loads(out.stdout.strip().splitlines()[-1])}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--gb", type=float, default=1.0, help="GB of text in the 1x corpus")
    p.add_argument("--scale", type=int, default=4, help="size of the large corpus, in 1x units")
    p.add_argument("--workdir", default="/tmp/lance_assets-ingest-bench")
    p.add_argument("--keep", action="store_true", help="keep the generated files")
    args = p.parse_args(argv)
    work = Path(args.workdir)
    shutil.rmtree(work, ignore_errors=True)
    t0 = time.perf_counter()
    rows1, bytes1 = write_corpus(work / "x1", args.gb)
    rows4, bytes4 = write_corpus(work / f"x{args.scale}", args.gb * args.scale)
    print(f"# corpus written in {time.perf_counter() - t0:.0f}s: 1x = {rows1:,} rows, "
          f"{bytes1 / 1e9:.2f} GB text; {args.scale}x = {rows4:,} rows, {bytes4 / 1e9:.2f} GB text")
    print(f"# {platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}")
    base = run_measured(BASELINE, str(work / "x1"), str(work / "base.lance"))
    ours = run_measured(OURS, str(work / "x1"), str(work / "ours1"))
    big = run_measured(OURS, str(work / f"x{args.scale}"), str(work / "ours4"))
    print("| arm | corpus | rows/s | MB/s (text) | peak RSS MB |")
    print("|---|---|---|---|---|")
    for name, r, rows, nbytes, size in [
        ("pyarrow read + Lance write", base, rows1, bytes1, "1x"),
        ("ingest (raw_text)", ours, rows1, bytes1, "1x"),
        ("ingest (raw_text)", big, rows4, bytes4, f"{args.scale}x")]:
        print(f"| {name} | {size} | {rows / r['seconds']:,.0f} | {nbytes / 1e6 / r['seconds']:,.1f} | "
              f"{r['rss_mb']:,.0f} |")
    print(f"\nthroughput ratio ingest / baseline (1x): {base['seconds'] / ours['seconds']:.2f}")
    print(f"peak RSS ratio {args.scale}x / 1x: {big['rss_mb'] / ours['rss_mb']:.2f}")
    if not args.keep:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
