"""Atomic checkpoints: a checkpoint file exists only once it is complete.

Written to a hidden temp file in the same folder, fsynced, then renamed over its final name
(``ckpt_0000100.pt``) and the folder fsynced. A kill at any moment leaves either the previous
checkpoints or the new one, never a half-written file under a checkpoint's name.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import torch

CKPT_RE = re.compile(r"^ckpt_(\d+)\.pt$")


def save_atomic(state: dict, out_dir: str | Path, step: int, keep: int = 2) -> Path:
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    final = out / f"ckpt_{step:07d}.pt"
    tmp = out / f".{final.name}.tmp-{os.getpid()}"
    with open(tmp, "wb") as fh:
        torch.save(state, fh)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, final)
    dir_fd = os.open(out, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)
    for stale in out.glob(".ckpt_*.pt.tmp-*"):  # partial writes of killed runs
        stale.unlink(missing_ok=True)
    for old in list_checkpoints(out)[:-keep] if keep > 0 else []:
        old.unlink(missing_ok=True)
    return final


def list_checkpoints(out_dir: str | Path) -> list[Path]:
    """Complete checkpoints in ``out_dir``, oldest first."""
    out = Path(out_dir)
    if not out.is_dir():
        return []
    found = [(int(m.group(1)), p) for p in out.iterdir() if (m := CKPT_RE.match(p.name))]
    return [p for _, p in sorted(found)]


def load(path: str | Path) -> dict:
    return torch.load(path, map_location="cpu", weights_only=False)


def resolve_resume(resume: str | None, out_dir: str | Path) -> Path | None:
    """``auto``: the newest checkpoint in ``out_dir`` (None if there is none); else a path."""
    if not resume:
        return None
    if resume == "auto":
        found = list_checkpoints(out_dir)
        return found[-1] if found else None
    path = Path(resume)
    if not path.is_file():
        raise FileNotFoundError(f"--resume {resume}: no such checkpoint file")
    return path
