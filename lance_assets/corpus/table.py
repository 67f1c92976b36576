"""Opening the corpus table and reading what the Dagster layer reports about it."""

from __future__ import annotations

import json
from pathlib import Path

import lance
import pyarrow as pa

from lance_assets import paths

# The columns ingest writes. Every other column is added later, one asset per column group.
RAW_SCHEMA = pa.schema([
    # nullable only because Lance requires every non-nullable field in each column write;
    # ingest assigns every row an id.
    pa.field("id", pa.int64()),
    pa.field("doc_id", pa.string()),  # the source's own id (FineWeb `id`)
    pa.field("url", pa.string()),
    pa.field("source", pa.string()),  # source unit key: file:/abs/path, synthetic:..., hf:...
    pa.field("source_part", pa.int32()),  # row group / block within the unit: the watermark
    pa.field("dump", pa.string()),
    pa.field("date", pa.string()),
    pa.field("score", pa.float64()),
    pa.field("int_score", pa.int64()),
    pa.field("language", pa.string()),
    pa.field("language_score", pa.float64()),
    pa.field("token_count", pa.int64()),
    pa.field("n_chars", pa.int32()),
    pa.field("text", pa.string()),
])


class TableMissingError(RuntimeError):
    pass


def open_table(root: str | Path, table: str = paths.TABLE_NAME) -> lance.LanceDataset:
    """The Lance dataset behind ``table``, or a clear error if ingest has not run yet."""
    uri = paths.table_uri(root, table)
    if not Path(uri).exists():
        raise TableMissingError(
            f"No Lance table at {uri}. Materialize `raw_text` first "
            "(dagster asset materialize -m lance_assets.definitions --select raw_text)."
        )
    return lance.dataset(uri)


def table_exists(root: str | Path, table: str = paths.TABLE_NAME) -> bool:
    return Path(paths.table_uri(root, table)).exists()


# Table-level facts (e.g. the tokenizer) live in the manifest's key/value config, versioned with
# the table. Not in the Arrow schema metadata: lancedb's permutation builder (used by
# StreamingDataset) panics on tables whose schema carries metadata (lancedb 0.40).
def get_json_config(ds: lance.LanceDataset, key: str) -> dict | None:
    raw = ds.config().get(key)
    return json.loads(raw) if raw else None


def set_json_config(ds: lance.LanceDataset, key: str, value: dict) -> None:
    ds.update_config({key: json.dumps(value, sort_keys=True)})


def data_files_by_field(ds: lance.LanceDataset, column: str) -> dict[int, list[str]]:
    """For each fragment, the data files that hold ``column`` (empty when it has none)."""
    from lance_assets.corpus.columns import leaf_field_ids

    ids = leaf_field_ids(ds, column)
    out: dict[int, list[str]] = {}
    for frag in ds.get_fragments():
        out[frag.fragment_id] = sorted(
            f.path for f in frag.metadata.data_files() if ids & set(f.fields)
        )
    return out
