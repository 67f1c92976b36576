"""Column writes add data files; they never rewrite the ones holding `text`."""

import lance
import pyarrow as pa
import pytest

from lance_assets import paths
from lance_assets.curation import dedup_flag
from lance_assets.ingest.raw_text import ingest
from lance_assets.table import Table, data_files_by_field
from lance_assets.table.columns import fragments_missing, write_columns
from lance_assets.table.producer import produce
from lance_assets.tokens import token_ids
from lance_assets_tests.helpers import quiet


def test_is_dup_and_token_columns_leave_text_files_untouched(root):
    ingest(Table.of(root), "synthetic:400", rows_per_fragment=100, log=quiet)
    uri = paths.table_uri(root)
    before = data_files_by_field(lance.dataset(uri), "text")
    assert len(before) == 4 and all(len(v) == 1 for v in before.values())
    produce(dedup_flag.PRODUCER, Table.of(root), log=quiet)
    produce(token_ids.PRODUCER, Table.of(root), token_ids.TokenIdsSettings(tokenizer="byte"), log=quiet)
    ds = lance.dataset(uri)
    assert data_files_by_field(ds, "text") == before
    # the new columns live in files of their own
    for col in ("is_dup", "input_ids", "n_tokens"):
        files = data_files_by_field(ds, col)
        assert all(files[f] and not set(files[f]) & set(before[f]) for f in files)
    assert ds.count_rows() == 400
    assert ds.count_rows(filter="is_dup IS NULL OR input_ids IS NULL") == 0


def test_column_catch_up_is_per_fragment_and_old_values_stay(root):
    ingest(Table.of(root), "synthetic:300", rows_per_fragment=100, log=quiet)
    produce(dedup_flag.PRODUCER, Table.of(root), log=quiet)
    produce(token_ids.PRODUCER, Table.of(root), token_ids.TokenIdsSettings(tokenizer="byte"), log=quiet)
    uri = paths.table_uri(root)
    ds = lance.dataset(uri)
    old_dup_files = data_files_by_field(ds, "is_dup")
    old_token_files = data_files_by_field(ds, "input_ids")

    # rerun with nothing new: no work, no new version
    report = produce(dedup_flag.PRODUCER, Table.of(root), log=quiet)
    assert report.nothing_to_do and report.version == ds.version

    # new documents arrive: the seed-0 corpus again (all duplicates) plus more
    ingest(Table.of(root), "synthetic:450", rows_per_fragment=100, log=quiet)
    ds = lance.dataset(uri)
    assert len(fragments_missing(ds, ["is_dup"])) == 5
    report = produce(dedup_flag.PRODUCER, Table.of(root), log=quiet)
    assert sorted(report.fragments_written) == [3, 4, 5, 6, 7]
    report = produce(token_ids.PRODUCER, Table.of(root), token_ids.TokenIdsSettings(tokenizer="byte"),
                     log=quiet)
    assert len(report.fragments_written) == 5
    ds = lance.dataset(uri)
    new_dup_files = data_files_by_field(ds, "is_dup")
    assert {f: new_dup_files[f] for f in old_dup_files} == old_dup_files
    new_token_files = data_files_by_field(ds, "input_ids")
    assert {f: new_token_files[f] for f in old_token_files} == old_token_files
    rows = ds.to_table(columns=["id", "is_dup"], filter="id >= 300 AND id < 600").to_pylist()
    assert all(r["is_dup"] for r in rows)  # the second synthetic:450's first 300 docs repeat the first


def test_write_columns_commits_in_groups_and_checks_row_counts(root):
    ingest(Table.of(root), "synthetic:250", rows_per_fragment=50, log=quiet)
    uri = paths.table_uri(root)
    field = pa.field("id_squared", pa.int64())

    def compute(frag):
        ids = frag.to_table(columns=["id"]).column("id")
        yield pa.RecordBatch.from_arrays([pa.compute.multiply(ids, ids).combine_chunks()], [field.name])

    report = write_columns(Table.of(root), [field], compute, fragments_per_commit=2, log=quiet)
    assert report.commits == 3 and report.rows_written == 250
    rows = lance.dataset(uri).to_table(columns=["id", "id_squared"]).to_pylist()
    assert all(r["id_squared"] == r["id"] ** 2 for r in rows)

    bad = pa.field("short", pa.int64())

    def too_few(frag):
        yield pa.RecordBatch.from_arrays([pa.array([1], pa.int64())], ["short"])

    import pytest

    with pytest.raises(RuntimeError, match="1 values for 50 rows"):
        write_columns(Table.of(root), [bad], too_few, log=quiet)
    assert lance.dataset(uri).count_rows(filter="short IS NOT NULL") == 0


@pytest.mark.parametrize("writer", ["dedup_flag", "quality_signals", "near_dup", "token_ids",
                                    "embeddings"])
def test_a_column_writer_before_any_ingest_says_to_materialize_raw_text(tmp_path, writer):
    """A column asset selected without `raw_text` (or run before it) names the fix, rather
    than surfacing Lance's 'dataset not found'."""
    from lance_assets.curation import dedup_flag as dedup
    from lance_assets.curation import minhash, near_dup
    from lance_assets.curation import quality_signals as quality
    from lance_assets.embeddings import embeddings as embed
    from lance_assets.table import TableMissingError
    from lance_assets.tokens import token_ids as tokenize

    run = {"dedup_flag": lambda: produce(dedup.PRODUCER, Table.of(tmp_path)),
           "quality_signals": lambda: produce(quality.PRODUCER, Table.of(tmp_path)),
           "near_dup": lambda: produce(near_dup.PRODUCER, Table.of(tmp_path),
                                       near_dup.NearDupSettings(minhash=minhash.MinHashSettings())),
           "token_ids": lambda: produce(tokenize.PRODUCER, Table.of(tmp_path),
                                        tokenize.TokenIdsSettings(tokenizer="byte")),
           "embeddings": lambda: produce(embed.PRODUCER, Table.of(tmp_path))}[writer]
    with pytest.raises(TableMissingError, match="Materialize `raw_text` first"):
        run()
    assert not (tmp_path / "lance").exists()  # nothing was created on the way


SQUARE = pa.field("id_squared", pa.int64())


def id_squared(frag):
    ids = frag.to_table(columns=["id"]).column("id")
    yield pa.RecordBatch.from_arrays([pa.compute.multiply(ids, ids).combine_chunks()], [SQUARE.name])


def test_completeness_is_judged_by_the_write_marker_so_a_compaction_cannot_fake_it(root):
    """Fragment 0 of 4 written, then Lance's own compaction: the merged data file lists the
    column for every row (nulls where nothing was written), yet the rows stay unwritten and the
    next write fills them; the values written before are written again, equal."""
    from lance_assets.table.columns import unwritten_rows

    ingest(Table.of(root), "synthetic:200", rows_per_fragment=50, log=quiet)
    uri = paths.table_uri(root)
    first = lance.dataset(uri).get_fragments()[0].fragment_id

    def only_first(frag):
        if frag.fragment_id != first:
            raise RuntimeError("killed")  # what a killed backfill leaves: one fragment written
        yield from id_squared(frag)

    with pytest.raises(RuntimeError, match="killed"):
        write_columns(Table.of(root), [SQUARE], only_first, fragments_per_commit=1, log=quiet)
    lance.dataset(uri).optimize.compact_files()
    ds = lance.dataset(uri)
    assert len(ds.get_fragments()) == 1
    assert [r["id_squared"] for r in ds.to_table(columns=["id_squared"]).to_pylist()] == \
        [i * i for i in range(50)] + [None] * 150
    assert unwritten_rows(ds, [SQUARE.name]).unwritten_rows == 150
    assert [f.fragment_id for f in fragments_missing(ds, [SQUARE.name])] == \
        [ds.get_fragments()[0].fragment_id]
    report = write_columns(Table.of(root), [SQUARE], id_squared, log=quiet)
    assert report.rows_written == 200
    rows = lance.dataset(uri).to_table(columns=["id", "id_squared"]).to_pylist()
    assert all(r["id_squared"] == r["id"] ** 2 for r in rows)
    assert unwritten_rows(lance.dataset(uri), [SQUARE.name]).complete
    assert write_columns(Table.of(root), [SQUARE], id_squared, log=quiet).nothing_to_do


def test_a_column_written_before_write_markers_is_adopted_not_recomputed(root):
    """A table from before write markers: fragments whose column sits in a data file of its
    own (how write_columns always wrote it) get a marker file; only the others are computed."""
    ingest(Table.of(root), "synthetic:200", rows_per_fragment=50, log=quiet)
    uri = paths.table_uri(root)
    ds = lance.dataset(uri)
    ds.add_columns(pa.schema([SQUARE]))  # the old writer: columns, no marker ...
    ds = lance.dataset(uri)
    schema = pa.schema([ds.schema.field(SQUARE.name)])
    old = ds.get_fragments()[:2]
    groups = []
    for frag in old:  # ... and a data file of the column's own per fragment written
        batches = list(id_squared(frag))
        new = lance.fragment.write_fragments(pa.Table.from_batches(batches, schema), uri,
                                             schema=schema)
        groups.append(lance.LanceOperation.DataReplacementGroup(frag.fragment_id,
                                                                new[0].data_files()[0]))
    lance.LanceDataset.commit(uri, lance.LanceOperation.DataReplacement(groups),
                              read_version=ds.version)
    computed = []

    def counted(frag):
        computed.append(frag.fragment_id)
        yield from id_squared(frag)

    report = write_columns(Table.of(root), [SQUARE], counted, log=quiet)
    assert sorted(computed) == sorted(f.fragment_id for f in lance.dataset(uri).get_fragments()[2:])
    assert report.rows_written == 100
    rows = lance.dataset(uri).to_table(columns=["id", "id_squared", "_written_id_squared"]).to_pylist()
    assert all(r["id_squared"] == r["id"] ** 2 and r["_written_id_squared"] for r in rows)


def _constant(value, n_columns):
    def compute(frag):
        n = frag.physical_rows
        return [pa.record_batch([pa.array([value] * n, pa.int32())] * n_columns,
                                names=[f"c{i}" for i in range(n_columns)])]
    return compute


def test_a_column_written_in_one_group_is_refused_in_another_and_nothing_changes(root):
    """Columns written together share data files and one write marker. Writing one of them
    again as part of another group cannot replace those files: it is refused up front, naming
    the group, and the table (values and completeness) stays as it was."""
    ingest(Table.of(root), "synthetic:200", rows_per_fragment=100, log=quiet)
    uri = paths.table_uri(root)
    a = [pa.field("c0", pa.int32())]
    write_columns(Table.of(root), a, _constant(7, 1), log=quiet)
    version = lance.dataset(uri).version
    with pytest.raises(ValueError, match=r"part of the group \['c0'\].*same columns every time"):
        write_columns(Table.of(root), [*a, pa.field("c1", pa.int32())], _constant(8, 2), log=quiet)
    ds = lance.dataset(uri)
    assert ds.version == version and "c1" not in ds.schema.names
    assert ds.count_rows(filter="c0 = 7") == 200 and not fragments_missing(ds, ["c0"])
