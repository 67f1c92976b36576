"""Where things live under the data directory (``LANCE_ASSETS_DATA``).

Plain functions, no framework: the Dagster layer, the trainer and the CLIs all agree on the
layout through this module.
"""

from __future__ import annotations

import os
from pathlib import Path

DEFAULT_DATA_DIR = "./data"
DEFAULT_SOURCE = "synthetic"
TABLE_NAME = "corpus"


def data_dir(value: str | os.PathLike | None = None) -> Path:
    """The data root: the argument, else ``$LANCE_ASSETS_DATA``, else ``./data``."""
    raw = value if value is not None else os.environ.get("LANCE_ASSETS_DATA") or DEFAULT_DATA_DIR
    return Path(raw).expanduser().resolve()


def source_spec(value: str | None = None) -> str:
    """The ingest source: the argument, else ``$LANCE_ASSETS_SOURCE``, else ``synthetic``."""
    return value or os.environ.get("LANCE_ASSETS_SOURCE") or DEFAULT_SOURCE


def db_dir(root: str | os.PathLike) -> Path:
    """Folder of the embedded LanceDB database."""
    return Path(root) / "lance"


def table_uri(root: str | os.PathLike, table: str = TABLE_NAME) -> str:
    """Path of the Lance dataset that backs ``table`` (what ``lance.dataset`` opens)."""
    return str(db_dir(root) / f"{table}.lance")


def train_dir(root: str | os.PathLike) -> Path:
    return Path(root) / "train"


def latest_checkpoint_pointer(root: str | os.PathLike) -> Path:
    """A small text file naming the newest finished training run's final checkpoint."""
    return train_dir(root) / "LATEST"


def samples_dir(root: str | os.PathLike) -> Path:
    return Path(root) / "samples"


def tokenizers_dir(root: str | os.PathLike) -> Path:
    """Trained BPE files, each named by its sha256, and ``LATEST`` naming the newest."""
    return Path(root) / "tokenizers"
