#!/usr/bin/env bash
# One GPU, one prepared check, under 8 minutes: `small` (GPT-2 124M shape) in bf16 with
# --compile through torchrun with 1 process, so the process group, DDP and the NCCL path run
# exactly as on eight GPUs. Prints tokens/s, MFU and the data-wait share at steady state.
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

# 300 steps x 16 x 1024 tokens = 4.9M tokens; compile takes the first minute or two.
timeout 420 "$PY" -m torch.distributed.run --standalone --nproc-per-node 1 -m lance_assets.train \
  --data "$WORK/data" --out "$WORK/run-$ARCH" --model small --arch "$ARCH" --dtype bfloat16 \
  --compile --seq-len 1024 --batch-size 16 --steps "$STEPS" --warmup 30 --lr 6e-4 --min-lr 6e-5 \
  --filter "NOT is_dup" --eval-every "$STEPS" --eval-blocks 32 --ckpt-every 1000000 --log-every 50

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
PYEOF
