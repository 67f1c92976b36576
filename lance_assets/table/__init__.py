"""The corpus table: one handle (:class:`Table`) and the rules every commit follows.

``Table`` is the only code that opens the dataset by path (a test keeps it so); ``core`` holds
the raw schema, the commit retry and the table config; ``lance_manifest`` the row-id counter;
``snapshots`` the tagged versions with their owners and retention.

The face: the handle and its errors, the raw schema, the table config, and the modules other
packages use as a whole: the column producer's contract (``producer``, ``settings``), column
writes (``columns``, ``executor``), the predicate parser (``predicate``), tagged snapshots
(``snapshots``, ``maintenance``, ``fingerprint``), what a run read (``read_record``), forget
(``forget``, ``forget_journal``, ``forget_log``) and side datasets (``side``).
"""

from lance_assets.table.choice import RETENTION, VersionChoiceError
from lance_assets.table.core import (
    RAW_DESCRIPTIONS,
    RAW_SCHEMA,
    TableMissingError,
    data_files_by_field,
    get_json_config,
    leaf_field_ids,
)
from lance_assets.table.handle import Table, is_version_gone, point_at
from lance_assets.table.lance_manifest import row_id_high_water

__all__ = [
    "RAW_DESCRIPTIONS", "RAW_SCHEMA", "RETENTION", "Table", "TableMissingError",
    "VersionChoiceError", "columns", "data_files_by_field", "executor", "fingerprint", "forget",
    "forget_journal", "forget_log", "get_json_config", "is_version_gone", "leaf_field_ids",
    "maintenance", "point_at", "predicate", "producer", "read_record", "row_id_high_water",
    "settings", "side", "snapshots",
]
