"""What a forget costs when it redacts the tagged snapshots that held the documents, against
releasing them and cleaning up (what `forget --release` does to a snapshot it names).

    python -m benchmarks.redact_bench [--rows 1000000] [--snapshots 10] [--forget 1 1000]

The table is ``diff_bench``'s curated-corpus shape (raw columns, signal groups, rules in force).
Before each tagged snapshot (``train-s<i>``) about 1% of the table changes (``diff_bench.change``:
an ingest of 0.5%, one fragment's ``is_dup`` rewritten, 0.1% deleted), so the snapshots share
most fragments and differ in some. Then, each on a copy of that table, a forget of N documents
spread evenly over the ids, made when the first snapshot was tagged (so every snapshot holds
them): redacting every snapshot, and releasing every snapshot. For each: wall and CPU seconds,
bytes written (files under the table that are new after the forget), fragments rewritten (on
the main line and on the branches), against the table's size (the files the newest version
references) and fragments. With ``--growth``, the same forget of the largest N with fewer
snapshots kept (the others released before the forget): how the cost grows with their number.
"""

from __future__ import annotations

import argparse
import os
import platform
import shutil
import tempfile
import time
from pathlib import Path

import lance
import numpy as np

from benchmarks.diff_bench import change, write_table
from lance_assets import paths
from lance_assets.table import Table
from lance_assets.table.forget import forget
from lance_assets.table.snapshots import RUN


def files(root: Path) -> dict[str, int]:
    return {str(p.relative_to(root)): p.stat().st_size for p in root.rglob("*") if p.is_file()}


def table_bytes(table: Table) -> tuple[int, int]:
    """(bytes of the data files the newest version references, its fragments)."""
    ds = table.newest()
    base = Path(table.uri) / "data"
    frags = ds.get_fragments()
    return sum((base / f.path).stat().st_size for fr in frags for f in fr.metadata.data_files()), \
        len(frags)


def prepare(root: Path, rows: int, snapshots: int) -> tuple[Table, np.ndarray]:
    table = write_table(root, rows)
    first_ids = None
    for i in range(snapshots):
        change(table, share=0.01)
        table.snapshots.hold(f"train-s{i}", table.newest().version, owner="benchmark", kind=RUN)
        if first_ids is None:
            first_ids = np.sort(table.newest().to_table(columns=["id"]).column("id").to_numpy())
    return table, first_ids


def spread(ids: np.ndarray, n: int) -> list[int]:
    """``n`` ids spread evenly over ``ids`` (the first snapshot's: every later one holds them
    unless ``change`` deleted them)."""
    return [int(i) for i in ids[np.linspace(0, len(ids) - 1, n).astype(int)]]


def one(src: Path, work: Path, n: int, ids: np.ndarray, how: str, keep: int | None = None
        ) -> dict:
    root = work / f"{how}-{n}-{keep}"
    shutil.rmtree(root, ignore_errors=True)
    shutil.copytree(src, root)
    table = Table.of(root)
    tags = sorted(table.snapshots.list())
    if keep is not None:  # fewer snapshots: the others released before the forget
        for tag in tags[keep:]:
            table.snapshots.release(tag, "benchmark: fewer snapshots")
        tags = tags[:keep]
    uri = Path(paths.table_uri(table.root))
    before = files(uri)
    size, fragments = table_bytes(table)
    chosen = spread(ids, n)
    wall, cpu = time.perf_counter(), time.process_time()
    report = forget(table, f"id IN ({', '.join(map(str, chosen))})", max_share=1.0,
                    release=tags if how == "release" else (), log=lambda _m: None)
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    after = files(uri)
    written = sum(s for p, s in after.items() if p not in before)
    rewritten = sum(r.get("fragments_rewritten", 0) for r in report.redacted.values())
    assert report.still_readable == report.still_in_files == 0
    out = {"how": how, "documents": report.ids, "snapshots": len(tags), "wall_s": wall,
           "cpu_s": cpu, "mb_written": written / 1e6, "table_mb": size / 1e6,
           "fragments": fragments, "branch_fragments_rewritten": rewritten,
           "redacted": len(report.redacted), "released": len(report.released),
           "readable_after": sum(table.open(t).count_rows() > 0 for t in table.snapshots.list())}
    shutil.rmtree(root, ignore_errors=True)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--snapshots", type=int, default=10)
    parser.add_argument("--forget", type=int, nargs="+", default=[1, 1000])
    parser.add_argument("--growth", type=int, nargs="*", default=[1, 3],
                        help="also forget the largest N with this many snapshots kept")
    parser.add_argument("--work", type=Path, default=None)
    args = parser.parse_args()
    print(f"machine: {platform.machine()}, {os.cpu_count()} cores; load average "
          f"{os.getloadavg()[0]:.2f}; pylance {lance.__version__}", flush=True)
    with tempfile.TemporaryDirectory(dir=args.work) as tmp:
        work = Path(tmp)
        start = time.perf_counter()
        table, ids = prepare(work / "src" / "data", args.rows, args.snapshots)
        print(f"  {args.rows:,} rows, {args.snapshots} snapshots in "
              f"{time.perf_counter() - start:.0f} s", flush=True)
        src = work / "src" / "data"
        rows = []
        for n in args.forget:
            for how in ("redact", "release"):
                rows.append(one(src, work, n, ids, how))
                print("  ", rows[-1], flush=True)
        for keep in args.growth:
            rows.append(one(src, work, max(args.forget), ids, "redact", keep))
            print("  ", rows[-1], flush=True)
    print("\n| documents | snapshots | how | wall s | CPU s | MB written | table MB | fragments "
          "rewritten on branches (of the table's) | snapshots readable after |\n"
          "|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['documents']:,} | {r['snapshots']} | {r['how']} | {r['wall_s']:.1f} | "
              f"{r['cpu_s']:.1f} | {r['mb_written']:.1f} | {r['table_mb']:.1f} | "
              f"{r['branch_fragments_rewritten']} ({r['fragments']}) | {r['readable_after']} |")


if __name__ == "__main__":
    main()
