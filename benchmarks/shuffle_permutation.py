"""What one training rank pays to build the loader's shuffle permutation at the seed's size.

    python -m benchmarks.shuffle_permutation --rows 2400000

``lancedb.streaming.StreamingDataset`` builds, in every rank, a permutation table of every row
that passes the training filter (a filtered scan of the table, then a seeded shuffle into
``num_splits`` splits). This builds a table of ``--rows`` rows with the columns the trainer's
filter and loader touch (``id``, ``n_tokens``, ``is_dup``, ``near_dup``, and a short
``input_ids``), then, in a fresh child process per repeat, one rank's ``StreamingDataset``
exactly as ``train.data.train_dataset`` makes it: seconds, and the child's peak RSS against a
child that only opens the table (the baseline, measured the same way in the same run).
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


def child(uri: str, build: bool) -> None:
    import time

    import lancedb
    from lancedb.streaming import StreamingDataset

    db = lancedb.connect(str(Path(uri).parent))
    table = db.open_table(Path(uri).stem)
    start = time.perf_counter()
    if build:
        ds = StreamingDataset(table, columns=["input_ids"], filter=FILTER, shuffle=True,
                              shuffle_seed=0, epoch=0, num_splits=8, rank=0, world_size=8,
                              pack_sequences=1024, eos_id=0, pad_id=1, blocks_per_epoch=1000)
        rows = ds._perm_table.count_rows()
    else:
        rows = table.count_rows()
    print(json.dumps({"seconds": time.perf_counter() - start, "rows": rows}))


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rows", type=int, default=2_400_000)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--child", choices=["open", "build"], help=argparse.SUPPRESS)
    p.add_argument("--uri", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child:
        child(args.uri, args.child == "build")
        return {}
    work = Path(tempfile.mkdtemp(prefix="shuffle_perm_"))
    try:
        uri = str(work / "corpus.lance")
        build_table(uri, args.rows)
        out: dict = {"rows": args.rows}
        for kind in ["open", "build"] * args.repeats:
            log = work / f"{kind}.log"
            m = run_measured(kind, [sys.executable, "-m", "benchmarks.shuffle_permutation",
                                    "--child", kind, "--uri", uri], log_path=str(log))
            seconds = json.loads(log.read_text().splitlines()[-1])["seconds"]
            best = out.setdefault(kind, {"seconds": 1e9, "peak_rss_mb": 1e9})
            best["seconds"] = min(best["seconds"], seconds)
            best["peak_rss_mb"] = min(best["peak_rss_mb"], m.peak_rss_mb)
        extra = out["build"]["peak_rss_mb"] - out["open"]["peak_rss_mb"]
        out["permutation_mb"] = round(extra, 1)
        print(f"{args.rows:,} rows: permutation built in {out['build']['seconds']:.2f} s per rank "
              f"(best of {args.repeats}); peak RSS {out['build']['peak_rss_mb']:.0f} MB against "
              f"{out['open']['peak_rss_mb']:.0f} MB for a rank that only opens the table: "
              f"+{extra:.0f} MB ({1e6 * extra / args.rows:.0f} bytes per row)")
        return out
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
