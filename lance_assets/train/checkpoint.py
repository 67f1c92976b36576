"""Atomic checkpoints, loaded without running code from the file.

Written to a hidden temp file in the same folder, fsynced, then renamed over its final name
(``ckpt_0000100.pt``) and the folder fsynced. A kill at any moment leaves either the previous
checkpoints or the new one, never a half-written file under a checkpoint's name.

Loading uses ``torch.load(weights_only=True)``: only tensors and plain containers unpickle, so a
file that is not ours (or was tampered with) is refused instead of executing whatever its pickle
asks for. What we store is exactly that: tensors, dicts, lists, strings and numbers.
``--resume auto`` skips a newest checkpoint that does not load and takes the one before it.
"""

from __future__ import annotations

import os
import pickle
import re
import zipfile
from pathlib import Path
from typing import Callable

import torch

CKPT_RE = re.compile(r"^ckpt_(\d+)\.pt$")
FORMAT = "lance_assets.checkpoint/1"


class CheckpointError(RuntimeError):
    """A file that is not a complete checkpoint of ours; the message says which and why."""


def save_atomic(state: dict, out_dir: str | Path, step: int, keep: int = 2) -> Path:
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    final = out / f"ckpt_{step:07d}.pt"
    tmp = out / f".{final.name}.tmp-{os.getpid()}"
    with open(tmp, "wb") as fh:
        torch.save({"format": FORMAT, **state}, fh)
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
    """A checkpoint written by ``save_atomic``; ``CheckpointError`` for anything else."""
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise CheckpointError(f"{path}: refused, it holds more than tensors and plain values "
                              f"({first[:200]}); only checkpoints written by this trainer load") from None
    except (RuntimeError, EOFError, zipfile.BadZipFile, OSError, ValueError) as e:
        raise CheckpointError(f"{path}: not a readable checkpoint ({type(e).__name__}: "
                              f"{str(e).strip().splitlines()[0][:200] if str(e).strip() else ''})") from None
    if not isinstance(state, dict) or "step" not in state:
        raise CheckpointError(f"{path}: not a lance_assets checkpoint (no step recorded)")
    return state


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


def load_for_resume(resume: str | None, out_dir: str | Path,
                    log: Callable[[str], None] = print) -> tuple[Path | None, dict | None]:
    """The checkpoint ``--resume`` names, loaded. With ``auto``, newest first: one that does not
    load is reported and skipped for the one before it. A named file must load."""
    if not resume:
        return None, None
    if resume != "auto":
        path = resolve_resume(resume, out_dir)
        return path, load(path)
    for path in reversed(list_checkpoints(out_dir)):
        try:
            return path, load(path)
        except CheckpointError as e:
            log(f"--resume auto: skipping {e}")
    return None, None
