"""What the table's lifetime guarantees cost: fenced ingest commits and write-marker checks.

    python -m benchmarks.fenced_commits [--fragments 2000] [--repeat 5] [--workdir /tmp/fenced]

On a table of ``--fragments`` fragments (100 rows each, a marker column written on all):
- commit of one new fragment as a plain ``Append`` (the baseline, unfenced) against the
  ``Merge`` that lists every fragment read (what ingest commits now);
- finding the fragments with unwritten rows: by data-file field lists (metadata only, the old
  rule, which a compaction fools) against the write markers (metadata where it decides, the
  marker's values where a compaction merged it with other columns), before and after a
  compaction.
Prints the median seconds of each and the ratios.
"""

from __future__ import annotations

import argparse
import platform
import shutil
import statistics
import time
from pathlib import Path

import lance
import pyarrow as pa

from lance_assets.table import Table


def build(table: Table, fragments: int) -> None:
    from lance_assets.table.columns import write_columns

    rows = 100
    data = pa.table({"id": pa.array(range(fragments * rows), pa.int64()),
                     "text": pa.array([f"document {i}" for i in range(fragments * rows)])})
    table.create(data.schema)  # stable row ids, as the corpus table
    new = table.write_fragments(data, data.schema, max_rows_per_file=rows)
    table.commit("build", lambda ds: table.commit_operation(lance.LanceOperation.Append(new),
                                                            ds.version))
    flag = pa.field("flag", pa.bool_())

    def compute(frag):
        yield pa.RecordBatch.from_arrays([pa.array([True] * frag.physical_rows)], [flag.name])

    write_columns(table, [flag], compute, fragments_per_commit=500, log=lambda _: None)


def median_s(fn, repeat: int) -> float:
    times = []
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--fragments", type=int, default=2000)
    p.add_argument("--repeat", type=int, default=5)
    p.add_argument("--workdir", default="/tmp/fenced-commits-bench")
    args = p.parse_args()
    work = Path(args.workdir)
    shutil.rmtree(work, ignore_errors=True)
    table = Table.of(work)
    t = time.perf_counter()
    build(table, args.fragments)
    print(f"{platform.node()} {platform.machine()}, {args.fragments} fragments built in "
          f"{time.perf_counter() - t:.1f} s")

    def one_fragment():
        data = pa.table({"id": pa.array([0], pa.int64()), "text": pa.array(["x"])})
        return table.write_fragments(data, data.schema)

    def append():
        ds = table.newest()
        table.commit_operation(lance.LanceOperation.Append(one_fragment()), ds.version)

    def merge():
        ds = table.newest()
        op = lance.LanceOperation.Merge([f.metadata for f in ds.get_fragments()] + one_fragment(),
                                        ds.lance_schema)
        table.commit_operation(op, ds.version)

    from lance_assets.table import leaf_field_ids
    from lance_assets.table.columns import fragments_missing, fragments_without_fields

    def by_files():
        ds = table.newest()
        return fragments_without_fields(ds.get_fragments(), leaf_field_ids(ds, "flag"))

    def by_marker():
        return fragments_missing(table.newest(), ["flag"])

    a, m = median_s(append, args.repeat), median_s(merge, args.repeat)
    print(f"commit one fragment: Append {a * 1000:.1f} ms, fenced Merge {m * 1000:.1f} ms; "
          f"Merge / Append {m / a:.2f}")
    f, k = median_s(by_files, args.repeat), median_s(by_marker, args.repeat)
    print(f"find unwritten fragments: by data files {f * 1000:.1f} ms, by write marker "
          f"{k * 1000:.1f} ms; marker / files {k / f:.2f} "
          f"({table.newest().count_rows():,} rows)")
    # after a compaction the markers sit in merged files: their values are read
    table.commit("compact", lambda ds: ds.optimize.compact_files(target_rows_per_fragment=1000))
    f, k = median_s(by_files, args.repeat), median_s(by_marker, args.repeat)
    print(f"after a compaction ({len(table.newest().get_fragments())} fragments): by data "
          f"files {f * 1000:.1f} ms, by write marker {k * 1000:.1f} ms; marker / files "
          f"{k / f:.2f}")


if __name__ == "__main__":
    main()
