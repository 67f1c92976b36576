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
from lance.fragment import write_fragments


def build(uri: str, fragments: int) -> None:
    from lance_assets.corpus.columns import write_columns

    rows = 100
    table = pa.table({"id": pa.array(range(fragments * rows), pa.int64()),
                      "text": pa.array([f"document {i}" for i in range(fragments * rows)])})
    lance.write_dataset(table, uri, max_rows_per_file=rows, enable_stable_row_ids=True)
    flag = pa.field("flag", pa.bool_())

    def compute(frag):
        yield pa.RecordBatch.from_arrays([pa.array([True] * frag.physical_rows)], [flag.name])

    write_columns(uri, [flag], compute, fragments_per_commit=500, log=lambda _: None)


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
    uri = str(work / "t.lance")
    t = time.perf_counter()
    build(uri, args.fragments)
    print(f"{platform.node()} {platform.machine()}, {args.fragments} fragments built in "
          f"{time.perf_counter() - t:.1f} s")

    def one_fragment():
        return write_fragments(pa.table({"id": pa.array([0], pa.int64()),
                                         "text": pa.array(["x"])}), uri)

    def append():
        ds = lance.dataset(uri)
        lance.LanceDataset.commit(uri, lance.LanceOperation.Append(one_fragment()),
                                  read_version=ds.version)

    def merge():
        ds = lance.dataset(uri)
        op = lance.LanceOperation.Merge([f.metadata for f in ds.get_fragments()] + one_fragment(),
                                        ds.lance_schema)
        lance.LanceDataset.commit(uri, op, read_version=ds.version)

    from lance_assets.corpus.columns import _fragments_without_fields, fragments_missing
    from lance_assets.table import leaf_field_ids

    def by_files():
        ds = lance.dataset(uri)
        return _fragments_without_fields(ds.get_fragments(), leaf_field_ids(ds, "flag"))

    def by_marker():
        return fragments_missing(lance.dataset(uri), ["flag"])

    a, m = median_s(append, args.repeat), median_s(merge, args.repeat)
    print(f"commit one fragment: Append {a * 1000:.1f} ms, fenced Merge {m * 1000:.1f} ms; "
          f"Merge / Append {m / a:.2f}")
    f, k = median_s(by_files, args.repeat), median_s(by_marker, args.repeat)
    print(f"find unwritten fragments: by data files {f * 1000:.1f} ms, by write marker "
          f"{k * 1000:.1f} ms; marker / files {k / f:.2f} "
          f"({lance.dataset(uri).count_rows():,} rows)")
    # after a compaction the markers sit in merged files: their values are read
    lance.dataset(uri).optimize.compact_files(target_rows_per_fragment=1000)
    f, k = median_s(by_files, args.repeat), median_s(by_marker, args.repeat)
    print(f"after a compaction ({len(lance.dataset(uri).get_fragments())} fragments): by data "
          f"files {f * 1000:.1f} ms, by write marker {k * 1000:.1f} ms; marker / files "
          f"{k / f:.2f}")


if __name__ == "__main__":
    main()
