"""Lance datasets kept beside the corpus table that are not it: a training run's stored shuffle
permutation. Opened and written by URI here, next to ``Table`` (the only code that opens the
corpus), so every by-path open of a Lance dataset lives in this package; credentials come from
the environment (``storage.storage_options_for``), never from the caller."""

from __future__ import annotations

import lance
import pyarrow as pa

from lance_assets import storage


def open_side_dataset(uri: str) -> lance.LanceDataset:
    """The side dataset at ``uri`` (its newest version)."""
    return lance.dataset(uri, storage_options=storage.storage_options_for(uri))


def write_side_dataset(table: pa.Table, uri: str) -> None:
    """Write ``table`` as a new dataset at ``uri`` (a fresh name: never over an existing one)."""
    lance.write_dataset(table, uri, storage_options=storage.storage_options_for(uri))
