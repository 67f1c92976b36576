"""``near_dup`` and ``dedup_flag`` on Ray against the single-process path, as the corpus grows:
does the driver stay flat, does each worker stay within its partition, what does a document
cost in CPU?

    python -m benchmarks.dedup_cluster --rows 400000 1600000 [--workers 2] [--keep]

For each size: ingest ``synthetic-web:N`` (FineWeb-shaped documents, ~4.6 KB mean), then for each
stage, in child processes (one per arm, so each measures only itself):

- **single process**: the stage with ``executor: local`` (one partition), the whole stage in the
  child; its peak RSS (``VmHWM``) and CPU seconds (``os.wait4``);
- **Ray**: the stage's columns dropped, then the stage with ``executor: ray`` on a local Ray of
  ``--workers`` CPUs started by the child, in ``max(workers, N / docs-per-partition)``
  partitions (so a partition holds about the same documents at every size). The driver's peak
  RSS is its own ``VmHWM``; each Ray worker's peak RSS (and private ``RssAnon``, without the
  object store's shared pages it read) is sampled every 0.1 s; CPU seconds
  are what the stage added to the driver and every process of the Ray cluster (workers,
  raylet, GCS; the cluster's own start-up, and its workers' first import of the stage's
  modules, are left out and printed apart). The columns must equal the single-process ones.

Printed: seconds, CPU seconds, documents per CPU-second (and Ray / single process), the driver's
peak RSS and the largest worker's, and their growth from the smallest size to the largest
(flat = 1.0).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import resource
import shutil
import sys
import tempfile
import threading
import time
from pathlib import Path

from benchmarks.measured import run_measured
from lance_assets.table import Table
from lance_assets.table.producer import produce

REPO = Path(__file__).resolve().parent.parent
STAGES = {"dedup_flag": ["is_dup", "text_hash"],
          "near_dup": ["near_dup_cluster", "near_dup", "minhash_bands"]}


def quiet(_msg: str) -> None:
    pass


def _stage(stage: str, root: str, executor: str, partitions: int) -> None:
    if stage == "dedup_flag":
        from lance_assets.curation import dedup_flag
        produce(dedup_flag.PRODUCER, Table.of(root), dedup_flag.DedupSettings(buckets=partitions),
                executor=executor, log=quiet)
    else:
        from lance_assets.curation import near_dup
        produce(near_dup.PRODUCER, Table.of(root), near_dup.NearDupSettings(partitions=partitions),
                executor=executor, log=quiet)


def _anon_rss(pid: int) -> int:
    """A process's private resident memory (``RssAnon``): its heap, not the object store's
    shared pages it has read (which ``rss`` counts too)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("RssAnon:"):
            return int(line.split()[1]) * 1024
    return 0


def _ray_tree_sampler(stop: threading.Event, peaks: dict, private: dict) -> None:
    """Peak RSS, and peak private RSS, of every Ray worker process of this driver's cluster,
    sampled."""
    import psutil

    me = psutil.Process()
    while not stop.is_set():
        for p in me.children(recursive=True):
            try:
                if "default_worker" in " ".join(p.cmdline()) or p.name().startswith("ray::"):
                    peaks[p.pid] = max(peaks.get(p.pid, 0), p.memory_info().rss)
                    private[p.pid] = max(private.get(p.pid, 0), _anon_rss(p.pid))
            except (psutil.NoSuchProcess, psutil.AccessDenied, FileNotFoundError):
                pass
        stop.wait(0.1)


def _warm(stage: str) -> int:
    import importlib

    importlib.import_module(f"lance_assets.curation.{stage}")
    time.sleep(0.2)  # long enough for every worker to take one
    return os.getpid()


def _peak_rss_mb() -> float:
    """This process's own peak RSS (``VmHWM``). Not ``ru_maxrss``: Linux carries it over
    ``execve`` from the forked image, so a child would report at least its parent's RSS."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _tree_cpu() -> dict[int, float]:
    """CPU seconds (user + system) of this process and every descendant, by pid."""
    import psutil

    out = {}
    for p in [psutil.Process(), *psutil.Process().children(recursive=True)]:
        try:
            t = p.cpu_times()
            out[p.pid] = t.user + t.system
        except psutil.NoSuchProcess:
            pass
    return out


def child_main(stage: str, root: str, executor: str, partitions: int, workers: int,
               out: str) -> None:
    """One arm, in this process: the stage, then its measurements as JSON in ``out``."""

    result: dict = {}
    if executor == "ray":
        import ray

        from lance_assets.table.executor import runtime_env

        ray.init(num_cpus=workers, include_dashboard=False, log_to_driver=False,
                 runtime_env=runtime_env())
        # warm the workers (start them, import the stage's modules): a running cluster's
        # workers are warm; their start-up is reported apart, like the cluster's own
        warm = ray.remote(_warm)
        ray.get([warm.remote(stage) for _ in range(4 * workers)])
        peaks: dict = {}
        private: dict = {}
        stop = threading.Event()
        sampler = threading.Thread(target=_ray_tree_sampler, args=(stop, peaks, private),
                                   daemon=True)
        sampler.start()
        before = _tree_cpu()
        start = time.perf_counter()
        _stage(stage, root, executor, partitions)
        result["wall_s"] = time.perf_counter() - start
        after = _tree_cpu()
        stop.set()
        sampler.join()
        # the stage's CPU in every process of the cluster (workers it started count whole)
        result["cpu_s"] = sum(t - before.get(pid, 0.0) for pid, t in after.items())
        result["ray_startup_cpu_s"] = sum(before.values())  # cluster + warm workers
        result["worker_peak_rss_mb"] = max(peaks.values(), default=0) / 2**20
        result["worker_peak_private_mb"] = max(private.values(), default=0) / 2**20
        result["workers_seen"] = len(peaks)
        ray.shutdown()
    else:
        start = time.perf_counter()
        _stage(stage, root, executor, partitions)
        result["wall_s"] = time.perf_counter() - start
    result["driver_peak_rss_mb"] = _peak_rss_mb()
    Path(out).write_text(json.dumps(result))


def _columns_digest(root: Path, columns: list[str]) -> str:
    import lance

    from lance_assets import paths

    t = lance.dataset(paths.table_uri(root)).to_table(columns=["id", *columns]).sort_by("id")
    h = hashlib.sha256()
    for c in t.columns:
        h.update(str(c.type).encode())
        for chunk in c.chunks:
            for buf in chunk.buffers():
                if buf is not None:
                    h.update(buf)
    return h.hexdigest()


def _rows(root: Path) -> int:
    import lance

    from lance_assets import paths

    try:
        return lance.dataset(paths.table_uri(root)).count_rows()
    except Exception:  # noqa: BLE001 - no table there
        return -1


def _drop(root: Path, columns: list[str]) -> None:
    import lance

    from lance_assets import paths

    ds = lance.dataset(paths.table_uri(root))
    drop = [c for c in ds.schema.names if c in columns or c in {f"_written_{x}" for x in columns}]
    if drop:
        ds.drop_columns(drop)


def arm(stage: str, root: Path, executor: str, partitions: int, workers: int,
        work: Path) -> dict:
    out = work / f"{stage}-{executor}.json"
    cmd = [sys.executable, "-m", "benchmarks.dedup_cluster", "--child", stage, "--root", str(root),
           "--executor", executor, "--partitions", str(partitions), "--workers", str(workers),
           "--out", str(out)]
    m = run_measured(f"{stage}:{executor}", cmd, cwd=str(REPO),
                     env={**os.environ, "LANCE_LOG": "error", "LANCE_ASSETS_PROGRESS": "0"},
                     log_path=str(work / "children.log"))
    if m.returncode != 0:
        raise SystemExit(f"{stage} ({executor}) failed (exit {m.returncode}); see "
                         f"{work / 'children.log'}")
    got = json.loads(out.read_text())
    if executor != "ray":
        got["cpu_s"] = m.cpu_s
    return got


def main(argv: list[str] | None = None) -> dict | None:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rows", type=int, nargs="*", default=[400_000, 1_600_000])
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--docs-per-partition", type=int, default=200_000)
    p.add_argument("--stages", nargs="*", default=list(STAGES))
    p.add_argument("--work", default=None)
    p.add_argument("--keep", action="store_true",
                   help="keep each size's table in --work, and reuse one already there")
    p.add_argument("--child", default=None)
    p.add_argument("--root", default=None)
    p.add_argument("--executor", default="local")
    p.add_argument("--partitions", type=int, default=1)
    p.add_argument("--out", default=None)
    args = p.parse_args(argv)
    if args.child:
        child_main(args.child, args.root, args.executor, args.partitions, args.workers, args.out)
        return None
    from benchmarks.scale import child as scale_child

    work = Path(args.work or tempfile.mkdtemp(prefix="dedup-cluster-"))
    work.mkdir(parents=True, exist_ok=True)
    results: dict = {"workers": args.workers, "docs_per_partition": args.docs_per_partition}
    print(f"{'stage':>10} {'docs':>10} {'arm':>16} {'wall s':>8} {'CPU s':>8} "
          f"{'docs/CPU-s':>10} {'driver MB':>9} {'worker MB':>9}", flush=True)
    for n in args.rows:
        root = work / f"n{n}"
        if not (args.keep and _rows(root) == n):
            shutil.rmtree(root, ignore_errors=True)
            m = scale_child("ingest", root, n)
            if m.returncode:
                raise SystemExit("ingest failed")
        parts = max(args.workers, n // args.docs_per_partition)
        for stage in args.stages:
            _drop(root, STAGES[stage])  # a kept table: as ingested
            local = arm(stage, root, "local", 1, args.workers, work)
            want = _columns_digest(root, STAGES[stage])
            _drop(root, STAGES[stage])
            on_ray = arm(stage, root, "ray", parts, args.workers, work)
            on_ray["equal_to_single_process"] = _columns_digest(root, STAGES[stage]) == want
            on_ray["partitions"] = parts
            for name, a in (("single process", local), (f"Ray x{parts}", on_ray)):
                a["docs_per_cpu_s"] = n / a["cpu_s"]
                print(f"{stage:>10} {n:>10,} {name:>16} {a['wall_s']:8.1f} {a['cpu_s']:8.1f} "
                      f"{a['docs_per_cpu_s']:10,.0f} {a['driver_peak_rss_mb']:9.0f} "
                      f"{a.get('worker_peak_rss_mb', 0):9.0f}", flush=True)
            on_ray["ray_over_single_per_cpu_s"] = on_ray["docs_per_cpu_s"] / local["docs_per_cpu_s"]
            print(f"{'':>10} Ray / single process per CPU-second: "
                  f"{on_ray['ray_over_single_per_cpu_s']:.2f}; columns equal: "
                  f"{on_ray['equal_to_single_process']}", flush=True)
            results.setdefault(stage, {})[n] = {"single": local, "ray": on_ray}
        if not args.keep:
            shutil.rmtree(root, ignore_errors=True)
    lo, hi = min(args.rows), max(args.rows)
    if lo != hi:
        print(f"\ngrowth from {lo:,} to {hi:,} documents ({hi / lo:.0f}x the corpus):")
        for stage in args.stages:
            r = results[stage]
            for key, label in (("driver_peak_rss_mb", "Ray driver peak RSS"),
                               ("worker_peak_rss_mb", "largest Ray worker peak RSS"),
                               ("worker_peak_private_mb", "largest Ray worker private peak")):
                g = r[hi]["ray"][key] / r[lo]["ray"][key]
                r[f"growth_{key}"] = g
                print(f"{stage:>10}: {label} {r[lo]['ray'][key]:.0f} -> "
                      f"{r[hi]['ray'][key]:.0f} MB ({g:.2f}x)")
            g = r[hi]["single"]["driver_peak_rss_mb"] / r[lo]["single"]["driver_peak_rss_mb"]
            print(f"{stage:>10}: single-process peak RSS {g:.2f}x")
    (work / "results.json").write_text(json.dumps(results, indent=1, default=float))
    print(f"\nresults: {work / 'results.json'}")
    return results


if __name__ == "__main__":
    main()
