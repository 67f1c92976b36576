"""The producer contract's ``steps``: ``produce`` alone pins one version, builds each step's
state on it after the steps before committed, writes the groups in order with that same pinned
dataset (rows ingested meanwhile keep null markers for the next run, in every group), runs the
``after`` hooks, stops on ``Skip``, and closes a compute holding a driver resource however its
write ends."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest

from lance_assets.ingest.raw_text import ingest
from lance_assets.table import Table
from lance_assets.table.producer import ColumnProducer, Skip, Step, fixed, produce
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


def _texts(n: int, seed: int) -> list[str]:
    rng = np.random.default_rng(seed)
    return [" ".join(["w"] * int(k)) for k in rng.integers(1, 40, n)]


def _ingest(root, path) -> None:
    ingest(Table.of(root), str(path), rows_per_fragment=50, log=quiet)


def _producer(**kw) -> ColumnProducer:
    return ColumnProducer(name="char_share", doc="test", fields=[N_CHARS, SHARE],
                          descriptions=DESCRIPTIONS, **kw)


def test_steps_write_in_order_on_one_pinned_version(root, tmp_path):
    first, second = tmp_path / "a.parquet", tmp_path / "b.parquet"
    write_fineweb_parquet(first, _texts(200, 1))
    write_fineweb_parquet(second, _texts(100, 2), start_id=1000)
    _ingest(root, first)
    table = Table.of(root)
    pinned_at = table.newest().version
    seen = {}

    def total_then_an_ingest_lands(run):
        # the reduce reads what the step before committed, on the pinned version's rows only
        seen["states_before"] = dict(run.reports)
        total = pc.sum(run.table.newest().to_table(
            columns=[N_CHARS.name], filter=f"id < {run.rows_end}").column(0)).as_py()
        _ingest(root, second)  # lands between the two writes
        return total

    def after(run, total):
        return run.table.newest().count_rows(filter=f"{SHARE.name} IS NOT NULL"), total

    producer = _producer(steps=(
        Step(fields=[N_CHARS], compute=fixed(count_chars)),
        Step(fields=[SHARE], state=total_then_an_ingest_lands,
             compute=lambda settings, total: Share(total), after=after)))
    done = produce(producer, root, fragments_per_commit=1, log=quiet, summarize=False)

    run = done.run
    assert list(seen["states_before"]) == [N_CHARS.name]  # the first step had committed
    assert run.pinned.version == pinned_at
    for name in (N_CHARS.name, SHARE.name):
        assert run.reports[name].pinned_version == pinned_at
        assert run.reports[name].rows_written == 200
    assert done.write is run.reports[SHARE.name]  # the last step's report stands for the run
    assert done.write.fragments_pending == 2  # the rows that landed wait, in both groups
    assert run.after[SHARE.name] == (200, run.states[SHARE.name])
    ds = table.newest()
    t = ds.to_table(columns=["id", "text", N_CHARS.name, SHARE.name]).sort_by("id")
    assert ds.count_rows(filter="_written_char_share IS NULL") == 100
    old = t.filter(pc.field("id") < 200)
    chars = np.array([len(x) for x in old.column("text").to_pylist()])
    assert old.column(N_CHARS.name).to_pylist() == chars.tolist()
    assert np.allclose(old.column(SHARE.name).to_numpy(), chars / chars.sum())

    # the next run pins the newest version and writes the rows that waited
    producer = _producer(steps=(
        Step(fields=[N_CHARS], compute=fixed(count_chars)),
        Step(fields=[SHARE], state=lambda run: 1, compute=lambda settings, total: Share(total))))
    again = produce(producer, root, log=quiet, summarize=False)
    assert again.run.reports[N_CHARS.name].rows_written == 100
    assert again.write.rows_written == 100 and again.write.fragments_pending == 0


def test_a_state_that_skips_writes_nothing_and_says_why(root):
    ingest(Table.of(root), "synthetic:60", rows_per_fragment=30, log=quiet)
    producer = _producer(state=lambda run: Skip("no labels to learn from"),
                         compute=fixed(count_chars))
    done = produce(producer, root, log=quiet)
    assert done.write is None and done.skipped == "no labels to learn from"
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
        produce(producer, root, fragments_per_commit=1, log=quiet)
    assert Closing.closed == 1
    ds = Table.of(root).newest()
    assert ds.count_rows(filter=f"{N_CHARS.name} IS NOT NULL") == 30  # fragment 0 committed
    assert SHARE.name not in ds.schema.names  # the step after a failed one never ran


def test_the_declaration_is_checked_when_the_module_loads():
    with pytest.raises(ValueError, match="exactly one of compute= .* and steps="):
        _producer(compute=fixed(count_chars), steps=(Step(fields=[N_CHARS], compute=fixed(count_chars)),))
    with pytest.raises(ValueError, match="needs a name="):
        Step(fields=lambda settings, state: [N_CHARS], compute=fixed(count_chars))
    with pytest.raises(ValueError, match="non-empty tuple of Step"):
        _producer(steps=())
