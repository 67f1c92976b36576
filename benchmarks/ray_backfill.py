"""Column backfills as Ray tasks against the local executor, on the same tables in one run.

    python -m benchmarks.ray_backfill --rows 40000 --fragments 16 --embed-rows 400

Prints, each against the local executor measured in the same run:

- ``token_ids`` (cl100k_base) throughput, local (2 tokenizer threads, next fragment encoded
  ahead) vs Ray (one task per fragment, one thread each, on a local Ray with every core): the
  Ray overhead as a wall-clock ratio;
- ``embeddings`` (all-MiniLM-L6-v2 on CPU; Ray: one task per fragment, each worker loads the
  model once) documents/s, local vs Ray;
- the commit rate the driver sustains: ``n_bytes`` (a trivial compute) on a table of tiny
  fragments, one ``DataReplacement`` commit per fragment, local vs Ray (commits/s);
- scaling: ``quality_signals`` (numpy per fragment) on a Ray pinned to 1 core vs 2 cores,
  against the ideal 2x.

Ray start-up (``ray.init`` and one warmed worker per CPU) is timed apart and left out of the
rates: a cluster is started once and serves many backfills. Loading the embedding model in each
worker is counted (a worker loads it once per process). Every arm writes a fresh copy of the same raw table.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import tempfile
import time
from pathlib import Path

from lance_assets.curation import quality_signals
from lance_assets.ingest.raw_text import ingest
from lance_assets.table import Table, executor
from lance_assets.table.columns import write_columns
from lance_assets.table.producer import produce
from lance_assets.tokens import token_ids
from lance_assets.tokens.token_ids import N_BYTES, _n_bytes


def quiet(_msg: str) -> None:
    pass


def build(root: Path, rows: int, fragments: int) -> Path:
    ingest(Table.of(root), f"synthetic:{rows}", rows_per_fragment=max(1, rows // fragments), log=quiet)
    return root


def fresh(raw: Path, work: Path, name: str) -> Path:
    target = work / name
    shutil.rmtree(target, ignore_errors=True)
    shutil.copytree(raw, target)
    return target


def start_ray(num_cpus: int) -> float:
    import ray

    ray.shutdown()
    t = time.perf_counter()
    ray.init(num_cpus=num_cpus, include_dashboard=False, log_to_driver=False,
             runtime_env=executor.runtime_env())
    warm_up(num_cpus)
    return time.perf_counter() - t


def _import_writers() -> None:
    time.sleep(0.5)  # hold the worker, so every CPU gets its own
    import lance_assets.curation.quality_signals  # noqa: F401
    import lance_assets.tokens.token_ids  # noqa: F401


def warm_up(num_cpus: int) -> None:
    """Start one worker per CPU with the column code imported (part of the start-up time)."""
    import ray

    task = ray.remote(_import_writers)
    ray.get([task.remote() for _ in range(num_cpus)])


def timed(fn):
    t = time.perf_counter()
    out = fn()
    return time.perf_counter() - t, out


def bench_tokens(raw: Path, work: Path, tokenizer: str) -> dict:
    out = {}
    for where in ("local", "ray"):
        root = fresh(raw, work, f"tok-{where}")
        seconds, report = timed(
            lambda root=root, where=where: produce(token_ids.PRODUCER, Table.of(root),
                                                   token_ids.TokenIdsSettings(tokenizer=tokenizer),
                                                   executor=where, log=quiet))
        tokens = report.tokens_written
        out[where] = {"s": seconds, "tokens": tokens, "tokens_per_s": tokens / seconds,
                      "mb_per_s": report.bytes_tokenized / 1e6 / seconds}
    out["ray_over_local_wall"] = out["ray"]["s"] / out["local"]["s"]
    return out


def bench_embeddings(raw: Path, work: Path) -> dict:
    from lance_assets.embeddings import embeddings

    out = {}
    for where in ("local", "ray"):
        root = fresh(raw, work, f"emb-{where}")
        seconds, report = timed(
            lambda root=root, where=where: produce(embeddings.PRODUCER, Table.of(root), executor=where,
                                                   log=quiet))
        out[where] = {"s": seconds, "docs": report.rows_written,
                      "docs_per_s": report.rows_written / seconds,
                      "model_load_s_in_driver": report.model_load_s}
    out["ray_over_local_wall"] = out["ray"]["s"] / out["local"]["s"]
    return out


def bench_commits(raw: Path, work: Path) -> dict:
    out = {}
    for where in ("local", "ray"):
        root = fresh(raw, work, f"commits-{where}")
        table = Table.of(root)
        seconds, report = timed(lambda table=table, where=where: write_columns(
            table, [N_BYTES], _n_bytes, fragments_per_commit=1, executor=where, log=quiet))
        manifest = max((Path(table.uri) / "_versions").glob("*.manifest"),
                       key=lambda p: p.stat().st_mtime)
        out[where] = {"s": seconds, "commits": report.commits,
                      "commits_per_s": report.commits / seconds,
                      "manifest_kb": manifest.stat().st_size / 1024}
    out["ray_over_local_commits_per_s"] = (out["ray"]["commits_per_s"]
                                           / out["local"]["commits_per_s"])
    return out


def worker_cpu_s() -> float:
    """CPU seconds used so far by this driver's Ray workers (the raylet's ``ray::`` children;
    other Ray clusters on the machine are not descendants of this process)."""
    import psutil

    total = 0.0
    for proc in psutil.Process().children(recursive=True):
        try:
            name = proc.name()
            if name.startswith("ray::") and not name.endswith("Agent"):
                times = proc.cpu_times()
                total += times.user + times.system
        except psutil.NoSuchProcess:
            pass
    return total


def bench_scaling(raw: Path, work: Path) -> dict:
    """Ray on 1 core, then on 2: the driver is pinned to those cores before ``ray.init``, so the
    raylet and every worker inherit the pinning (pyarrow's and Lance's own thread pools would
    otherwise use the other core behind a ``num_cpus=1`` Ray)."""
    out = {}
    everything = os.sched_getaffinity(0)
    try:
        for cpus in (1, 2):
            os.sched_setaffinity(0, set(sorted(everything)[:cpus]))
            out[f"ray_init_s_{cpus}"] = start_ray(cpus)
            root = fresh(raw, work, f"scale-{cpus}")
            cpu0 = worker_cpu_s()
            seconds, report = timed(lambda root=root: produce(
                quality_signals.PRODUCER, Table.of(root), executor="ray", log=quiet))
            cpu_s = worker_cpu_s() - cpu0
            out[f"{cpus}_cpu"] = {"s": seconds, "docs_per_s": report.rows_written / seconds,
                                  "task_cpu_s": cpu_s, "parallelism": cpu_s / seconds,
                                  "docs_per_cpu_s": report.rows_written / cpu_s}
    finally:
        os.sched_setaffinity(0, everything)
    out["speedup_2_over_1"] = out["2_cpu"]["docs_per_s"] / out["1_cpu"]["docs_per_s"]
    return out


def print_scaling(s: dict) -> None:
    for n in (1, 2):
        r = s[f"{n}_cpu"]
        print(f"scaling: quality_signals on {n} core(s): {r['docs_per_s']:.0f} docs/s, tasks used "
              f"{r['task_cpu_s']:.1f} CPU-s ({r['parallelism']:.2f} cores busy, "
              f"{r['docs_per_cpu_s']:.0f} docs per CPU-s)")
    print(f"scaling: 2 cores / 1 core {s['speedup_2_over_1']:.2f}x (ideal 2x)")


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rows", type=int, default=40_000, help="synthetic documents for token_ids "
                   "and the scaling run")
    p.add_argument("--fragments", type=int, default=16, help="fragments of that table")
    p.add_argument("--embed-rows", type=int, default=400, help="documents for embeddings")
    p.add_argument("--embed-fragments", type=int, default=4)
    p.add_argument("--tiny-fragments", type=int, default=300,
                   help="fragments (4 rows each) for the commit-rate run")
    p.add_argument("--tokenizer", default="cl100k_base")
    p.add_argument("--skip-embeddings", action="store_true")
    p.add_argument("--only-scaling", action="store_true", help="the 1 vs 2 core run alone")
    p.add_argument("--work", default=None, help="folder for the tables (default: a temp folder)")
    p.add_argument("--json", default=None, help="also write the results here")
    args = p.parse_args(argv)

    work = Path(args.work or tempfile.mkdtemp(prefix="ray_backfill_"))
    work.mkdir(parents=True, exist_ok=True)
    results: dict = {"cpus": os.cpu_count(), "rows": args.rows, "fragments": args.fragments}
    try:
        raw = build(work / "raw", args.rows, args.fragments)
        if args.only_scaling:
            results["scaling"] = bench_scaling(raw, work)
            s = results["scaling"]
            print_scaling(results["scaling"])
            return results
        tiny = build(work / "tiny", 4 * args.tiny_fragments, args.tiny_fragments)
        assert len(Table.of(tiny).newest().get_fragments()) == args.tiny_fragments
        results["ray_init_s"] = start_ray(os.cpu_count() or 2)
        results["token_ids"] = bench_tokens(raw, work, args.tokenizer)
        print(json.dumps({"token_ids": results["token_ids"]}, indent=1), flush=True)
        results["commit_rate"] = bench_commits(tiny, work)
        print(json.dumps({"commit_rate": results["commit_rate"]}, indent=1), flush=True)
        if not args.skip_embeddings:
            small = build(work / "small", args.embed_rows, args.embed_fragments)
            results["embeddings"] = bench_embeddings(small, work)
            print(json.dumps({"embeddings": results["embeddings"]}, indent=1), flush=True)
        results["scaling"] = bench_scaling(raw, work)
        print(json.dumps({"scaling": results["scaling"]}, indent=1), flush=True)
    finally:
        import ray

        ray.shutdown()
        if args.work is None:
            shutil.rmtree(work, ignore_errors=True)
    t, c, s = results["token_ids"], results["commit_rate"], results["scaling"]
    print(f"token_ids: local {t['local']['tokens_per_s'] / 1e6:.2f} M tokens/s, Ray "
          f"{t['ray']['tokens_per_s'] / 1e6:.2f} M tokens/s: Ray/local wall {t['ray_over_local_wall']:.2f}")
    if "embeddings" in results:
        e = results["embeddings"]
        print(f"embeddings: local {e['local']['docs_per_s']:.1f} docs/s, Ray "
              f"{e['ray']['docs_per_s']:.1f} docs/s: Ray/local wall {e['ray_over_local_wall']:.2f}")
    print(f"commits: local {c['local']['commits_per_s']:.1f}/s, Ray {c['ray']['commits_per_s']:.1f}/s "
          f"({args.tiny_fragments} fragments, final manifest {c['ray']['manifest_kb']:.0f} KiB)")
    print_scaling(s)
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))
    return results


if __name__ == "__main__":
    main()
