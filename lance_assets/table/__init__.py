"""The corpus table: one handle (:class:`Table`) and the rules every commit follows.

``Table`` is the only code that opens the dataset by path (a test keeps it so); ``core`` holds
the raw schema, the commit retry, the row-id counter and the table config; ``snapshots`` the
tagged versions with their owners and retention.
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
    row_id_high_water,
)
from lance_assets.table.handle import MAX_REPLANS, Table, VersionGone, is_version_gone

__all__ = [
    "MAX_COMMIT_ATTEMPTS", "MAX_REPLANS", "RAW_DESCRIPTIONS", "RAW_SCHEMA", "Chosen", "Table",
    "TableMissingError", "VersionChoiceError", "VersionGone", "commit_retrying",
    "data_files_by_field", "get_json_config", "is_retryable_conflict", "is_version_gone",
    "leaf_field_ids", "row_id_high_water",
]
