"""The producer contract's steps: ``produce`` alone pins one version, builds each step's state on
it from the step before's result (a typed value) after that step committed, writes the groups in
order with that same pinned dataset (rows ingested meanwhile keep null markers for the next run,
in every group), returns the last step's result as the run's report, writes one group per item
for a step that fans out, stops on ``Skip``, and closes a compute holding a driver resource
however its write ends. The declaration is checked when the module loads."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest

from lance_assets.ingest.raw_text import ingest
from lance_assets.table import Table
from lance_assets.table.columns import ColumnWriteReport
from lance_assets.table.producer import ColumnProducer, Skip, Step, produce, setting
from lance_assets_tests.helpers import quiet, write_fineweb_parquet

N_CHARS = pa.field("char_count", pa.int64())
SHARE = pa.field("char_share", pa.float64())
DESCRIPTIONS = {N_CHARS.name: "Characters of `text`.",
                SHARE.name: "`char_count` over the pinned version's characters."}


def count_chars(frag):
    for batch in frag.to_batches(columns=["text"]):
        yield pa.RecordBatch.from_arrays(
            [pc.utf8_length(batch.column("text")).cast(pa.int64())], schema=pa.schema([N_CHARS]))


@dataclass(frozen=True)
class Share:
    total: int

    def __call__(self, frag):
        for batch in frag.to_batches(columns=[N_CHARS.name]):
            n = batch.column(N_CHARS.name).to_numpy(zero_copy_only=False)
            yield pa.RecordBatch.from_arrays([pa.array(n / self.total)], schema=pa.schema([SHARE]))


@dataclass(frozen=True)
class Counted:
    """The first step's result, handed to the second step's state as it is."""

    written: ColumnWriteReport


@dataclass
class ShareReport(ColumnWriteReport):
    """The run's report: the last step's write with the producer's own numbers."""

    total: int = 0
    counted: ColumnWriteReport | None = None


def _texts(n: int, seed: int) -> list[str]:
    rng = np.random.default_rng(seed)
    return [" ".join(["w"] * int(k)) for k in rng.integers(1, 40, n)]


def _ingest(root, path) -> None:
    ingest(Table.of(root), str(path), rows_per_fragment=50, log=quiet)


def _producer(**kw) -> ColumnProducer:
    return ColumnProducer(name="char_share", doc="test", descriptions=DESCRIPTIONS, **kw)


def test_steps_write_in_order_on_one_pinned_version(root, tmp_path):
    first, second = tmp_path / "a.parquet", tmp_path / "b.parquet"
    write_fineweb_parquet(first, _texts(200, 1))
    write_fineweb_parquet(second, _texts(100, 2), start_id=1000)
    _ingest(root, first)
    table = Table.of(root)
    pinned_at = table.newest().version
    seen = {}

    def total_then_an_ingest_lands(run, counted: Counted):
        # the reduce reads what the step before committed, on the pinned version's rows only
        seen["before"] = counted
        seen["committed"] = run.table.newest().count_rows(filter=f"{N_CHARS.name} IS NOT NULL")
        total = pc.sum(run.table.newest().to_table(
            columns=[N_CHARS.name], filter=f"id < {run.rows_end}").column(0)).as_py()
        _ingest(root, second)  # lands between the two writes
        return (counted, total)

    def after(run, state, written):
        counted, total = state
        return ShareReport(**vars(written), total=total, counted=counted.written)

    producer = _producer(steps=(
        Step(fields=[N_CHARS], compute=lambda settings, state: count_chars,
             after=lambda run, state, written: Counted(written)),
        Step(fields=[SHARE], state=total_then_an_ingest_lands,
             compute=lambda settings, state: Share(state[1]), after=after)))
    assert producer.columns == [N_CHARS.name, SHARE.name]  # the fields are its steps'
    report = produce(producer, table, fragments_per_commit=1, log=quiet)

    # the second step's state got the first step's result, once its write had committed
    assert isinstance(seen["before"], Counted) and seen["committed"] == 200
    assert isinstance(report, ShareReport)  # the last step's result stands for the run
    assert report.columns == [SHARE.name] and report.counted.columns == [N_CHARS.name]
    for written in (report.counted, report):
        assert written.pinned_version == pinned_at and written.rows_written == 200
    assert report.fragments_pending == 2  # the rows that landed wait, in both groups
    assert report.counted.fragments_pending == 0  # the ingest landed after the first write
    ds = table.newest()
    t = ds.to_table(columns=["id", "text", N_CHARS.name, SHARE.name]).sort_by("id")
    assert ds.count_rows(filter="_written_char_share IS NULL") == 100
    old = t.filter(pc.field("id") < 200)
    chars = np.array([len(x) for x in old.column("text").to_pylist()])
    assert old.column(N_CHARS.name).to_pylist() == chars.tolist()
    assert report.total == chars.sum()
    assert np.allclose(old.column(SHARE.name).to_numpy(), chars / chars.sum())

    # the next run pins the newest version and writes the rows that waited
    firsts = []  # the first step's result as the second step's state got it
    producer = _producer(steps=(
        Step(fields=[N_CHARS], compute=lambda settings, state: count_chars),
        Step(fields=[SHARE], state=lambda run, counted: firsts.append(counted) or 1,
             compute=lambda settings, total: Share(total))))
    again = produce(producer, table, log=quiet)
    assert [type(f) for f in firsts] == [ColumnWriteReport] and firsts[0].rows_written == 100
    assert again.rows_written == 100 and again.fragments_pending == 0
    assert type(again) is ColumnWriteReport  # no after: the write's own report


@dataclass(frozen=True)
class Bucket:
    """Documents of at least ``min_words`` words: one column per bucket, named by the data."""

    min_words: int

    @property
    def field(self) -> pa.Field:
        return pa.field(f"at_least_{self.min_words}", pa.bool_())

    def __call__(self, frag):
        for batch in frag.to_batches(columns=["text"]):
            words = pc.list_value_length(pc.utf8_split_whitespace(batch.column("text")))
            yield pa.RecordBatch.from_arrays([pc.greater_equal(words, self.min_words)],
                                             schema=pa.schema([self.field]))


@dataclass(frozen=True)
class BucketSettings:
    sizes: list[int] = setting(default_factory=lambda: [5, 20], help="Bucket sizes.")


def test_a_step_for_each_item_writes_one_group_per_item_of_its_state(root, tmp_path):
    path = tmp_path / "a.parquet"
    write_fineweb_parquet(path, _texts(120, 3))
    _ingest(root, path)

    def buckets(run, before):
        return [Bucket(n) for n in run.settings.sizes
                if f"at_least_{n}" not in run.pinned.schema.names]

    producer = _producer(
        settings=BucketSettings,
        steps=(Step(fields=lambda settings, bucket: [bucket.field], each=True, state=buckets,
                    compute=lambda settings, bucket: bucket,
                    after=lambda run, state, written: written),
               Step(fields=[N_CHARS], compute=lambda settings, state: count_chars,
                    state=lambda run, written: len(written))))
    assert producer.columns == [N_CHARS.name]  # columns named by the data are declared by none
    report = produce(producer, Table.of(root), BucketSettings([5, 20, 30]), log=quiet)
    assert report.columns == [N_CHARS.name] and report.rows_written == 120
    ds = Table.of(root).newest()
    words = [len(t.split()) for t in ds.to_table(columns=["text"]).column(0).to_pylist()]
    for n in (5, 20, 30):  # each bucket its own group, with its own write marker
        assert ds.to_table(columns=[f"at_least_{n}"]).column(0).to_pylist() == \
            [w >= n for w in words]
        assert f"_written_at_least_{n}" in ds.schema.names
    with pytest.raises(TypeError, match="settings are a BucketSettings"):
        produce(producer, Table.of(root), DataclassLike(), log=quiet)


@dataclass(frozen=True)
class DataclassLike:
    sizes: tuple = ()


def test_a_state_that_skips_writes_nothing_and_says_why(root):
    ingest(Table.of(root), "synthetic:60", rows_per_fragment=30, log=quiet)
    producer = _producer(fields=[N_CHARS], state=lambda run, before: Skip("no labels to learn from"),
                         compute=lambda settings, state: count_chars)
    done = produce(producer, Table.of(root), log=quiet)
    assert done == Skip("no labels to learn from")
    assert N_CHARS.name not in Table.of(root).newest().schema.names


class Closing:
    """A compute with a driver resource: it fails on one fragment; ``close`` must run."""

    closed = 0

    def __call__(self, frag):
        if frag.fragment_id == 1:
            raise ValueError("injected")
        return count_chars(frag)

    def close(self) -> None:
        Closing.closed += 1


def test_a_compute_is_closed_however_its_write_ends(root):
    ingest(Table.of(root), "synthetic:90", rows_per_fragment=30, log=quiet)
    producer = _producer(steps=(Step(fields=[N_CHARS], compute=lambda s, st: Closing()),
                                Step(fields=[SHARE], compute=lambda s, st: Share(1))))
    with pytest.raises(ValueError, match="injected"):
        produce(producer, Table.of(root), fragments_per_commit=1, log=quiet)
    assert Closing.closed == 1
    ds = Table.of(root).newest()
    assert ds.count_rows(filter=f"{N_CHARS.name} IS NOT NULL") == 30  # fragment 0 committed
    assert SHARE.name not in ds.schema.names  # the step after a failed one never ran


def test_the_declaration_is_checked_when_the_module_loads(root):
    compute = lambda settings, state: count_chars  # noqa: E731
    with pytest.raises(ValueError, match="exactly one of compute= .* and steps="):
        _producer(fields=[N_CHARS], compute=compute,
                  steps=(Step(fields=[N_CHARS], compute=compute),))
    with pytest.raises(ValueError, match="fields= and state= go with compute="):
        _producer(fields=[N_CHARS], steps=(Step(fields=[N_CHARS], compute=compute),))
    with pytest.raises(ValueError, match="non-empty tuple of Step"):
        _producer(steps=())
    with pytest.raises(ValueError, match="give it an after="):
        _producer(steps=(Step(fields=lambda s, item: [N_CHARS], compute=compute, each=True),))
    with pytest.raises(ValueError, match=r"columns \['char_share'\] have no description"):
        ColumnProducer(name="x", doc="x", descriptions={N_CHARS.name: "described"},
                       steps=(Step(fields=[N_CHARS, SHARE], compute=compute),))
    # the library takes a Table: a data root is resolved once, where it comes in
    with pytest.raises(TypeError, match=r"table is a Table \(Table.of"):
        produce(_producer(fields=[N_CHARS], compute=compute), str(root), log=quiet)
