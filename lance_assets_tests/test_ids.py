"""Ids only grow over the table's whole life, deletions included: the exact-dedup rule ("a
smaller id had the same text") and the forensics pin (``id <= max_id``) rely on it."""

from datetime import timedelta

import lance
import pyarrow as pa
import pyarrow.parquet as pq
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from lance_assets import paths
from lance_assets.ingest.raw_text import ingest
from lance_assets.table import Table, lance_manifest, row_id_high_water
from lance_assets.table.maintenance import maintain
from lance_assets_tests.helpers import quiet


def source_file(folder, name: str, rows: int):
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{name}.parquet"
    pq.write_table(pa.table({"text": [f"{name} document {i} with some words" for i in range(rows)]}),
                   path, row_group_size=50)
    return path


def ids_of(root, where: str | None = None) -> list[int]:
    ds = lance.dataset(paths.table_uri(root))
    return sorted(ds.to_table(columns=["id"], filter=where)["id"].to_pylist())


def test_ids_after_a_delete_are_above_every_id_ever_used(tmp_path):
    """Two sources, the second deleted (whole fragments: gone from the table), a compaction
    and a cleanup of every old version, then a third source: its ids start above the deleted
    ones; ids equal Lance's stable row ids."""
    root, src = tmp_path / "data", tmp_path / "src"
    ingest(Table.of(root), str(source_file(src, "a", 300)), rows_per_fragment=100, log=quiet)
    ingest(Table.of(root), str(source_file(src, "b", 250)), rows_per_fragment=100, log=quiet)
    used = ids_of(root)
    assert used == list(range(550))
    uri = paths.table_uri(root)
    lance.dataset(uri).delete("source LIKE '%b.parquet%'")
    maintain(Table.of(root), keep_versions_for=timedelta(0), log=quiet)
    assert ids_of(root) == list(range(300))  # the highest ids are gone from every version kept
    ingest(Table.of(root), str(source_file(src, "c", 120)), rows_per_fragment=100, log=quiet)
    new = ids_of(root, "source LIKE '%c.parquet%'")
    assert new == list(range(550, 670))  # strictly above every id ever used
    rows = lance.dataset(uri).to_table(columns=["id"], with_row_id=True).to_pylist()
    assert all(r["id"] == r["_rowid"] for r in rows)
    assert row_id_high_water(lance.dataset(uri)) == 670
    assert lance_manifest.manifest_problems(lance.dataset(uri)) == []  # what the adapter needs


@settings(max_examples=12, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(st.lists(st.tuples(st.sampled_from(["ingest", "delete_newest", "delete_some", "compact"]),
                          st.integers(1, 120)), min_size=2, max_size=7))
def test_ids_never_repeat_whatever_is_deleted_or_compacted(tmp_path_factory, steps):
    """Any sequence of ingests, deletes (of the newest rows above all) and compactions: every
    ingest's ids are above every id the table ever held."""
    base = tmp_path_factory.mktemp("ids")
    root, src = base / "data", base / "src"
    uri = paths.table_uri(root)
    ever = -1
    for n, (action, size) in enumerate(steps):
        if action == "ingest":
            ingest(Table.of(root), str(source_file(src, f"s{n}", size)), rows_per_fragment=40, log=quiet)
            new = ids_of(root, f"source LIKE '%s{n}.parquet%'")
            assert new and min(new) > ever and new == list(range(new[0], new[0] + len(new)))
            ever = max(ever, max(new))
        elif not Table.of(root).exists() or not lance.dataset(uri).count_rows():
            continue  # nothing to delete or compact yet
        elif action == "delete_newest":
            lance.dataset(uri).delete(f"id > {ever - size}")
        elif action == "delete_some":
            lance.dataset(uri).delete(f"id % {size % 7 + 2} = 0")
        else:
            lance.dataset(uri).optimize.compact_files()
