"""The mixture loader against the single stream: CPU per block, and threads.

    python -m benchmarks.mixture_loader [--docs 3000] [--blocks 4000] [--rounds 3]

One table (``lance_assets.testing.mixture_planted.planted_domains``, byte tokens), one rank,
8 splits, blocks of 65 tokens: ``data.TrainBatches`` over every document (what a run without
``--domains`` reads) against ``mixture.MixtureBatches`` over its three domains at 0.5 / 0.3 /
0.2 (one stream per domain and split), each reading ``--blocks`` blocks from a fresh start,
in interleaved rounds. Prints CPU milliseconds per 1,000 blocks (this process, every thread),
wall milliseconds, the ratio, and the threads alive at the end of each.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import resource
import statistics
import tempfile
import threading
import time
from pathlib import Path

import pyarrow.parquet as pq

from lance_assets.curation import dedup_flag
from lance_assets.ingest.raw_text import ingest
from lance_assets.table import Table
from lance_assets.table.producer import produce
from lance_assets.testing.mixture_planted import planted_domains, url_domains
from lance_assets.tokens import token_ids

WEIGHTS = {"prose": 0.5, "code": 0.3, "junk": 0.2}


def cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def build(work: Path, docs: int) -> Path:
    root = work / "data"
    if not Table.of(root).exists():
        work.mkdir(parents=True, exist_ok=True)
        pq.write_table(planted_domains(docs), work / "corpus.parquet")
        quiet = lambda _m: None  # noqa: E731
        ingest(Table.of(root), str(work / "corpus.parquet"), log=quiet)
        produce(dedup_flag.PRODUCER, Table.of(root), log=quiet)
        produce(token_ids.PRODUCER, Table.of(root), token_ids.TokenIdsSettings(tokenizer="byte"),
                log=quiet)
    return root


def main() -> None:
    from lance_assets.train import data, mixture

    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--docs", type=int, default=3000)
    ap.add_argument("--blocks", type=int, default=4000)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--work", type=Path, default=None)
    args = ap.parse_args()
    os.environ.setdefault("LANCE_LOG", "error")
    work = args.work or Path(tempfile.mkdtemp(prefix="mixture-loader-"))
    root = build(work, args.docs)
    snap = data.open_snapshot(Table.of(root))
    columns = snap.table.schema.names
    train = data.splits("NOT is_dup", 20, columns).train
    block_len, batch = 65, 8
    blocks = data.count_blocks(snap, train.lance, block_len, 8)
    mix = mixture.plan_mixture(snap, domains=json.dumps(url_domains(WEIGHTS)),
                               weights=json.dumps(WEIGHTS), train=train, block_len=block_len,
                               num_splits=8, steps=args.blocks // batch, global_batch=batch,
                               seed=0, max_repeats=4)

    def single(out: Path):
        return data.TrainBatches(snap, epoch=0, state=None, batch_size=batch, filter=train.lance,
                                 block_len=block_len, blocks_per_epoch=blocks, num_splits=8,
                                 rank=0, world_size=1, seed=0, permutations=out)

    def mixed(out: Path):
        return mixture.MixtureBatches(snap, mix, state=None, batch_size=batch,
                                      block_len=block_len, num_splits=8, rank=0, world_size=1,
                                      seed=0, permutations=out)

    found: dict[str, list[tuple[float, float, int]]] = {"single stream": [], "mixture": []}
    for r in range(args.rounds):
        for name, make in (("single stream", single), ("mixture", mixed)):
            out = work / f"perm-{name[0]}-{r}"
            loader = make(out)  # the permutation is built here, outside the timing
            c0, t0 = cpu(), time.perf_counter()
            for _ in range(args.blocks // batch):
                next(loader)
            found[name].append((cpu() - c0, time.perf_counter() - t0, threading.active_count()))
            del loader
            gc.collect()  # the streams refer to their loader: a cycle
    print(f"# {os.cpu_count()} CPUs, load {os.getloadavg()[0]:.1f}; {args.blocks} blocks of "
          f"{block_len} tokens per round, {args.rounds} rounds (median)")
    print("| loader | CPU ms / 1k blocks | wall ms / 1k blocks | threads alive |")
    print("|---|---:|---:|---:|")
    med = {}
    for name, rows in found.items():
        c = statistics.median(x[0] for x in rows) / args.blocks * 1e6
        w = statistics.median(x[1] for x in rows) / args.blocks * 1e6
        med[name] = c
        print(f"| {name} | {c:.0f} | {w:.0f} | {max(x[2] for x in rows)} |")
    print(f"mixture / single stream, CPU per block: {med['mixture'] / med['single stream']:.2f}x")


if __name__ == "__main__":
    main()
