"""What a data diff costs when 1% of the table changed: reading only the changed rows (Lance's
row versions, ``forensics.diff``) against one scan of both versions (``diff --full``).

    python -m benchmarks.diff_bench [--rows 250000 500000 1000000] [--rounds 3]

The table is written with pylance directly, shaped like the corpus after curation: the raw
columns (with a short text), then each signal group added as its own data files the way the
column writers add them (``is_dup`` and ``near_dup``; 16 quality signals; ``n_tokens``), and the
rules in force in its config. The change between the two tagged versions, 1% of the rows:

- an ingest of 0.5% new rows, their signals written;
- ``is_dup`` recomputed in one fragment (as after a delete, a new kept member), flipping some;
- 0.1% of the rows deleted together (a forget of one source's documents);
- with ``--scattered N``: N more rows deleted one by one all over the table.

Then, in interleaved rounds, both ways of diffing the two tags: wall and CPU seconds, bytes
read from each version (Lance's own I/O counters) and rows read, and the ratio to the full
scan. A last pair changes a rule's threshold too, which moves rows that did not change.
"""

from __future__ import annotations

import argparse
import os
import platform
import shutil
import statistics
import tempfile
import time
from pathlib import Path

import lance
import numpy as np
import pyarrow as pa

from lance_assets import keys, paths
from lance_assets.curation.rules import Curation
from lance_assets.forensics.diff import diff
from lance_assets.table import Table

QUALITY = [f"signal_{i:02d}" for i in range(15)] + ["word_count"]
RULES = {"exact_dup": "NOT is_dup", "near_dup": "NOT near_dup",
         "words": "word_count BETWEEN 50 AND 100000",
         **{f"s{i}": f"signal_{i:02d} <= 0.9" for i in range(6)}}
SOURCES = [f"file:/corpus/part-{i:03d}.parquet" for i in range(40)]


def raw(ids: np.ndarray) -> pa.Table:
    rng = np.random.default_rng(int(ids[0]) if len(ids) else 0)
    return pa.table({
        "id": pa.array(ids, pa.int64()),
        "source": pa.array([SOURCES[i] for i in (ids * len(SOURCES) // (ids.max() + 1 or 1))
                            % len(SOURCES)]),
        "text": pa.array([f"document {i} " + "lorem " * int(n) for i, n in
                          zip(ids, rng.integers(5, 40, len(ids)))]),
    })


def dedup_group(ids: np.ndarray, flip: np.ndarray | None = None) -> pa.Table:
    is_dup = (ids * 2654435761 % 97) < 8
    if flip is not None:
        is_dup = is_dup ^ np.isin(ids, flip)
    return pa.table({"is_dup": pa.array(is_dup), "near_dup": pa.array((ids * 40503 % 89) < 5)})


def quality_group(ids: np.ndarray) -> pa.Table:
    rng = np.random.default_rng(int(ids[0]) + 1 if len(ids) else 1)
    cols = {name: pa.array(rng.random(len(ids)), pa.float32()) for name in QUALITY[:-1]}
    cols["word_count"] = pa.array(rng.integers(10, 2000, len(ids)), pa.int32())
    return pa.table(cols)


def tokens_group(ids: np.ndarray) -> pa.Table:
    return pa.table({keys.N_TOKENS: pa.array((ids * 7919 % 3000 + 20).astype(np.int32))})


GROUPS = (dedup_group, quality_group, tokens_group)


def _add_group(ds: lance.LanceDataset, make) -> lance.LanceDataset:
    """A group of columns added to every fragment as its own data files (``add_columns`` with a
    function of ``id``: one new data file per fragment, as the column writers leave them)."""
    schema = make(np.arange(1, dtype=np.int64)).schema

    def values(batch: pa.RecordBatch) -> pa.RecordBatch:
        return make(batch.column("id").to_numpy()).to_batches()[0]

    ds.add_columns(lance.batch_udf(output_schema=schema)(values), read_columns=["id"])
    return lance.dataset(ds.uri)


def write_table(root: Path, rows: int, rows_per_fragment: int = 4096) -> Table:
    """``rows`` documents under the data root ``root``, every signal group written, the rules
    in force recorded."""
    table = Table.of(root)
    uri = paths.table_uri(table.root)
    ds = lance.write_dataset(raw(np.arange(rows, dtype=np.int64)), uri,
                             max_rows_per_file=rows_per_fragment, enable_stable_row_ids=True)
    for make in GROUPS:
        ds = _add_group(ds, make)
    table.set_config(keys.CURATION_KEY, Curation(rules=dict(RULES)).to_dict())
    return table


def change(table: Table, share: float = 0.01, rows_per_fragment: int = 4096,
           scattered: int = 0) -> dict:
    """The 1% change of the module docstring; returns what it did."""
    ds = table.newest()
    rows = ds.count_rows()
    start = int(ds.to_table(columns=["id"]).column(0).to_numpy().max()) + 1
    new = np.arange(start, start + int(rows * share / 2), dtype=np.int64)
    parts = [raw(new)] + [make(new) for make in GROUPS]
    appended = pa.table({n: c for t in parts for n, c in zip(t.column_names, t.columns)})
    ds = lance.write_dataset(appended.select(ds.schema.names), ds.uri, mode="append",
                             max_rows_per_file=rows_per_fragment)
    # is_dup recomputed in one fragment: a DataReplacement of its dedup group's data file
    frag = ds.get_fragments()[len(ds.get_fragments()) // 3]
    ids = frag.to_table(columns=["id"]).column(0).to_numpy()
    flipped = ids[:: max(1, len(ids) // 40)]
    group = dedup_group(ids, flipped)
    written = lance.fragment.write_fragments(group, ds.uri, schema=group.schema)
    op = lance.LanceOperation.DataReplacement(
        [lance.LanceOperation.DataReplacementGroup(frag.fragment_id, written[0].data_files()[0])])
    ds = lance.LanceDataset.commit(ds.uri, op, read_version=ds.version)
    # 0.1% deleted together, and `scattered` more one by one
    first = rows // 2
    gone = int(rows * share / 10)
    ds.delete(f"id >= {first} AND id < {first + gone}")
    if scattered:
        picks = np.random.default_rng(1).choice(rows, scattered, replace=False)
        ds = lance.dataset(ds.uri)
        ds.delete(f"id IN ({', '.join(str(int(i)) for i in picks)})")
    return {"added": len(new), "flipped": flipped, "deleted": gone + scattered}


def timed(fn) -> tuple[object, float, float]:
    wall, cpu = time.perf_counter(), time.process_time()
    out = fn()
    return out, time.perf_counter() - wall, time.process_time() - cpu


def bench(rows: int, rounds: int, scattered: int, work: Path) -> list[dict]:
    root = work / f"rows-{rows}-{scattered}"
    shutil.rmtree(root, ignore_errors=True)
    start = time.perf_counter()
    table = write_table(root, rows)
    table.snapshots.hold("a", table.newest().version, owner="benchmark")
    did = change(table, scattered=scattered)
    table.snapshots.hold("b", table.newest().version, owner="benchmark")
    print(f"  {rows:,} rows written and changed in {time.perf_counter() - start:.1f} s: "
          f"{did['added']:,} added, {len(did['flipped'])} is_dup flipped, {did['deleted']:,} "
          f"deleted ({scattered:,} scattered)", flush=True)
    out = []
    for label, a, b in (("1% changed", "a", "b"), ("1% changed + a rule re-thresholded",
                                                    "a", "c")):
        if b == "c":
            table.set_config(keys.CURATION_KEY, Curation(rules={
                **RULES, "words": "word_count BETWEEN 80 AND 100000"}).to_dict())
            table.snapshots.hold("c", table.newest().version, owner="benchmark")
        figures: dict[str, list] = {"row versions": [], "full scan": []}
        results = {}
        for _ in range(rounds):  # interleaved: the machine's load hits both alike
            for mode in figures:
                got, wall, cpu = timed(lambda m=mode, a=a, b=b: diff(table, a, b, full=m == "full scan"))
                figures[mode].append((wall, cpu, got.cost))
                results[mode] = got.to_dict()
        for r in results.values():
            r.pop("cost")
        assert results["row versions"] == results["full scan"], "the two ways disagree"
        for mode, runs in figures.items():
            cost = runs[-1][2]
            out.append({"rows": rows, "scattered": scattered, "change": label, "mode": mode,
                        "wall_s": statistics.median(r[0] for r in runs),
                        "cpu_s": statistics.median(r[1] for r in runs),
                        "mb_read": (cost["a"]["bytes_read"] + cost["b"]["bytes_read"]) / 1e6,
                        "rows_read": cost["a"]["rows_read"] + cost["b"]["rows_read"],
                        "fragments_read": cost["a"]["fragments_read"]
                        + cost["b"]["fragments_read"],
                        "fragments": cost["a"]["fragments_total"] + cost["b"]["fragments_total"]})
    shutil.rmtree(root, ignore_errors=True)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, nargs="+", default=[250_000, 500_000, 1_000_000])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--scattered", type=int, nargs="+", default=[0],
                        help="also delete this many rows one by one (one figure per value)")
    args = parser.parse_args()
    print(f"machine: {platform.machine()}, {os.cpu_count()} cores, {platform.processor() or ''}; "
          f"load average {os.getloadavg()[0]:.2f}; pylance {lance.__version__}")
    rows_out = []
    with tempfile.TemporaryDirectory() as tmp:
        for n in args.rows:
            for scattered in args.scattered:
                rows_out += bench(n, args.rounds, scattered, Path(tmp))
    print("\n| rows | scattered deletes | change | read | wall s | CPU s | MB read | rows read "
          "| fragments read | CPU vs full | MB vs full |\n|---|---|---|---|---|---|---|---|---|---|---|")
    for r in rows_out:
        full = next(f for f in rows_out if f["rows"] == r["rows"] and f["change"] == r["change"]
                    and f["scattered"] == r["scattered"] and f["mode"] == "full scan")
        print(f"| {r['rows']:,} | {r['scattered']:,} | {r['change']} | {r['mode']} | "
              f"{r['wall_s']:.3f} | {r['cpu_s']:.3f} | {r['mb_read']:.1f} | {r['rows_read']:,} | "
              f"{r['fragments_read']} of {r['fragments']} | {r['cpu_s'] / full['cpu_s']:.3f} | "
              f"{r['mb_read'] / full['mb_read']:.3f} |")


if __name__ == "__main__":
    main()
