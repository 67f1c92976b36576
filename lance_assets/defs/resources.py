"""Where the data lives and what ingest reads, from ``LANCE_ASSETS_DATA`` / ``LANCE_ASSETS_SOURCE``.

``data_dir`` may be an object-store URI (``s3://bucket/prefix``); it is shown in the UI and run
config, so it never holds credentials: those stay in the environment (docs/object-storage.md).
"""

from __future__ import annotations

import os

import dagster as dg

from lance_assets import paths
from lance_assets.storage import Location
from lance_assets.table import Table


class LanceStore(dg.ConfigurableResource):
    """The data root (Lance database, checkpoints, samples) and the ingest source."""

    data_dir: str = paths.DEFAULT_DATA_DIR
    source: str = paths.DEFAULT_SOURCE

    @property
    def root(self) -> Location:
        """An absolute ``Path``, or a ``UPath`` for an object-store URI."""
        return paths.data_dir(self.data_dir)

    @property
    def table(self) -> Table:
        """The corpus table's one handle (``lance_assets.table.Table``)."""
        return Table.of(self.root)

    @property
    def table_uri(self) -> str:
        return self.table.uri


def _env_or_default(name: str, default: str):
    """An ``EnvVar`` (shown as such in the UI) when set, else the plain default."""
    return dg.EnvVar(name) if os.environ.get(name) else default


def lance_store_from_env() -> LanceStore:
    return LanceStore(
        data_dir=_env_or_default("LANCE_ASSETS_DATA", paths.DEFAULT_DATA_DIR),
        source=_env_or_default("LANCE_ASSETS_SOURCE", paths.DEFAULT_SOURCE),
    )
