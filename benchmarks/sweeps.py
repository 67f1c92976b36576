"""Threshold sweeps (``curation_rules``' plot) against one Lance count per grid point.

    LANCE_LOG=error python -m benchmarks.sweeps [--rows 250000 1000000]

A table of random signals with every column the default rules read; the sweeps of every
numeric threshold of ``DEFAULT_RULES`` (one read, then numpy) against the baseline a user would
otherwise write: one ``count_rows`` with the rule set rewritten at each grid point (timed on 10
points and scaled to the grid). Prints both, the ratio, and the plot's cost, per size.
"""

from __future__ import annotations

import argparse
import re
import tempfile
import time

import lance
import numpy as np
import pyarrow as pa

from lance_assets.curation import rules, sweeps


def table(n: int, folder: str) -> lance.LanceDataset:
    rng = np.random.default_rng(0)
    data = {"id": np.arange(n)}
    for c in ("is_dup", "near_dup", "has_lorem_ipsum", "has_curly_bracket"):
        data[c] = rng.random(n) < 0.05
    for c in ("word_count", "stop_word_count"):
        data[c] = rng.integers(0, 2000, n)
    for predicate in rules.DEFAULT_RULES.values():
        for name in re.findall(r"[a-z][a-z0-9_]*", predicate):
            if name.endswith(("share", "ratio", "length")) and name not in data:
                data[name] = rng.random(n).astype(np.float32)
    data["n_tokens"] = rng.integers(1, 4000, n)
    return lance.write_dataset(pa.table(data), f"{folder}/t.lance", max_rows_per_file=250_000)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rows", type=int, nargs="+", default=[250_000, 1_000_000])
    args = p.parse_args(argv)
    combined = None
    print("| rows | thresholds | grid points | sweeps (s) | one count_rows (s) | counts for the grid "
          "(s) | ratio | plot (s) |")
    print("|---|---|---|---|---|---|---|---|")
    for n in args.rows:
        with tempfile.TemporaryDirectory() as folder:
            ds = table(n, folder)
            start = time.perf_counter()
            report = sweeps.sweeps(ds, rules.DEFAULT_RULES)
            took = time.perf_counter() - start
            points = sum(len(s.grid) for s in report.sweeps)
            combined = rules.validate(ds, rules.DEFAULT_RULES)
            start = time.perf_counter()
            for _ in range(10):
                ds.count_rows(filter=combined)
            per = (time.perf_counter() - start) / 10
            start = time.perf_counter()
            sweeps.plot_png(report)
            plot = time.perf_counter() - start
            print(f"| {n:,} | {len(report.sweeps)} | {points} | {took:.2f} | {per:.3f} | "
                  f"{per * points:.1f} | {per * points / took:.1f}x | {plot:.2f} |", flush=True)


if __name__ == "__main__":
    main()
