"""What one training rank pays for the loader's shuffle permutation: built in every rank (what
``StreamingDataset`` does on its own) against read from the run's stored one (what the trainer
does: ``train.data.shared_permutation``, built once per run and epoch by rank 0).

    python -m benchmarks.shuffle_permutation --rows 400000 1600000

``lancedb.streaming.StreamingDataset`` builds, in every rank, a permutation table of every row
that passes the training filter (a filtered scan of the table, then a seeded shuffle into
``num_splits`` splits). This builds a table of ``--rows`` rows with the columns the trainer's
filter and loader touch (``id``, ``n_tokens``, ``is_dup``, ``near_dup``, and a short
``input_ids``), then, in a fresh child process per repeat, one rank's ``StreamingDataset``
exactly as ``train.data.train_dataset`` makes it: seconds, and the child's peak RSS against a
child that only opens the table (the baseline, measured the same way in the same run).

Modes (one child process each): ``open`` (the baseline: the same imports, the table opened),
``build`` (the rank builds its own
permutation and reads its first ``READ_BLOCKS`` blocks), ``store`` (the one-off build and store
of the run's permutation, rank 0's extra cost) and ``shared`` (the rank checks the stored
permutation and reads the same first blocks from it). With several ``--rows`` it prints how the
per-rank extra memory grows with the corpus in each mode.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
from pathlib import Path

import numpy as np
import pyarrow as pa

from benchmarks.measured import run_measured

FILTER = "NOT is_dup AND NOT near_dup AND n_tokens > 0 AND id % 100 != 0"
NUM_SPLITS, WORLD, READ_BLOCKS = 8, 8, 64


def build_table(uri: str, rows: int) -> None:
    import lance

    rng = np.random.default_rng(0)
    step = 1 << 20
    for lo in range(0, rows, step):
        n = min(step, rows - lo)
        ids = np.arange(lo, lo + n, dtype=np.int64)
        tokens = pa.FixedSizeListArray.from_arrays(pa.array(rng.integers(0, 8000, 4 * n,
                                                                          dtype=np.int32)), 4)
        table = pa.table({
            "id": ids,
            "n_tokens": rng.integers(50, 3000, n).astype(np.int32),
            "is_dup": rng.random(n) < 0.02,
            "near_dup": rng.random(n) < 0.03,
            "input_ids": pa.ListArray.from_arrays(pa.array(np.arange(0, 4 * n + 1, 4, dtype=np.int32)),
                                                  tokens.values),
        })
        lance.write_dataset(table, uri, mode="append" if lo else "create", max_rows_per_file=4096,
                            max_rows_per_group=4096)


def child(uri: str, kind: str, store: str) -> None:
    import time

    import lance  # noqa: F401 - every mode pays the same imports; the baseline too
    import lancedb

    from lance_assets.train import data

    db = lancedb.connect(str(Path(uri).parent))
    table = db.open_table(Path(uri).stem)
    snap = data.TableSnapshot(table=table, version=table.version,
                              tokenizer={"name": "bench", "eos_id": 0, "pad_id": 1})
    key = data.PermutationKey(snap.version, FILTER, 0, 0, NUM_SPLITS)
    start = time.perf_counter()
    rows = table.count_rows()
    if kind == "store":
        rows = sum(data.build_permutation(snap, key, Path(store)).split_sizes)
    elif kind in ("build", "shared"):
        ds = data.train_dataset(snap, filter=FILTER, block_len=1024, blocks_per_epoch=1000 * NUM_SPLITS,
                                num_splits=NUM_SPLITS, rank=0, world_size=WORLD, seed=0, epoch=0,
                                permutations=Path(store) if kind == "shared" else None)
        for i, _ in enumerate(ds):
            if i + 1 == READ_BLOCKS:
                break
        rows = sum(ds._perm_table.split_sizes) if kind == "shared" else ds._perm_table.count_rows()
    print(json.dumps({"seconds": time.perf_counter() - start, "rows": rows}))


def measure(work: Path, rows: int, repeats: int) -> dict:
    uri = str(work / f"corpus{rows}.lance")
    store = str(work / f"run{rows}" / "permutations")
    build_table(uri, rows)
    out: dict = {"rows": rows}
    for kind in ["open", "build", "store", "shared"] * repeats:
        log = work / f"{kind}.log"
        m = run_measured(kind, [sys.executable, "-m", "benchmarks.shuffle_permutation",
                                "--child", kind, "--uri", uri, "--store", store], log_path=str(log))
        if m.returncode != 0:
            raise RuntimeError(f"{kind} child failed: {log.read_text()[-2000:]}")
        seconds = json.loads(log.read_text().splitlines()[-1])["seconds"]
        best = out.setdefault(kind, {"seconds": 1e9, "peak_rss_mb": 1e9})
        best["seconds"] = min(best["seconds"], seconds)
        best["peak_rss_mb"] = min(best["peak_rss_mb"], m.peak_rss_mb)
    for kind in ("build", "store", "shared"):
        out[kind]["extra_mb"] = round(out[kind]["peak_rss_mb"] - out["open"]["peak_rss_mb"], 1)
    b, s, st = out["build"], out["shared"], out["store"]
    print(f"{rows:,} rows, rank 0 of {WORLD} ({NUM_SPLITS} splits), first {READ_BLOCKS} blocks read, "
          f"best of {repeats}; baseline (open only) {out['open']['peak_rss_mb']:.0f} MB")
    print(f"  per-rank build : {b['seconds']:6.2f} s  +{b['extra_mb']:6.1f} MB")
    print(f"  shared read    : {s['seconds']:6.2f} s  +{s['extra_mb']:6.1f} MB  "
          f"({s['extra_mb'] / max(b['extra_mb'], 0.1):.2f}x the per-rank build's extra)")
    print(f"  one-off store  : {st['seconds']:6.2f} s  +{st['extra_mb']:6.1f} MB  (rank 0, once per "
          "run and epoch)")
    return out


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rows", type=int, nargs="+", default=[2_400_000])
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--child", choices=["open", "build", "store", "shared"], help=argparse.SUPPRESS)
    p.add_argument("--uri", help=argparse.SUPPRESS)
    p.add_argument("--store", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child:
        child(args.uri, args.child, args.store)
        return {}
    work = Path(tempfile.mkdtemp(prefix="shuffle_perm_"))
    try:
        results = {rows: measure(work, rows, args.repeats) for rows in args.rows}
        if len(results) > 1:
            lo, hi = results[min(results)], results[max(results)]
            grow = max(results) / min(results)
            for kind, label in (("build", "per-rank build"), ("shared", "shared read")):
                ratio = hi[kind]["extra_mb"] / max(lo[kind]["extra_mb"], 0.1)
                print(f"{label}: extra memory x{ratio:.2f} for x{grow:.0f} documents "
                      f"(+{lo[kind]['extra_mb']:.1f} MB -> +{hi[kind]['extra_mb']:.1f} MB)")
        return results
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
