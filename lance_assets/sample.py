"""Generate text from a trained checkpoint.

    python -m lance_assets.sample --prompt "The bright star" --num-samples 3
    python -m lance_assets.sample --ckpt data/train/<run>/ckpt_0000300.pt --json

Without ``--ckpt`` it uses the checkpoint named by ``DATA/train/LATEST`` (written by the
``pretrained_model`` asset). PAD and the embedding table's padding rows are never sampled.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

import torch

from lance_assets import paths, storage
from lance_assets.keys import DEFAULT_PROMPTS
from lance_assets.tokens.tokenizers import load_tokenizer
from lance_assets.train import checkpoint
from lance_assets.train.model import GPT, GPTConfig


def latest_checkpoint(root: str | os.PathLike) -> Path:
    pointer = paths.latest_checkpoint_pointer(root)
    if not pointer.is_file():
        raise FileNotFoundError(
            f"{pointer} does not exist: materialize `pretrained_model` first, or pass --ckpt PATH"
        )
    return storage.location(pointer.read_text().strip())


def load_model(ckpt_path: str | os.PathLike) -> tuple[GPT, dict]:
    """The checkpoint's model; ``checkpoint.CheckpointError`` naming the file and the reason
    when it does not load or its weights do not fit its own model config."""
    state = checkpoint.load(ckpt_path, checkpoint.SAMPLE_KEYS)
    try:
        model = GPT(GPTConfig(**state["model_config"]))
        model.load_state_dict(state["model"])
    except Exception as e:  # noqa: BLE001 - the file's contents, whatever they hold
        said = str(e).strip().splitlines()[0][:200] if str(e).strip() else ""
        raise checkpoint.CheckpointError(f"{ckpt_path}: its weights do not make a model "
                                         f"({type(e).__name__}: {said})") from None
    model.eval()
    # the run's data dir: where a trained BPE named in the checkpoint (bpe:<sha256>) lives
    return model, {**state["tokenizer"], "data_dir": state.get("args", {}).get("data")}


def generate_samples(ckpt_path: str | os.PathLike, prompts: list[str], *, max_new_tokens: int = 200,
                     temperature: float = 0.8, top_k: int | None = 40, seed: int = 0) -> list[dict]:
    model, info = load_model(ckpt_path)
    tok = load_tokenizer(info["name"], info.get("data_dir"))
    banned = [info["pad_id"], *range(info["vocab_size"], model.cfg.vocab_size)]
    torch.manual_seed(seed)
    out = []
    for prompt in prompts:
        ids = tok.encode(prompt) if prompt else [info["eos_id"]]
        idx = torch.tensor([ids], dtype=torch.long)
        gen = model.generate(idx, max_new_tokens, temperature=temperature, top_k=top_k,
                             banned=banned)[0, len(ids):].tolist()
        out.append({"prompt": prompt, "completion": tok.decode(gen), "token_ids": gen})
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m lance_assets.sample", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data", default=None, help="data root (default $LANCE_ASSETS_DATA or ./data)")
    p.add_argument("--ckpt", default=None, help="checkpoint file (default: DATA/train/LATEST)")
    p.add_argument("--prompt", action="append", default=None, help="repeatable; '' = unconditional")
    p.add_argument("--max-new-tokens", type=int, default=200)
    p.add_argument("--temperature", type=float, default=0.8)
    p.add_argument("--top-k", type=int, default=40)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", action="store_true", help="print JSON instead of text")
    args = p.parse_args(argv)
    try:
        ckpt = args.ckpt or latest_checkpoint(paths.data_dir(args.data))
        samples = generate_samples(ckpt, args.prompt or DEFAULT_PROMPTS,
                                   max_new_tokens=args.max_new_tokens,
                                   temperature=args.temperature, top_k=args.top_k, seed=args.seed)
    except (checkpoint.CheckpointError, FileNotFoundError) as e:  # the user's file: one line
        print(f"{p.prog}: error: {'--ckpt ' if args.ckpt else ''}{e}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps([{k: s[k] for k in ("prompt", "completion")} for s in samples], indent=2))
    else:
        for s in samples:
            print(f"--- prompt: {s['prompt']!r}\n{s['prompt']}{s['completion']}\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
