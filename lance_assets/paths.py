"""Where things live under the data root (``LANCE_ASSETS_DATA``).

Plain functions, no framework: the Dagster layer, the trainer and the CLIs all agree on the
layout through this module. The root is a local folder (returned as an absolute ``Path``) or an
object-store URI such as ``s3://bucket/prefix`` (returned as a ``upath.UPath``; see
``lance_assets.storage`` and docs/object-storage.md). Both support ``/``, ``read_text``,
``is_file`` and ``iterdir``; writes go through ``storage.write_atomic``.
"""

from __future__ import annotations

import os

from lance_assets import storage
from lance_assets.storage import Location

DEFAULT_DATA_DIR = "./data"
DEFAULT_SOURCE = "synthetic"
TABLE_NAME = "corpus"
HELD_OUT_FILE = "held_out.json"
"""In a run folder: the last validation pass's summed loss and target tokens per document."""


def data_dir(value: str | os.PathLike | None = None) -> Location:
    """The data root: the argument, else ``$LANCE_ASSETS_DATA``, else ``./data``. A local root
    is made absolute; an object-store URI is checked (no credentials in it, see ``storage``)."""
    raw = value if value is not None else os.environ.get("LANCE_ASSETS_DATA") or DEFAULT_DATA_DIR
    root = storage.location(raw)
    return root if storage.is_object_store(root) else root.resolve()


def source_spec(value: str | None = None) -> str:
    """The ingest source: the argument, else ``$LANCE_ASSETS_SOURCE``, else ``synthetic``."""
    return value or os.environ.get("LANCE_ASSETS_SOURCE") or DEFAULT_SOURCE


def _root(root: str | os.PathLike) -> Location:
    return storage.location(root)


def db_dir(root: str | os.PathLike) -> Location:
    """Folder of the embedded LanceDB database."""
    return _root(root) / "lance"


def table_uri(root: str | os.PathLike, table: str = TABLE_NAME) -> str:
    """URI of the Lance dataset that backs ``table`` (what ``lance.dataset`` opens)."""
    return storage.uri_of(db_dir(root) / f"{table}.lance")


def ingest_lock_path(root: str | os.PathLike, table: str = TABLE_NAME) -> Location:
    """The ingest lock: a file (flock) on local disks, a lease folder on object storage."""
    return db_dir(root) / f"{table}.ingest.lock"


def train_dir(root: str | os.PathLike) -> Location:
    return _root(root) / "train"


def run_dir(root: str | os.PathLike, run_name: str) -> Location:
    """One training run's checkpoints, metrics and summary."""
    return train_dir(root) / run_name


def ablation_dir(root: str | os.PathLike, name: str) -> Location:
    """One curation ablation's runs: a folder per arm (and settings), a folder per seed."""
    return _root(root) / "ablations" / name


def latest_checkpoint_pointer(root: str | os.PathLike) -> Location:
    """A small text file naming the newest finished training run's final checkpoint."""
    return train_dir(root) / "LATEST"


def samples_dir(root: str | os.PathLike) -> Location:
    return _root(root) / "samples"


def reports_dir(root: str | os.PathLike) -> Location:
    """Forensics reports and the corpus profile's plot."""
    return _root(root) / "reports"


def tokenizers_dir(root: str | os.PathLike) -> Location:
    """Trained BPE files, each named by its sha256, and ``LATEST`` naming the newest."""
    return _root(root) / "tokenizers"


def partials_dir(root: str | os.PathLike) -> Location:
    """Row ranges of columns computed for fragments not written yet (``embeddings/ranges.py``):
    a cache a rerun resumes from, removed once the fragment is written, and by ``forget``."""
    return _root(root) / "partial"


def partial_dir(root: str | os.PathLike, column: str) -> Location:
    return partials_dir(root) / column


def semantic_dup_dir(root: str | os.PathLike) -> Location:
    """``semantic_dup``'s side store: its cluster centroids and the kept document vectors
    grouped by cluster (``curation/semantic_clusters.py``); derived from the table's columns,
    removed by ``forget`` and made again from them by the next run."""
    return _root(root) / "semantic_dup"


def models_dir(root: str | os.PathLike) -> Location:
    """Small models trained on the corpus (the quality head), each file named by its sha256."""
    return _root(root) / "models"
