"""The corpus table's raw schema, its commit rule, its row-id counter and its config.

Opening the table is ``Table``'s job (``table.handle``); this module holds what it builds on.

Every write to the table goes through ``commit_retrying``: Lance commits are optimistic, and a
commit that lost a race with a concurrent writer (another asset, another run, another Dagster
instance) raises a *retryable* ``CommitConflictError``. The retry re-opens the newest version and
rebuilds the operation from it, so writers of different columns can run at the same time and
correctness never depends on how (or whether) the orchestrator serialises them. The same holds on
object storage: Lance writes each manifest with a create-if-absent PUT (S3 ``If-None-Match``), so
of two commits racing for one version exactly one wins and the other gets the retryable conflict.
"""

from __future__ import annotations

import json
import random
import time
from collections.abc import Callable
from pathlib import Path
from typing import Optional, TypeVar

import lance
import pyarrow as pa

from lance_assets import storage

T = TypeVar("T")

# Retries of one logical write lost to concurrent writers. Each retry rebuilds the operation on
# the newest version, so this bounds contention, not correctness.
MAX_COMMIT_ATTEMPTS = 50

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
# What each column of RAW_SCHEMA holds (shown as the `raw_text` asset's column schema).
RAW_DESCRIPTIONS = {
    "id": "Row id, unique and increasing in ingest order; the curation and split rules key on it.",
    "doc_id": "The source's own document id (FineWeb `id`); null when the source has none.",
    "url": "Where the document was crawled from (FineWeb); null for other sources.",
    "source": "Source unit the row came from: file:/abs/path, synthetic:..., hf:...",
    "source_part": "Row group or block within the source unit: the ingest watermark.",
    "dump": "Common Crawl dump (FineWeb).",
    "date": "Crawl date (FineWeb).",
    "score": "FineWeb-Edu educational quality score (0-5, float).",
    "int_score": "FineWeb-Edu score rounded to an integer.",
    "language": "Language code given by the source.",
    "language_score": "The source's language-identification confidence.",
    "token_count": "Token count given by the source (its own tokenizer).",
    "n_chars": "Characters in `text`.",
    "text": "The document text (UTF-8), as ingested; never rewritten.",
}


class TableMissingError(RuntimeError):
    pass


def has_committed_version(uri: str | Path) -> bool:
    """True once a version of the dataset at ``uri`` is committed (a manifest exists).

    A folder without one is what a first write killed before its commit leaves behind (data
    files, no manifest): it is not a table, and the next ingest creates the table over it.
    """
    versions = storage.location(uri) / "_versions"
    try:
        return any(p.name.endswith(".manifest") for p in versions.iterdir())
    except (FileNotFoundError, NotADirectoryError):
        return False


def is_retryable_conflict(exc: BaseException) -> bool:
    """A commit that lost a race and may be rebuilt on the newest version: a retryable Lance
    conflict (some operations, e.g. compaction, raise it as an ``OSError``), or a commit whose
    read version was removed meanwhile by a cleanup of old versions (``table_maintenance``)."""
    from lance.commit import CommitConflictError

    if isinstance(exc, CommitConflictError):
        return getattr(exc, "retryable", True)
    text = str(exc)
    return isinstance(exc, OSError) and (
        text.startswith("Retryable commit conflict")
        # two config updates of one key: the attempt re-reads the newest config and rebuilds
        or (text.startswith("Incompatible transaction: This UpdateConfig transaction")
            and "concurrent transaction UpdateConfig" in text)
        or ("/_versions/" in text and ".manifest was not found" in text))


def commit_retrying(what: str, attempt: Callable[[], T], *,
                    log: Optional[Callable[[str], None]] = None,
                    max_attempts: int = MAX_COMMIT_ATTEMPTS) -> T:
    """Run ``attempt`` (open the newest version, build the operation, commit) until it is not
    preempted by a concurrent writer; back off with jitter in between.

    ``attempt`` must re-read the table each time: what it commits is decided on the version it
    reads, which is how the operation is rebased on the writes that won the race.
    """
    for n in range(1, max_attempts + 1):
        try:
            return attempt()
        except Exception as exc:  # noqa: BLE001 - re-raised unless a retryable commit conflict
            if not is_retryable_conflict(exc) or n == max_attempts:
                raise
            if log is not None and n in (1, 10, 25):
                log(f"{what}: a concurrent write won the commit race; retrying on the newest "
                    f"version (attempt {n + 1})")
            time.sleep(min(0.02 * 2 ** min(n, 7), 2.0) * random.uniform(0.5, 1.5))
    raise AssertionError("unreachable")


# Table-level facts (e.g. the tokenizer) live in the manifest's key/value config, versioned with
# the table. Not in the Arrow schema metadata: lancedb's permutation builder (used by
# StreamingDataset) panics on tables whose schema carries metadata (lancedb 0.40).
def get_json_config(ds: lance.LanceDataset, key: str) -> dict | None:
    raw = ds.config().get(key)
    return json.loads(raw) if raw else None


def leaf_field_ids(ds: lance.LanceDataset, column: str) -> set[int]:
    """Ids of the leaf fields of ``column``: what a data file lists (a list's item, not the list)."""

    def leaves(f) -> set[int]:
        kids = f.children()
        return {f.id()} if not kids else set().union(*(leaves(k) for k in kids))

    return leaves(ds.lance_schema.field(column))


def data_files_by_field(ds: lance.LanceDataset, column: str) -> dict[int, list[str]]:
    """For each fragment, the data files that hold ``column`` (empty when it has none)."""
    ids = leaf_field_ids(ds, column)
    out: dict[int, list[str]] = {}
    for frag in ds.get_fragments():
        out[frag.fragment_id] = sorted(
            f.path for f in frag.metadata.data_files() if ids & set(f.fields)
        )
    return out
