"""How many held-out blocks does an ablation need? The held-out error against evaluation size.

    python -m benchmarks.eval_blocks --data DATA RUN_A RUN_B [--blocks 16 64 256 512 1024 4096]

RUN_A and RUN_B are two finished runs of one `curation_ablation` seed (two arms, one held-out
split: ``DATA/ablations/<name>/<arm>-<digest>/seed-<n>``). Their final checkpoints are evaluated
on the first N validation blocks the trainer would take (``train.data.val_blocks``: spread
evenly over the held-out documents) for each N, printing each run's held-out bits/byte with its
standard error over documents, the standard error of the difference between the two runs over
the same documents (what the paired verdict adds to the seed spread), and the seconds one
evaluation takes.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

import torch

from lance_assets.ablation.stats import HeldOut, held_out_difference_se
from lance_assets.table import Table
from lance_assets.train import checkpoint, data
from lance_assets.train.collectives import Collectives
from lance_assets.train.evaluation import evaluate
from lance_assets.train.model import GPT, GPTConfig


def load_run(run: Path) -> tuple[GPT, dict]:
    state = checkpoint.load(checkpoint.list_checkpoints(run)[-1])
    model = GPT(GPTConfig(**{"arch": "nanogpt", **state["model_config"]}))
    model.load_state_dict(state["model"])
    return model, json.loads((run / "summary.json").read_text())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", type=Path, required=True)
    ap.add_argument("runs", type=Path, nargs=2)
    ap.add_argument("--blocks", type=int, nargs="+", default=[16, 64, 256, 512, 1024, 4096])
    args = ap.parse_args()
    os.environ.setdefault("LANCE_LOG", "error")
    (model_a, summary), (model_b, summary_b) = (load_run(r) for r in args.runs)
    if summary["eval_filter"] != summary_b["eval_filter"]:
        raise SystemExit("the two runs were evaluated on different held-out splits")
    table = Table.of(args.data)
    snap = data.open_snapshot(table, summary["table_version"])
    tpb = data.tokens_per_byte(snap, summary["eval_filter"])
    block_len = model_a.cfg.block_size + 1
    comm = Collectives(torch.device("cpu"))
    tok = snap.tokenizer
    print(f"# {args.runs[0].parent.name} vs {args.runs[1].parent.name}, "
          f"{args.runs[0].name}; {torch.get_num_threads()} threads")
    print("| eval blocks | documents | tokens | A bits/byte ± se | B bits/byte ± se | B - A "
          "| se of B - A (held-out) | seconds per evaluation |")
    print("|---:|---:|---:|---:|---:|---:|---:|---:|")
    for n in args.blocks:
        val = data.val_blocks(snap, filter=summary["eval_filter"], block_len=block_len,
                              max_blocks=n)
        t0 = time.perf_counter()
        ev_a = evaluate(model_a, val, tok["pad_id"], comm, 8, torch.no_grad, tok["eos_id"])
        seconds = time.perf_counter() - t0
        ev_b = evaluate(model_b, val, tok["pad_id"], comm, 8, torch.no_grad, tok["eos_id"])
        held = [HeldOut(torch.tensor(ev.doc_loss).double().numpy(),
                        torch.tensor(ev.doc_tokens).double().numpy(), tpb) for ev in (ev_a, ev_b)]
        diff_se, docs = held_out_difference_se([held[0]], [held[1]])
        scale = held[0].scale

        def fmt(ev, scale=scale) -> str:
            se = f"{ev.loss_se * scale:.4f}" if ev.loss_se is not None else "—"
            return f"{ev.loss * scale:.4f} ± {se}"

        print(f"| {len(val)} | {docs} | {sum(ev_a.doc_tokens):,} | {fmt(ev_a)} | {fmt(ev_b)} | "
              f"{(ev_b.loss - ev_a.loss) * scale:+.4f} | "
              f"{diff_se if diff_se is None else round(diff_se, 4)} | {seconds:.2f} |", flush=True)


if __name__ == "__main__":
    main()
