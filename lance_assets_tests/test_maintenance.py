"""`table_maintenance`: compaction, index refresh and cleanup, what it reports, what it keeps; and
the `columns_written` checks that stop training on a table with unwritten rows."""

from datetime import timedelta

import dagster as dg
import lance
import pytest

from lance_assets import paths
from lance_assets.curation import dedup_flag
from lance_assets.forensics import text_index as fts
from lance_assets.ingest.raw_text import ingest
from lance_assets.table import Table
from lance_assets.table.maintenance import maintain
from lance_assets.table.producer import Skip, produce
from lance_assets.table.snapshots import SnapshotError
from lance_assets_tests.helpers import quiet


def test_maintenance_compacts_refreshes_the_index_and_keeps_tagged_versions(tmp_path):
    root = tmp_path / "data"
    ingest(Table.of(root), "synthetic:600", rows_per_fragment=100, rows_per_commit=200, log=quiet)
    produce(dedup_flag.PRODUCER, Table.of(root), log=quiet)
    fts.text_index(Table.of(root))
    uri = paths.table_uri(root)
    snapshots = Table.of(root).snapshots
    tagged = snapshots.hold("train-kept", lance.dataset(uri).version, owner="test")
    ingest(Table.of(root), "synthetic:900", rows_per_fragment=100, rows_per_commit=200, log=quiet)
    produce(dedup_flag.PRODUCER, Table.of(root), log=quiet)
    lance.dataset(uri).delete("id % 10 = 0")
    before = lance.dataset(uri)
    report = maintain(Table.of(root), keep_versions_for=timedelta(0), log=quiet)
    after = lance.dataset(uri)
    assert report.fragments_before == len(before.get_fragments()) > report.fragments_after
    assert report.fragments_removed > report.fragments_added > 0
    assert not any(f.metadata.deletion_file for f in after.get_fragments())
    assert report.indexes[fts.INDEX_NAME]["before"] > 0 and report.indexes[fts.INDEX_NAME]["after"] == 0
    assert report.versions_removed > 0 and report.bytes_reclaimed > 0
    assert [v["version"] for v in after.versions()] == [tagged, after.version]
    assert report.versions_kept == 2 and report.tags_kept == {"train-kept": tagged}
    assert lance.dataset(uri, version="train-kept").count_rows() == 600  # still readable
    assert after.count_rows() == 1350 and after.count_rows("id % 10 = 0") == 0
    # released, the next cleanup reclaims the snapshot
    again = maintain(Table.of(root), keep_versions_for=timedelta(0), release=["train-kept"], log=quiet)
    assert again.tags_released == {"train-kept": tagged} and again.tags_kept == {}
    assert [v["version"] for v in lance.dataset(uri).versions()] == [lance.dataset(uri).version]
    assert snapshots.version("train-kept") is None
    with pytest.raises(SnapshotError, match="has no tag 'train-kept'"):
        snapshots.release("train-kept")


def test_a_cleanup_without_history_keeps_a_users_tag_and_counts_what_it_drops_for_good(tmp_path):
    """An operator tags version A by hand (400 rows, no record); 600 rows come in; then `id >=
    300` is deleted by hand. A cleanup keeping no history keeps the tag's version readable and
    counts, across the versions, the 600 documents only untagged versions read (ids 300-399 live
    on in the tag) against the largest version's 1,000 rows. A release naming a tag the table
    lacks releases nothing."""
    root = tmp_path / "data"
    ingest(Table.of(root), "synthetic:400", rows_per_fragment=100, log=quiet)
    table = Table.of(root)
    tagged = table.newest().version
    table.newest().tags.create("mine", tagged)  # by hand, with Lance: no record
    ingest(Table.of(root), "synthetic:600", rows_per_fragment=100, log=quiet)
    table.commit("a delete by hand", lambda d: d.delete("id >= 300"))
    versions = [v["version"] for v in table.newest().versions()]
    with pytest.raises(SnapshotError, match="no tag 'typo'.*nothing was released"):
        maintain(table, release=["mine", "typo"], keep_versions_for=timedelta(0), log=quiet)
    assert "mine" in table.snapshots.list()
    assert [v["version"] for v in table.newest().versions()] == versions
    report = maintain(table, keep_versions_for=timedelta(0), log=quiet)
    assert (report.documents_dropped, report.largest_rows) == (600, 1000)
    assert report.tags_kept == {"mine": tagged} and "600 document(s)" in report.markdown()
    assert [v["version"] for v in table.newest().versions()] == [tagged, table.newest().version]
    assert lance.dataset(table.uri, version="mine").count_rows() == 400


def test_columns_written_check_fails_on_unwritten_rows_and_blocks_what_is_downstream(tmp_path):
    """Rows ingested after `dedup_flag` ran (here: a second ingest in between) are unwritten;
    the check says so and `tokenizer` (downstream) does not run; the next run passes."""
    from lance_assets.definitions import defs
    from lance_assets.defs.resources import LanceStore

    root = tmp_path / "data"
    ingest(Table.of(root), "synthetic:300", rows_per_fragment=100, log=quiet)
    store = LanceStore(data_dir=str(root))
    checks = [c for c in defs.asset_checks
              if dg.AssetCheckKey(dg.AssetKey("dedup_flag"), "columns_written") in c.check_keys]

    def run(selection):
        return dg.materialize([defs.get_assets_def("dedup_flag"), defs.get_assets_def("tokenizer"),
                               *checks], resources={"lance_store": store}, selection=selection,
                              raise_on_error=False)

    # the check alone, on a table where dedup_flag never ran
    result = run(dg.AssetSelection.checks_for_assets(dg.AssetKey("dedup_flag")))
    (evaluation,) = result.get_asset_check_evaluations()
    assert not evaluation.passed and evaluation.metadata["unwritten_rows"].value == 300
    assert "Materialize `dedup_flag` again" in evaluation.description
    # the asset writes every row: the check passes, downstream runs
    produce(dedup_flag.PRODUCER, Table.of(root), log=quiet)
    ingest(Table.of(root), "synthetic:450", rows_per_fragment=100, log=quiet)  # new, unwritten rows
    result = run(dg.AssetSelection.checks_for_assets(dg.AssetKey("dedup_flag"))
                 | dg.AssetSelection.assets("tokenizer"))
    (evaluation,) = result.get_asset_check_evaluations()
    assert not evaluation.passed and evaluation.metadata["unwritten_rows"].value == 450
    assert not result.asset_materializations_for_node("tokenizer")  # blocked
    result = run(dg.AssetSelection.assets("dedup_flag")
                 | dg.AssetSelection.checks_for_assets(dg.AssetKey("dedup_flag")))
    (evaluation,) = result.get_asset_check_evaluations()
    assert evaluation.passed and evaluation.metadata["unwritten_rows"].value == 0


def test_columns_written_passes_without_a_quality_model_and_fails_on_unscored_rows_once_one_exists(tmp_path):
    """A corpus whose rows carry no label trains no quality model: `quality_score` writes
    nothing, and its coverage check passes saying why (it must not block training). Once a
    model is pinned, rows without a written score fail the check like any column's."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from lance_assets.curation import quality_score as quality_model
    from lance_assets.definitions import defs
    from lance_assets.defs.resources import LanceStore
    from lance_assets.embeddings import embeddings as embed
    from lance_assets.testing.embedders import FeatureEmbedder

    key = dg.AssetKey("quality_score")
    checks = [c for c in defs.asset_checks
              if dg.AssetCheckKey(key, "columns_written") in c.check_keys]

    def evaluate(root):
        result = dg.materialize([defs.get_assets_def("quality_score"), *checks],
                                resources={"lance_store": LanceStore(data_dir=str(root))},
                                selection=dg.AssetSelection.checks_for_assets(key),
                                raise_on_error=False)
        (evaluation,) = result.get_asset_check_evaluations()
        return evaluation

    src = tmp_path / "src"
    src.mkdir()
    pq.write_table(pa.table({"text": [f"document {i} about rivers" for i in range(120)]}),
                   src / "a.parquet")
    unlabelled = tmp_path / "unlabelled"
    ingest(Table.of(unlabelled), str(src), log=quiet)
    produce(embed.PRODUCER, Table.of(unlabelled), embed.EmbeddingsSettings(embedder=FeatureEmbedder()),
            log=quiet)
    assert isinstance(produce(quality_model.PRODUCER, Table.of(unlabelled), log=quiet), Skip)
    evaluation = evaluate(unlabelled)
    assert evaluation.passed and "no quality model was trained" in evaluation.description

    labelled = tmp_path / "labelled"
    ingest(Table.of(labelled), "synthetic:400", rows_per_fragment=100, log=quiet)
    produce(embed.PRODUCER, Table.of(labelled), embed.EmbeddingsSettings(embedder=FeatureEmbedder()),
            log=quiet)
    produce(quality_model.PRODUCER, Table.of(labelled), log=quiet)
    assert evaluate(labelled).passed
    added = ingest(Table.of(labelled), "synthetic:500", rows_per_fragment=100, log=quiet).rows_added
    produce(embed.PRODUCER, Table.of(labelled), embed.EmbeddingsSettings(embedder=FeatureEmbedder()),
            log=quiet)  # rows not scored yet
    evaluation = evaluate(labelled)
    assert not evaluation.passed and evaluation.metadata["unwritten_rows"].value == added > 0


def test_columns_written_reports_rows_after_the_pinned_version_as_pending(tmp_path):
    """The check judges the version the asset's last run pinned: rows ingested after it are
    pending for the next run (the check passes and says so); rows of that version left unwritten
    still fail it."""
    from lance_assets.definitions import defs
    from lance_assets.defs.resources import LanceStore

    root = tmp_path / "data"
    ingest(Table.of(root), "synthetic:300", rows_per_fragment=100, log=quiet)
    key = dg.AssetKey("dedup_flag")
    checks = [c for c in defs.asset_checks
              if dg.AssetCheckKey(key, "columns_written") in c.check_keys]
    instance = dg.DagsterInstance.ephemeral()

    def run(selection):
        result = dg.materialize([defs.get_assets_def("dedup_flag"), *checks], instance=instance,
                                resources={"lance_store": LanceStore(data_dir=str(root))},
                                selection=selection, raise_on_error=False)
        (evaluation,) = result.get_asset_check_evaluations()
        return result, evaluation

    result, evaluation = run(dg.AssetSelection.assets(key) | dg.AssetSelection.checks_for_assets(key))
    meta = result.asset_materializations_for_node("dedup_flag")[0].metadata
    assert meta["lance/pinned_rows_end"].value == 300 and evaluation.passed
    ingest(Table.of(root), "synthetic:450", rows_per_fragment=100, log=quiet)  # after the pin
    _, evaluation = run(dg.AssetSelection.checks_for_assets(key))
    assert evaluation.passed and evaluation.metadata["pending_rows"].value == 450
    assert evaluation.metadata["unwritten_rows"].value == 450 and "wait for" in evaluation.description
    # a row of the pinned version without its value is a failure, pending rows or not
    uri = paths.table_uri(root)
    lance.dataset(uri).delete("id = 5")
    maintain(Table.of(root), keep_versions_for=timedelta(0), log=quiet)  # rewrites the fragment
    Table.of(root).commit("unmark", lambda ds: ds.update({"_written_is_dup": "NULL"}, where="id = 7"))
    _, evaluation = run(dg.AssetSelection.checks_for_assets(key))
    assert not evaluation.passed and evaluation.metadata["pending_rows"].value == 450
    assert evaluation.metadata["unwritten_rows"].value == 451


def _fragment_ids(root) -> list[list[int]]:
    ds = lance.dataset(paths.table_uri(root))
    return [f.to_table(columns=["id"]).column("id").to_pylist() for f in ds.get_fragments()]


@pytest.mark.parametrize("rounds", [1, 3])
def test_compaction_never_mixes_ids_out_of_order_in_a_fragment(tmp_path, monkeypatch, rounds):
    """Lance appends a rewrite's fragments after those it left alone: a compaction with a
    fragment left out in the middle reorders the fragments, and merging neighbours after that
    would put ids out of order in one fragment (the column writers refuse it). Each round
    ingests five small fragments, deletes a row in two of them, compacts with the middle one
    left out (as if a column were being written there), then compacts everything; every
    deleted row still leaves the data files."""
    from lance_assets.curation import near_dup
    from lance_assets.table import maintenance

    root = tmp_path / "data"
    table = Table.of(root)
    real = maintenance.incomplete_fragments
    for r in range(rounds):
        ingest(Table.of(root), f"synthetic:{500 + r}", rows_per_fragment=100, log=quiet)
        new = [f for f in table.newest().get_fragments() if f.physical_rows <= 101][-5:]
        gap = new[2].fragment_id
        for frag in (new[0], new[3]):
            first = frag.to_table(columns=["id"]).column("id")[0].as_py()
            table.commit("delete", lambda d, i=first: d.delete(f"id = {i}"), log=quiet)
        monkeypatch.setattr(maintenance, "incomplete_fragments", lambda d, gap=gap: {gap})
        maintenance.compact_table(table, target_rows_per_fragment=200, log=quiet)
        monkeypatch.setattr(maintenance, "incomplete_fragments", real)
        report = maintenance.compact_table(table, target_rows_per_fragment=10_000, log=quiet)
        per_fragment = _fragment_ids(root)
        for ids in per_fragment:
            assert ids == sorted(ids), f"round {r}: ids out of order in a fragment"
        spans = sorted((ids[0], ids[-1]) for ids in per_fragment if ids)
        assert all(a[1] < b[0] for a, b in zip(spans, spans[1:]))  # no two interleave
        assert report.groups_left_out_of_order >= 1
        assert all(f.metadata.deletion_file is None for f in table.newest().get_fragments())
    # reads every fragment in id order: refused before the fix
    produce(near_dup.PRODUCER, Table.of(root), log=quiet)
    assert table.newest().count_rows("near_dup IS NULL") == 0


def test_compaction_plans_again_when_a_cleanup_removes_the_version_it_rewrites(tmp_path,
                                                                                 monkeypatch):
    """Another process compacts and cleans up with no retention between this compaction's plan
    and its rewrite: the files it reads are gone. It drops what it rewrote and plans again on
    the newest version (a `forget` next to `maintain(keep_versions_for=0)` failed on this)."""
    from lance_assets.table import maintenance

    root = tmp_path / "data"
    table = Table.of(root)
    ingest(table, "synthetic:400", rows_per_fragment=50, log=quiet)
    table.commit("delete", lambda d: d.delete("id < 10"), log=quiet)
    real, raced = maintenance.in_id_order, []

    def racing(ds, tasks):
        if not raced:
            raced.append(ds.version)
            maintain(Table.of(root), keep_versions_for=timedelta(0),
                     target_rows_per_fragment=100, log=quiet)
        return real(ds, tasks)

    monkeypatch.setattr(maintenance, "in_id_order", racing)
    said = []
    report = maintenance.compact_table(table, target_rows_per_fragment=400, log=said.append)
    assert raced and report.compaction_rounds == 2
    assert any(f"version {raced[0]} lost files to a cleanup" in m for m in said)
    ds = table.newest()
    assert ds.count_rows() == 390 and len(ds.get_fragments()) == 1
    assert sorted(ds.to_table(columns=["id"]).column("id").to_pylist()) == list(range(10, 400))
    assert all(f.metadata.deletion_file is None for f in ds.get_fragments())
