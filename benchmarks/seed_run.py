"""The seed's real workload through Dagster: FineWeb-shaped documents through every corpus stage,
one `dagster asset materialize` per stage, each measured (wall, CPU, peak RSS).

    python -m benchmarks.seed_run --rows 2400000 --work /work/scale-data

Stages, in order: raw_text (ingest of ``synthetic-web:ROWS``), dedup_flag, near_dup,
quality_signals, tokenizer, token_ids, pretrained_model (a short run reading the table). One
fresh DAGSTER_HOME and data folder under ``--work``; results as JSON lines in
``WORK/seed_run.jsonl`` (one per stage, written as each ends) and the Dagster output in
``WORK/seed_run.log``. Meant to run in the background for hours: ``nohup python -m
benchmarks.seed_run ... &``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import time
from pathlib import Path

from benchmarks.measured import run_measured

STAGES = ["raw_text", "dedup_flag", "near_dup", "quality_signals", "tokenizer", "token_ids",
          "pretrained_model"]


def stage_config(stage: str, args) -> dict | None:
    if stage == "pretrained_model":
        # curation_rules needs the taggers (embeddings: days on CPU at this size), so the run
        # takes the two dedup flags as its filter
        return {"ops": {"pretrained_model": {"config": {
            "steps": args.train_steps, "eval_every": args.train_steps,
            "ckpt_every": args.train_steps, "filter": "NOT is_dup AND NOT near_dup",
            "run_name": "seed"}}}}
    return None


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rows", type=int, default=2_400_000)
    p.add_argument("--work", default="/work/scale-data")
    p.add_argument("--stages", nargs="*", default=STAGES)
    p.add_argument("--train-steps", type=int, default=30)
    p.add_argument("--keep", action="store_true", help="keep an existing data folder (resume)")
    args = p.parse_args(argv)
    work = Path(args.work)
    if not args.keep and work.exists():
        shutil.rmtree(work)
    (work / "dagster_home").mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "DAGSTER_HOME": str(work / "dagster_home"),
           "LANCE_ASSETS_DATA": str(work / "data"),
           "LANCE_ASSETS_SOURCE": f"synthetic-web:{args.rows}",
           "LANCE_ASSETS_PROGRESS": "0", "LANCE_LOG": "error"}
    dagster = str(Path(sys.executable).with_name("dagster"))
    results = work / "seed_run.jsonl"
    for stage in args.stages:
        cmd = [dagster, "asset", "materialize", "-m", "lance_assets.definitions", "--select", stage]
        config = stage_config(stage, args)
        if config:
            cmd += ["--config-json", json.dumps(config)]
        m = run_measured(stage, cmd, env=env, log_path=str(work / "seed_run.log"))
        row = {**m.to_dict(), "rows": args.rows, "ended": time.strftime("%Y-%m-%dT%H:%M:%S"),
               "load_avg_1m": round(os.getloadavg()[0], 2),
               "data_gb": round(sum(f.stat().st_size for f in (work / "data").rglob("*")
                                    if f.is_file()) / 1e9, 2)}
        with open(results, "a") as fh:
            fh.write(json.dumps(row) + "\n")
        print(json.dumps(row), flush=True)
        if m.returncode != 0:
            print(f"{stage} failed (exit {m.returncode}); see {work / 'seed_run.log'}", flush=True)
            break


if __name__ == "__main__":
    main()
