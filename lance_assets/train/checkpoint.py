"""Atomic checkpoints, loaded without running code from the file.

Written with ``storage.write_atomic`` under its final name (``ckpt_0000100.pt``): on a local disk
a hidden temp file in the same folder, fsynced, renamed and the folder fsynced; on object storage
one PUT, published whole or not at all. A kill at any moment leaves either the previous
checkpoints or the new one, never a half-written file under a checkpoint's name. The run folder
may be local or under an object-store data root (``s3://bucket/prefix/train/RUN``).

Loading uses ``torch.load(weights_only=True)``: only tensors and plain containers unpickle, so a
file that is not ours (or was tampered with) is refused instead of executing whatever its pickle
asks for. What we store is exactly that: tensors, dicts, lists, strings and numbers.
A file that fails to load for any reason (not a zip, a pickle torch cannot read, keys a run
needs missing) is a ``CheckpointError`` naming the file and the reason: ``--resume auto`` skips a
newest checkpoint that does not load and takes the one before it; a file named by ``--resume`` or
``sample --ckpt`` must load, and the CLI says why in one line.
"""

from __future__ import annotations

import io
import pickle
import re
from collections.abc import Callable
from pathlib import Path

from lance_assets import storage
from lance_assets.storage import Location

CKPT_RE = re.compile(r"^ckpt_(\d+)\.pt$")
FORMAT = "lance_assets.checkpoint/1"
RESUME_KEYS = ("model", "optimizer", "step", "epoch", "tokens_seen", "loader", "world_size",
               "model_config", "table_version")
"""What a resume reads (``train.setup``); ``save`` in ``train.run`` writes them all."""
SAMPLE_KEYS = ("step", "model", "model_config", "tokenizer")
"""What ``python -m lance_assets.sample`` reads."""


class CheckpointError(RuntimeError):
    """A file that is not a complete checkpoint of ours; the message says which and why."""


def save_atomic(state: dict, out_dir: str | Path, step: int, keep: int = 2) -> Location:
    out = storage.location(out_dir)
    final = out / f"ckpt_{step:07d}.pt"
    buf = io.BytesIO()
    import torch  # here, not at import: listing checkpoints (the Dagster side) needs no torch

    torch.save({"format": FORMAT, **state}, buf)
    storage.write_atomic(final, buf.getvalue())
    storage.remove_partial_writes(out, "ckpt_*.pt")  # temp files of killed runs (local disks)
    for old in list_checkpoints(out)[:-keep] if keep > 0 else []:
        old.unlink(missing_ok=True)
    return final


def list_checkpoints(out_dir: str | Path) -> list[Location]:
    """Complete checkpoints in ``out_dir``, oldest first."""
    out = storage.location(out_dir)
    try:
        found = [(int(m.group(1)), p) for p in out.iterdir() if (m := CKPT_RE.match(p.name))]
    except (FileNotFoundError, NotADirectoryError):
        return []
    return [p for _, p in sorted(found)]


def load(path: str | Path, need: tuple[str, ...] = ("step",)) -> dict:
    """A checkpoint written by ``save_atomic`` holding the keys ``need`` names;
    ``CheckpointError`` naming the file and the reason for anything else (whatever exception
    reading or unpickling it raised)."""
    try:
        data = storage.read_bytes(path)
    except (FileNotFoundError, IsADirectoryError, PermissionError) as e:
        raise CheckpointError(f"{path}: not a readable checkpoint ({type(e).__name__})") from None
    import torch  # here, not at import: listing checkpoints (the Dagster side) needs no torch

    try:
        state = torch.load(io.BytesIO(data), map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise CheckpointError(f"{path}: refused, it holds more than tensors and plain values "
                              f"({first[:200]}); only checkpoints written by this trainer load") from None
    except Exception as e:  # noqa: BLE001 - arbitrary bytes raise anything (IndexError, KeyError, struct.error)
        said = str(e).strip().splitlines()[0][:200] if str(e).strip() else ""
        raise CheckpointError(f"{path}: not a readable checkpoint ({type(e).__name__}"
                              + (f": {said}" if said else "") + ")") from None
    if not isinstance(state, dict) or "step" not in state:
        raise CheckpointError(f"{path}: not a lance_assets checkpoint (no step recorded)")
    missing = [k for k in need if k not in state]
    if missing:
        raise CheckpointError(f"{path}: not a complete lance_assets checkpoint (no "
                              f"{', '.join(missing)})")
    for key in ("model", "model_config"):
        if key in need and not isinstance(state[key], dict):
            raise CheckpointError(f"{path}: not a lance_assets checkpoint ({key} is a "
                                  f"{type(state[key]).__name__}, not a mapping)")
    return state


def resolve_resume(resume: str | None, out_dir: str | Path) -> Location | None:
    """``auto``: the newest checkpoint in ``out_dir`` (None if there is none); else a path."""
    if not resume:
        return None
    if resume == "auto":
        found = list_checkpoints(out_dir)
        return found[-1] if found else None
    path = storage.location(resume)
    if not path.is_file():
        raise FileNotFoundError(f"--resume {resume}: no such checkpoint file")
    return path


def load_for_resume(resume: str | None, out_dir: str | Path,
                    log: Callable[[str], None] = print) -> tuple[Location | None, dict | None]:
    """The checkpoint ``--resume`` names, loaded. With ``auto``, newest first: one that does not
    load is reported and skipped for the one before it. A named file must load."""
    if not resume:
        return None, None
    if resume != "auto":
        path = resolve_resume(resume, out_dir)
        return path, load(path, RESUME_KEYS)
    for path in reversed(list_checkpoints(out_dir)):
        try:
            return path, load(path, RESUME_KEYS)
        except CheckpointError as e:
            log(f"--resume auto: skipping {e}")
    return None, None
