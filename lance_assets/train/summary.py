"""The run's summary: ``OUT/summary.json`` (what was trained on what, how fast, the held-out
loss), the held-out losses per document beside it, and the Pipes materialization."""

from __future__ import annotations

import json
import time

from lance_assets import paths, storage
from lance_assets.train import mixture
from lance_assets.train.loop import LoopResult
from lance_assets.train.run import Run


def finish(run: Run, loop: LoopResult) -> dict:
    """The run's summary: written with the held-out losses per document (rank 0), reported as
    the Pipes materialization, returned."""
    cfg, d, p, report = run.cfg, run.run_data, run.progress, run.report
    elapsed = time.perf_counter() - loop.t_start
    rate = (p.tokens_seen - loop.start_tokens) / max(elapsed, 1e-9)
    if loop.interrupted:
        report.log(f"interrupted at step {p.step}; checkpoint {loop.last_ckpt}; "
                   f"{report.resume_hint}")
    summary = summarize(run, loop, elapsed, rate)
    last_eval = loop.last_eval
    if run.comm.rank == 0:  # the held-out losses per document first: a summary names a finished run
        storage.write_atomic(run.out / paths.HELD_OUT_FILE, json.dumps({
            "step": loop.val_step, "tokens_per_byte": d.val_tokens_per_byte,
            "doc_loss": [round(v, 6) for v in last_eval.doc_loss],
            "doc_tokens": last_eval.doc_tokens}).encode())
        storage.write_atomic(run.out / "summary.json", json.dumps(summary, indent=2).encode())
    report.materialize(mixture.flat(summary))
    if loop.val_step > loop.start_step:
        val_text = f"val loss {loop.first_val:.4f} -> {loop.val_loss:.4f}"
    else:
        val_text = (f"no evaluation ran after step {loop.start_step} (eval_every "
                    f"{cfg.eval_every}); val loss at step {loop.start_step}: {loop.first_val:.4f}")
    report.log(f"done: step {p.step}, {val_text}, {rate:,.0f} tok/s")
    return summary


def summarize(run: Run, loop: LoopResult, elapsed: float, rate: float) -> dict:
    """``summary.json``: what was trained on what, how fast, and the held-out loss."""
    cfg, d, p, net, bpb = run.cfg, run.run_data, run.progress, run.net, run.bpb
    last_eval = loop.last_eval
    final_bpb = bpb(loop.val_loss)
    run_mfu = run.mfu(p.tokens_seen - loop.start_tokens, loop.step_time)
    summary = {
        "checkpoint": str(loop.last_ckpt), "step": p.step, "steps_requested": d.steps,
        "interrupted": loop.interrupted, "model": cfg.model, "arch": cfg.arch,
        "params_m": round(net.model.num_params() / 1e6, 3), "world_size": run.comm.world,
        "global_batch": d.global_batch, "dtype": "bfloat16" if net.use_bf16 else "float32",
        "table_version": d.snap.version, "table_tag": d.table_tag or "",
        "redacted": d.redacted,  # forget took documents from its snapshot during the run
        "filter": d.split.train.lance, "eval_filter": d.split.val.lance,
        "run_filter": d.filter.text, "run_filter_source": d.filter.source,
        "tokenizer": d.tok["name"], "tokenizer_sha256": d.tok["sha256"],
        "tokens_seen": p.tokens_seen, "tokens_per_s": round(rate, 1),
        "train_seconds": round(elapsed, 2),
        "data_wait_share": round(loop.data_wait / loop.step_time, 4) if loop.step_time else None,
        "first_val_loss": round(loop.first_val, 4), "val_loss": round(loop.val_loss, 4),
        "val_loss_step": loop.val_step,
        "val_bpb": round(final_bpb, 4) if final_bpb else None,
        "val_loss_se": round(last_eval.loss_se, 5) if last_eval.loss_se is not None else None,
        "val_bpb_se": round(bpb(last_eval.loss_se), 5) if bpb(last_eval.loss_se) is not None
        else None,
        "eval_blocks": len(d.val), "eval_docs": len(last_eval.doc_tokens),
        "eval_tokens": sum(last_eval.doc_tokens),
        "train_loss": round(loop.loss, 4) if p.step > loop.start_step else None,
        "blocks_per_epoch": d.blocks_per_epoch, "git_commit": run.commit,
    }
    if run_mfu is not None:
        summary["mfu"] = round(run_mfu, 4)
    if d.mixture is not None and run.loader is not None:
        summary["domains"] = mixture.read_by_domain(run.loader, d.mixture)
    return summary
