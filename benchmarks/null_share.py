"""What the `null_share/<column>` metadata costs: `corpus.profile.null_counts` (one filtered
`count_rows` per column) against reading the same column into memory with `to_table`.

    python -m benchmarks.null_share [--rows 400000]

Builds a table shaped like the corpus's heaviest columns (`input_ids`: list<int32> of 50-400
tokens; `embedding`: 384 float32; `n_tokens`: int32), then times both per column (best of 3) and
prints MB/s of column data and the ratio.
"""

from __future__ import annotations

import argparse
import os
import platform
import tempfile
import time

import lance
import numpy as np
import pyarrow as pa

from lance_assets.curation.profile import null_counts


def build(path: str, rows: int) -> tuple[lance.LanceDataset, dict[str, int]]:
    rng = np.random.default_rng(0)
    lengths = rng.integers(50, 400, rows)
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)
    ids = pa.ListArray.from_arrays(pa.array(offsets),
                                   pa.array(rng.integers(0, 50_000, offsets[-1], dtype=np.int32)))
    vectors = pa.FixedSizeListArray.from_arrays(
        pa.array(rng.random(rows * 384, dtype=np.float32)), 384)
    # every 10th row has no tokens yet, as rows a writer has not reached
    valid = np.arange(rows) % 10 != 0
    ids = pa.ListArray.from_arrays(pa.array(offsets), ids.values, mask=pa.array(~np.r_[valid, True]))
    table = pa.table({"input_ids": ids, "embedding": vectors,
                      "n_tokens": pa.array(np.where(valid, lengths, 0).astype(np.int32), mask=~valid)})
    ds = lance.write_dataset(table, path, max_rows_per_file=50_000)
    column_bytes = {"input_ids": int(offsets[-1]) * 4, "embedding": rows * 384 * 4, "n_tokens": rows * 4}
    return ds, column_bytes


def best_of(fn, n: int = 3) -> float:
    times = []
    for _ in range(n):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=400_000)
    args = parser.parse_args()
    print(f"machine: {platform.machine()}, {os.cpu_count()} cores; load average "
          f"{os.getloadavg()[0]:.2f}; {args.rows:,} rows")
    with tempfile.TemporaryDirectory() as tmp:
        ds, column_bytes = build(f"{tmp}/t.lance", args.rows)
        print(f"{'column':10} {'MB':>8} {'null_counts s':>14} {'to_table s':>11} {'MB/s':>8} ratio")
        for column, size in column_bytes.items():
            counts = null_counts(ds, [column])
            expected = ds.to_table(columns=[column])[column].null_count
            assert counts[column] == expected, (column, counts, expected)
            ours = best_of(lambda c=column: null_counts(ds, [c]))
            baseline = best_of(lambda c=column: ds.to_table(columns=[c]))
            print(f"{column:10} {size / 1e6:8.0f} {ours:14.3f} {baseline:11.3f} "
                  f"{size / 1e6 / ours:8.0f} {ours / baseline:.2f}x")


if __name__ == "__main__":
    main()
