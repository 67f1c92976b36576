"""``lance_ray.add_columns`` against ``write_columns(executor="ray")`` on the same table.

    python3 -m venv /tmp/lr && /tmp/lr/bin/pip install lance-ray duckdb tqdm
    PYTHONPATH=$PWD /tmp/lr/bin/python -m benchmarks.lance_ray_compare --rows 40000 --fragments 16

``lance-ray`` is not a dependency of the project (this script runs in its own virtualenv).
Both arms compute the quality signals (``quality.compute_signals``, 25 columns) for every
fragment on the same local Ray (every core), from fresh copies of one raw table, and each arm's
result is checked equal to the other's. Then both are run again with one fragment's compute
failing, to show what each leaves in the table: ``add_columns`` commits once, at the end (one
``Merge``), so a failure anywhere commits nothing; ``write_columns`` commits per fragment group
as results arrive.
"""

from __future__ import annotations

import argparse
import os
import shutil
import tempfile
import time
from pathlib import Path

import pyarrow as pa

from lance_assets.curation.quality_signals import FIELDS, compute_signals, fragment_signals
from lance_assets.ingest.raw_text import ingest
from lance_assets.table import Table, columns, executor


def quiet(_msg: str) -> None:
    pass


def signals_of_batch(batch: pa.RecordBatch) -> pa.RecordBatch:
    """lance-ray's transform: a batch of ``text`` in, the signal columns out."""
    return compute_signals(batch.column("text"))


class FailingBatch:
    """``signals_of_batch``, raising on the batch that holds ``bad_id``."""

    def __init__(self, bad_id: int) -> None:
        self.bad_id = bad_id

    def __call__(self, batch: pa.RecordBatch) -> pa.RecordBatch:
        if self.bad_id in batch.column("id").to_pylist():
            raise ValueError("injected failure")
        return compute_signals(batch.column("text"))


class FailingFragment:
    def __init__(self, fragment_id: int) -> None:
        self.fragment_id = fragment_id

    def __call__(self, frag):
        if frag.fragment_id == self.fragment_id:
            raise ValueError("injected failure")
        return fragment_signals(frag)


def fresh(raw: Path, work: Path, name: str) -> Table:
    shutil.rmtree(work / name, ignore_errors=True)
    shutil.copytree(raw, work / name)
    return Table.of(work / name)


def signal_values(table: Table) -> pa.Table:
    return table.newest().to_table(columns=["id", *[f.name for f in FIELDS]]).sort_by("id")


def main(argv: list[str] | None = None) -> None:
    import lance_ray
    import ray

    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rows", type=int, default=40_000)
    p.add_argument("--fragments", type=int, default=16)
    p.add_argument("--repeats", type=int, default=2, help="alternating repeats; best is kept")
    args = p.parse_args(argv)
    work = Path(tempfile.mkdtemp(prefix="lance_ray_compare_"))
    cpus = os.cpu_count() or 2
    try:
        raw = work / "raw"
        ingest(Table.of(raw), f"synthetic:{args.rows}", rows_per_fragment=args.rows // args.fragments,
               log=quiet)
        ray.init(num_cpus=cpus, include_dashboard=False, log_to_driver=False,
                 runtime_env=executor.runtime_env())
        # warm the workers: both arms then start from processes that imported the code
        ray.get([ray.remote(lambda: __import__("lance_assets.curation.quality_signals")).remote()
                 for _ in range(cpus * 2)])
        best = {"lance_ray": float("inf"), "write_columns": float("inf")}
        for r in range(args.repeats):
            table_lr = fresh(raw, work, f"lr{r}")
            t = time.perf_counter()
            lance_ray.add_columns(table_lr.uri, transform=signals_of_batch, read_columns=["text"],
                                  batch_size=2048, concurrency=cpus)
            best["lance_ray"] = min(best["lance_ray"], time.perf_counter() - t)
            table_wc = fresh(raw, work, f"wc{r}")
            t = time.perf_counter()
            report = columns.write_columns(table_wc, FIELDS, fragment_signals, executor="ray",
                                           log=quiet)
            best["write_columns"] = min(best["write_columns"], time.perf_counter() - t)
            assert signal_values(table_lr).equals(signal_values(table_wc)), "the arms disagree"
        for name, s in best.items():
            print(f"{name}: {s:.2f} s, {args.rows / s:,.0f} docs/s")
        print(f"write_columns / lance_ray wall: {best['write_columns'] / best['lance_ray']:.2f} "
              f"({report.commits} commits vs 1)")

        # one fragment fails: what is left committed?
        bad_fragment = args.fragments // 2
        table_lr = fresh(raw, work, "lr-fail")
        bad_id = table_lr.newest().get_fragment(bad_fragment).to_table(
            columns=["id"]).column("id")[0].as_py()
        try:
            lance_ray.add_columns(table_lr.uri, transform=FailingBatch(bad_id),
                                  read_columns=["id", "text"], concurrency=cpus)
        except Exception as exc:  # noqa: BLE001 - the point is what it leaves behind
            print(f"lance_ray failed: {type(exc).__name__}")
        ds = table_lr.newest()
        done = ds.count_rows("word_count IS NOT NULL") if "word_count" in ds.schema.names else 0
        print(f"lance_ray after one failed fragment: {done} of {args.rows} rows hold the signals")
        table_wc = fresh(raw, work, "wc-fail")
        try:
            columns.write_columns(table_wc, FIELDS, FailingFragment(bad_fragment), executor="ray",
                                  fragments_per_commit=1, log=quiet)
        except columns.FragmentsFailedError:
            pass
        done = table_wc.newest().count_rows("word_count IS NOT NULL")
        print(f"write_columns after one failed fragment: {done} of {args.rows} rows hold the "
              "signals; the rerun computes the one fragment left")
    finally:
        ray.shutdown()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
