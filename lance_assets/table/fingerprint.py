"""Fingerprints of what one writer owns in the corpus table: a column group, an index, a config
entry. The Dagster assets turn them into data versions, so the UI marks an asset stale exactly
when what it read changed.

A column group's fingerprint hashes, fragment by fragment, the data files that hold the group
and the fragment's deletion file. Column writes add new data files and never touch others
(``table/columns.py``), so the fingerprint changes when this group gets values (new fragments,
a ``replace``), and stays put when rows are appended without the group or another group is
written. Rewriting data files (compaction) changes it too: a false "changed" costs one no-op
rerun downstream, while a false "unchanged" would hide stale data, so the hash errs that way.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

import lance

from lance_assets.table import leaf_field_ids, row_id_high_water

DIGEST_CHARS = 12


def digest(value: Any) -> str:
    """A short stable hash of a JSON-serialisable value."""
    text = json.dumps(value, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:DIGEST_CHARS]


def columns_fingerprint(ds: lance.LanceDataset, columns: list[str]) -> str:
    """The data files holding ``columns``, per fragment (with its deletion file): changes exactly
    when a write adds or replaces values of these columns. ``"absent"`` when a column is not in
    the schema."""
    if not all(c in ds.schema.names for c in columns):
        return digest(["absent", sorted(columns)])
    ids = set().union(*(leaf_field_ids(ds, c) for c in columns))
    held = []
    for frag in ds.get_fragments():
        meta = frag.metadata
        files = sorted(f.path for f in meta.data_files() if ids & set(f.fields))
        if files:
            deletion = meta.deletion_file
            held.append([frag.fragment_id, files,
                         None if deletion is None else [deletion.id, deletion.num_deleted_rows]])
    return digest([sorted(ids), held])


def index_state(ds: lance.LanceDataset, name: str) -> tuple[int | None, str]:
    """(the table version the index was last updated at, a fingerprint of its segments and the
    fragments they cover); (None, ...) when there is no such index."""
    for index in ds.describe_indices():
        if index.name == name:
            segments = sorted([str(s.uuid), sorted(s.fragment_ids)] for s in index.segments)
            version = max((s.dataset_version_at_last_update for s in index.segments), default=None)
            return version, digest([name, segments])
    return None, digest([name, "no index"])


def data_version(ds: lance.LanceDataset) -> str:
    """A digest of what the version holds: its columns, its live rows, every row ever appended
    (Lance's row-id counter), and how many rows each column group is unwritten for. A
    compaction, an index refresh or a config change leaves it as it is; an ingest, a delete or
    a column write changes it. Names a snapshot of the data (an unnamed ablation)."""
    from lance_assets.table import columns

    unwritten = {m: columns.unwritten_rows(ds, group).unwritten_rows
                 for m, group in sorted(columns.marker_groups(ds).items())}
    schema = [(f.name, str(f.type)) for f in ds.schema]
    return digest([schema, ds.count_rows(), row_id_high_water(ds), unwritten])
