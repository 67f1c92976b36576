"""Which curation trains the better model, on real text: `curation_ablation` end to end.

    python -m benchmarks.ablation [--mb 4] [--seeds 0 1 2] [--token-budget 163840]
                                  [--eval-blocks 512] [--work DIR] [--name bench]

Builds the corpus the tokenizer benchmark uses (``benchmarks.tokenize_bench.build_corpus``: the
Python sources and docs installed on this machine and /usr/share/doc, real text, offline),
ingests it, flags exact and near duplicates, computes the quality signals and byte-tokenizes it
(bits/byte exact). Then materializes the `curation_ablation` asset (torchrun through Dagster
Pipes, one run per arm and seed, the `tiny` preset) with four rule sets, and prints its table
with each arm's held-out bits/byte as a ratio to the `no_rules` arm measured in the same run.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import tempfile
import time
from pathlib import Path

from benchmarks.tokenize_bench import build_corpus
from lance_assets import paths
from lance_assets.curation import dedup_flag, near_dup, quality_signals
from lance_assets.curation.rules import DEFAULT_RULES
from lance_assets.ingest.raw_text import ingest
from lance_assets.table import Table
from lance_assets.table.producer import produce
from lance_assets.tokens import token_ids

RULE_SETS = {
    "no_rules": {},
    "exact_dedup": {"exact_dup": "NOT is_dup"},
    "prose": {"exact_dup": "NOT is_dup", "alpha_words": "alpha_word_share >= 0.8",
              "stop_words": "stop_word_count >= 2"},
    "curation_default": dict(DEFAULT_RULES),
}


def prepare(work: Path, mb: float) -> Path:
    root = work / "data"
    if Table.of(root).exists():
        return root
    quiet = lambda _m: None  # noqa: E731
    source, docs, nbytes = build_corpus(work / "corpus" / "local_text.parquet", int(mb * 1e6))
    print(f"# corpus: {docs:,} local text files, {nbytes / 1e6:.1f} MB")
    ingest(Table.of(root), str(source), log=quiet)
    produce(dedup_flag.PRODUCER, Table.of(root), log=quiet)
    produce(near_dup.PRODUCER, Table.of(root), log=quiet)
    produce(quality_signals.PRODUCER, Table.of(root), log=quiet)
    produce(token_ids.PRODUCER, Table.of(root), token_ids.TokenIdsSettings(tokenizer="byte"), log=quiet)
    return root


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--mb", type=float, default=4.0, help="MB of local text to ingest")
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--token-budget", type=int, default=163_840, help="target tokens per arm")
    ap.add_argument("--eval-blocks", type=int, default=512, help="held-out blocks per evaluation")
    ap.add_argument("--name", default="bench", help="the ablation's name (a new one pins the "
                                                    "newest version and trains anew)")
    ap.add_argument("--seq-len", type=int, default=64)
    ap.add_argument("--batch-size", type=int, default=16)
    ap.add_argument("--work", type=Path, default=None, help="keep the table and runs here")
    args = ap.parse_args()
    os.environ.setdefault("LANCE_LOG", "error")

    import dagster as dg

    from lance_assets.definitions import defs
    from lance_assets.defs.resources import LanceStore
    from lance_assets.defs.training.torchrun import TorchrunPipesClient

    work = args.work or Path(tempfile.mkdtemp(prefix="ablation-bench-"))
    t0 = time.perf_counter()
    root = prepare(work, args.mb)
    print(f"# prepared in {time.perf_counter() - t0:.0f} s; {platform.processor() or platform.machine()}, "
          f"{os.cpu_count()} CPUs")
    config = {"name": args.name, "rule_sets": RULE_SETS, "seeds": args.seeds, "model": "tiny",
              "seq_len": args.seq_len, "batch_size": args.batch_size,
              "token_budget": args.token_budget, "eval_blocks": args.eval_blocks,
              "evals_per_run": 4}
    t0 = time.perf_counter()
    res = dg.materialize(
        [defs.get_assets_def("curation_ablation")],
        resources={"lance_store": LanceStore(data_dir=str(root)),
                   "pipes_subprocess_client": TorchrunPipesClient(termination_timeout_seconds=55)},
        run_config={"ops": {"curation_ablation": {"config": config}}})
    meta = res.asset_materializations_for_node("curation_ablation")[0].metadata
    elapsed = time.perf_counter() - t0
    results = json.loads((paths.ablation_dir(root, args.name) / "results.json").read_text())
    base = next(a["val_mean"] for a in results["arms"] if a["arm"] == "no_rules")
    print(f"# {meta['runs_trained'].value} runs ({meta['runs_reused'].value} reused) in "
          f"{elapsed:.0f} s; {meta['tokens_per_arm'].value:,} tokens per arm, "
          f"{meta['held_out_docs'].value:,} held-out documents (NOT is_dup, 10 % by id hash)")
    print("| arm | docs kept | tokens kept | share | epochs needed | seeds | val bpb mean ± sd "
          "| ratio to no_rules | tokens/s |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for a in results["arms"]:
        val = (f"{a['val_mean']:.4f} ± {a['val_sd']:.4f}" if a["val_sd"] is not None else
               f"{a['val_mean']:.4f}" if a["val_mean"] is not None else "not trained")
        ratio = f"{a['val_mean'] / base:.3f}" if a["val_mean"] is not None and base else "—"
        print(f"| {a['arm']} | {a['docs_kept']:,} | {a['tokens_kept']:,} | {a['share']:.3f} | "
              f"{a['epochs_needed']} | {a['seeds']} | {val} | {ratio} | "
              f"{a['tokens_per_s'] or '—'} |")
    print(f"\nbest arm: {results['verdict']}")
    for a in results["arms"]:
        if a["note"]:
            print(f"- {a['arm']}: {a['note']}")


if __name__ == "__main__":
    main()
