"""The one place that reads inside a Lance manifest: the table's row-id counter.

Lance keeps ``next_row_id`` (how many rows were ever appended to a table with stable row ids) in
its manifest and exposes no public accessor for it (pylance 14). ``row_id_high_water`` reads it
from the manifest protobuf as pylance serializes it.

**It relies on** two things of pylance: ``LanceDataset._ds.serialized_manifest()`` returning the
``Manifest`` protobuf, and ``next_row_id`` being that message's varint field 14. The day either
changes, ``lance_assets_tests/test_ids.py`` (a table of known appends and deletes must read 670)
fails, and ``manifest_problems`` says what is missing; nothing else of Lance's is read here.
"""

from __future__ import annotations

import lance


def manifest_problems(ds: lance.LanceDataset) -> list[str]:
    """What this module relies on and the installed pylance does not provide (empty: all)."""
    inner = getattr(ds, "_ds", None)
    if inner is None or not callable(getattr(inner, "serialized_manifest", None)):
        return [f"pylance {lance.__version__}: LanceDataset._ds.serialized_manifest() is gone"]
    return []


def row_id_high_water(ds: lance.LanceDataset) -> int:
    """Lance's own row-id counter (the manifest's ``next_row_id``): how many rows were ever
    appended to the table. It only grows: deleting rows, compacting and cleaning up old
    versions leave it as it is. Only tables with stable row ids keep it (ours always do)."""
    if not ds.has_stable_row_ids:
        return 0
    # The Manifest protobuf as Lance pickles a dataset with it; next_row_id is field 14. Lance
    # has no public accessor for it (checked against a table: lance_assets_tests/test_ids.py).
    data = ds._ds.serialized_manifest()
    return _protobuf_varint_field(data, 14)


def _protobuf_varint_field(data: bytes, number: int) -> int:
    """The value of top-level varint field ``number`` of a protobuf message (0 when absent,
    proto3's default), skipping every other field by its wire type."""

    def varint(i: int) -> tuple[int, int]:
        shift = value = 0
        while True:
            byte = data[i]
            i += 1
            value |= (byte & 0x7F) << shift
            if not byte & 0x80:
                return value, i
            shift += 7

    i = 0
    while i < len(data):
        key, i = varint(i)
        field, wire = key >> 3, key & 7
        if wire == 0:
            value, i = varint(i)
            if field == number:
                return value
        elif wire == 1:
            i += 8
        elif wire == 2:
            size, i = varint(i)
            i += size
        elif wire == 5:
            i += 4
        else:
            raise ValueError(f"unexpected protobuf wire type {wire} in the table's manifest")
    return 0
