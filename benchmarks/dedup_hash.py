"""Exact dedup from a kept hash (``text_hash``) against hashing every text again in the driver.

    python -m benchmarks.dedup_hash --rows 50000 200000 [--ray]

For each size: ingest ``synthetic-web:N`` (FineWeb-shaped documents, ~4.6 KB mean) into two
copies, then on each, in child processes (one per arm, so each peak RSS is its own):

- **before** (the previous ``dedup_flag``): the driver hashes every text of the table (md5 of the
  normalised text), one sort finds the duplicate ids, per-fragment ``DupFlags`` write ``is_dup``;
- **after** (``dedup_flag`` now): ``text_hash`` written per fragment for rows lacking it, the
  duplicates by the map/reduce over the kept hashes, ``is_dup`` per fragment (local executor;
  ``--ray`` adds the second run on a local Ray with 2 buckets).

First run on the whole table, then a 10% increment (new documents, ``seed=1``) and a second run.
Printed per arm: seconds, docs/s (documents of the table / seconds), text bytes read (what
``LanceFragment.to_batches`` returned in ``text`` columns), the peak RSS growth of the driver
(``ru_maxrss`` after the run minus the RSS before it, modules imported; at these sizes mostly
Lance's scan buffers) and the driver's peak Python + numpy heap (``tracemalloc``, measured in a
second run of the arm on a copy of the table, so the timed run is not slowed by tracing).
"""

from __future__ import annotations

import argparse
import json
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil

from lance_assets.table import Table
from lance_assets.table.producer import produce


def quiet(_msg: str) -> None:
    pass


def count_text_bytes() -> dict:
    """Sum the bytes of every ``text`` column a fragment scan returns (in this process)."""
    import pyarrow.compute as pc
    from lance.fragment import LanceFragment

    seen = {"text_bytes": 0}
    real = LanceFragment.to_batches

    def to_batches(self, *args, **kwargs):
        for batch in real(self, *args, **kwargs):
            if "text" in batch.schema.names:
                seen["text_bytes"] += int(pc.sum(pc.binary_length(batch.column("text"))).as_py()
                                          or 0)
            yield batch

    LanceFragment.to_batches = to_batches
    return seen


def before(root: str) -> None:
    """The previous dedup_flag: every text hashed in the driver, each run."""
    import numpy as np

    from lance_assets.curation.dedup_flag import IS_DUP, DupFlags, text_hashes
    from lance_assets.table import Table
    from lance_assets.table.columns import write_columns

    table = Table.of(root)

    def run(ds):
        ids, hashes = [], []
        for frag in ds.get_fragments():
            for batch in frag.to_batches(columns=["id", "text"], batch_size=1024):
                ids.append(batch.column("id").to_numpy(zero_copy_only=False))
                hashes.append(text_hashes(batch.column("text")))
        ids, hashes = np.concatenate(ids), np.concatenate(hashes)
        order = np.lexsort((ids, hashes[:, 1], hashes[:, 0]))
        h = hashes[order]
        first = np.r_[True, (h[1:] != h[:-1]).any(axis=1)]
        dup_ids = np.sort(ids[order][~first])
        del ids, hashes, h, order
        return write_columns(table, [IS_DUP], DupFlags(dup_ids), pinned=ds, log=quiet)

    table.pinned(run)


def child(arm: str, root: str, trace: bool = False) -> None:
    import lance

    import lance_assets.curation.dedup_flag  # noqa: F401 - imports out of the RSS growth
    from lance_assets import paths

    rows = lance.dataset(paths.table_uri(root)).count_rows()
    seen = count_text_bytes()
    if arm == "after-ray":  # Ray's start and workers are not the driver's dedup work
        import ray

        from lance_assets.table.executor import runtime_env
        ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False,
                 runtime_env=runtime_env())
    if trace:
        import tracemalloc
        tracemalloc.start()
    rss0 = psutil.Process().memory_info().rss
    start = time.perf_counter()
    if arm == "before":
        before(root)
    else:
        from lance_assets.curation import dedup_flag
        produce(dedup_flag.PRODUCER, Table.of(root),
                dedup_flag.DedupSettings(buckets=2 if arm == "after-ray" else 0),
                executor="ray" if arm == "after-ray" else "local", log=quiet)
    seconds = time.perf_counter() - start
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    if trace:
        print(json.dumps({"heap_peak_mb": round(tracemalloc.get_traced_memory()[1] / 2**20, 2)}))
        return
    print(json.dumps({"arm": arm, "rows": rows, "seconds": round(seconds, 2),
                      "docs_per_s": round(rows / seconds), "text_bytes": seen["text_bytes"],
                      "peak_rss_growth_mb": round(max(0, peak - rss0) / 2**20, 1)}))


def measure(arm: str, root: Path) -> dict:
    def run(where: Path, *trace: str) -> dict:
        out = subprocess.run([sys.executable, "-m", "benchmarks.dedup_hash", "--child", arm,
                              str(where), *trace], check=True, capture_output=True, text=True)
        return json.loads(out.stdout.strip().splitlines()[-1])

    scratch = root.with_name(root.name + "-traced")
    shutil.copytree(root, scratch)
    try:
        heap = run(scratch, "--trace")
    finally:
        shutil.rmtree(scratch)
    return {**run(root), **heap}


def increment_file(rows: int, where: Path) -> Path:
    import pyarrow as pa
    import pyarrow.parquet as pq

    from lance_assets.ingest import synthetic_web as web

    spec = web.WebSpec(rows=rows, seed=1)
    parts = [web.generate_block(spec, b) for b in range(spec.n_blocks)]
    table = pa.concat_tables(parts).slice(0, rows)
    path = where / "increment" / "part.parquet"
    path.parent.mkdir(parents=True)
    pq.write_table(table.select(["text"]), path, row_group_size=1024)
    return path


def bench(rows: int, ray_arm: bool, work: Path) -> dict:
    from lance_assets.ingest.raw_text import ingest

    old, new = work / f"before-{rows}", work / f"after-{rows}"
    start = time.perf_counter()
    ingest(Table.of(old), f"synthetic-web:{rows}", log=quiet)
    ingest_s = time.perf_counter() - start
    shutil.copytree(old, new)
    result = {"rows": rows, "ingest_s": round(ingest_s, 1),
              "first": {"before": measure("before", old), "after": measure("after", new)}}
    inc = increment_file(rows // 10, work / f"inc-{rows}")
    for root in (old, new):
        ingest(Table.of(root), str(inc), log=quiet)
    ray_copy = work / f"after-ray-{rows}"
    if ray_arm:
        shutil.copytree(new, ray_copy)
    result["second"] = {"before": measure("before", old), "after": measure("after", new)}
    if ray_arm:
        result["second"]["after-ray"] = measure("after-ray", ray_copy)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", type=int, nargs="+", default=[50_000, 200_000])
    parser.add_argument("--ray", action="store_true", help="add a second run on a local Ray")
    parser.add_argument("--child", nargs=2, metavar=("ARM", "ROOT"), help=argparse.SUPPRESS)
    parser.add_argument("--trace", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(*args.child, trace=args.trace)
        return
    print(f"machine: {psutil.cpu_count()} CPUs, {psutil.virtual_memory().total / 2**30:.0f} GiB")
    for rows in args.rows:
        with tempfile.TemporaryDirectory(prefix="dedup-hash-") as tmp:
            r = bench(rows, args.ray, Path(tmp))
        print(f"\n{rows:,} documents (ingest {r['ingest_s']} s)")
        for run in ("first", "second"):
            b = r[run]["before"]
            for arm, m in r[run].items():
                print(f"  {run:6s} {arm:9s}: {m['seconds']:7.2f} s  {m['docs_per_s']:>9,} docs/s  "
                      f"text read {m['text_bytes'] / 2**20:8.1f} MiB  "
                      f"driver peak RSS +{m['peak_rss_growth_mb']:6.1f} MiB, "
                      f"heap {m['heap_peak_mb']:7.2f} MiB  "
                      f"speed-up x{b['seconds'] / m['seconds']:.2f}")
        print(json.dumps(r))


if __name__ == "__main__":
    main()
