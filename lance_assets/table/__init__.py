"""The corpus table: one handle (:class:`Table`) and the rules every commit follows.

``Table`` is the only code that opens the dataset by path (a test keeps it so); ``core`` holds
the raw schema, the commit retry and the table config; ``lance_manifest`` the row-id counter;
``snapshots`` the tagged versions with their owners and retention.
"""

from lance_assets.table.choice import Chosen, VersionChoiceError
from lance_assets.table.core import (
    MAX_COMMIT_ATTEMPTS,
    RAW_DESCRIPTIONS,
    RAW_SCHEMA,
    TableMissingError,
    commit_retrying,
    data_files_by_field,
    get_json_config,
    is_retryable_conflict,
    leaf_field_ids,
)
from lance_assets.table.handle import MAX_REPLANS, Table, VersionGone, is_version_gone
from lance_assets.table.lance_manifest import row_id_high_water

__all__ = [
    "MAX_COMMIT_ATTEMPTS", "MAX_REPLANS", "RAW_DESCRIPTIONS", "RAW_SCHEMA", "Chosen", "Table",
    "TableMissingError", "VersionChoiceError", "VersionGone", "commit_retrying",
    "data_files_by_field", "get_json_config", "is_retryable_conflict", "is_version_gone",
    "leaf_field_ids", "row_id_high_water",
]
