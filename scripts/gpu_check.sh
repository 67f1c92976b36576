#!/usr/bin/env bash
# One GPU, one prepared check, under 8 minutes: the reference recipe's 8-GPU line (docs/seeds.md,
# row 1.11) on one rank: `small` (GPT-2 124M shape) in bf16 with --compile, batch 32 x accum 2 at
# seq 1024, one rank's 16 of its 128 splits, its loader flags and --num-workers 2, through
# torchrun with 1 process, so the process group, DDP, the NCCL path and the loader's worker
# processes run exactly as on eight GPUs. Prints tokens/s, MFU and the data-wait share at
# steady state, then checks that the first steps' blocks equal those of --num-workers 0.
#
#   scripts/gpu_check.sh            # GPU_CHECK_DIR=/path keeps the table for a rerun
#   ARCH=modern scripts/gpu_check.sh
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-.venv/bin/python}
WORK=${GPU_CHECK_DIR:-$(mktemp -d /tmp/gpu_check.XXXXXX)}
ARCH=${ARCH:-nanogpt}
STEPS=${STEPS:-300}
export LANCE_LOG=error
START=$(date +%s)

"$PY" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 'no CUDA device visible to torch')"
"$PY" -c "import torch; print('gpu:', torch.cuda.get_device_name(0), '| torch', torch.__version__)"

# A synthetic corpus with the demo's BPE: ~20k documents, enough for the steps below (epochs
# repeat if not). Skipped when GPU_CHECK_DIR already holds it.
"$PY" - "$WORK/data" <<'PYEOF'
import sys
from pathlib import Path
from lance_assets import paths
from lance_assets.tokens.bpe import train_bpe
from lance_assets.curation.dedup_flag import dedup_flag
from lance_assets.ingest.raw_text import ingest
from lance_assets.tokens.token_ids import token_ids

root = Path(sys.argv[1])
quiet = lambda _m: None
if not Path(paths.table_uri(root)).exists():
    ingest(root, "synthetic:20000", log=quiet)
    dedup_flag(root, log=quiet)
    train_bpe(root, log=quiet)
    token_ids(root, log=quiet)
print("table ready:", root)
PYEOF

# 300 steps x 64 x 1024 tokens = 19.7M tokens; compile takes the first minute or two.
LINE=(--data "$WORK/data" --model small --arch "$ARCH" --dtype bfloat16 --pack --seq-len 1024
      --batch-size 32 --grad-accum 2 --num-splits 16 --read-batch-size 8 --io-queue-depth 1
      --transform-parallelism 2 --transform-queue-depth 16 --warmup 30 --lr 6e-4 --min-lr 6e-5
      --filter "NOT is_dup" --ckpt-every 1000000 --log-batch-hashes)
timeout 420 "$PY" -m torch.distributed.run --standalone --nproc-per-node 1 -m lance_assets.train \
  "${LINE[@]}" --out "$WORK/run-$ARCH" --compile --num-workers 2 --steps "$STEPS" \
  --eval-every "$STEPS" --eval-blocks 32 --log-every 50
# the worker path's order on this machine: 20 steps without workers (no compile: same blocks)
timeout 180 "$PY" -m torch.distributed.run --standalone --nproc-per-node 1 -m lance_assets.train \
  "${LINE[@]}" --out "$WORK/run-$ARCH-0w" --num-workers 0 --steps 20 --eval-every 1000 \
  --eval-blocks 8 --log-every 10

"$PY" - "$WORK/run-$ARCH" "$START" <<'PYEOF'
import json, statistics, sys, time
from pathlib import Path

run, start = Path(sys.argv[1]), float(sys.argv[2])
summary = json.loads((run / "summary.json").read_text())
rows = [json.loads(l) for l in (run / "metrics.jsonl").read_text().splitlines() if '"loss"' in l]
for prev, row in zip(rows, rows[1:]):
    row["step_tokens"] = row["tokens"] - prev["tokens"]
steady = [r for r in rows[len(rows) // 5:] if "step_tokens" in r]  # past compile and warm-up
seconds = sum(r["step_tokens"] / r["tokens_per_s"] for r in steady)
tok_s = sum(r["step_tokens"] for r in steady) / seconds
wait = sum(r["data_wait_s"] for r in steady) / seconds
mfu = statistics.median(r["mfu"] for r in steady) if "mfu" in steady[0] else None
print(f"steady state, steps {steady[0]['step']}-{steady[-1]['step']}: {tok_s:,.0f} tokens/s, "
      + (f"MFU {mfu:.1%}" if mfu is not None else "MFU n/a (GPU not in PEAK_FLOPS)")
      + f", data-wait share {wait:.2%}")
print(f"whole run, compile included: {summary['tokens_per_s']:,.0f} tokens/s, data-wait share "
      f"{summary['data_wait_share']:.2%}, world {summary['world_size']}, {summary['dtype']}, "
      f"val bpb {summary['val_bpb']}; {time.time() - start:.0f}s for this script")
alone = {r["step"]: r["batch_hashes"] for r in
         (json.loads(l) for l in (run.parent / (run.name + "-0w") / "metrics.jsonl").read_text()
          .splitlines() if '"batch_hashes"' in l)}
same = all(r["batch_hashes"] == alone[r["step"]] for r in rows if r["step"] in alone)
print(f"blocks of steps 1-{max(alone)} with --num-workers 2 equal those with 0: {same}")
sys.exit(0 if same and len(alone) == 20 else 1)
PYEOF
