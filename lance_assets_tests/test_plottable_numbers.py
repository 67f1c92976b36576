"""Numbers Dagster plots across materializations, checked against plain recomputations:

- ``null_share/<column>`` counts the rows a column writer has not reached yet;
- ``curation_rules``' rows and tokens kept, and removed per rule (``removed_rows/<rule>``,
  ``removed_tokens/<rule>``), equal sums over the rows each rule keeps or drops;
- the loss-curve table keeps every evaluation, thins the training points, and lists a step a
  resumed run logged twice once.
"""

from __future__ import annotations

import json

import lance
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from hypothesis import given, settings
from hypothesis import strategies as st

from lance_assets import paths
from lance_assets.curation import dedup_flag
from lance_assets.curation import rules as rules_lib
from lance_assets.defs.curation.assets import curation_numbers
from lance_assets.defs.metadata import null_share_metadata
from lance_assets.defs.training.assets import MAX_CURVE_ROWS, loss_curve_records
from lance_assets.ingest.raw_text import ingest
from lance_assets.ingest.synthetic import SyntheticSpec, generate
from lance_assets.table import Table
from lance_assets.table.producer import produce
from lance_assets_tests.helpers import quiet


def test_null_share_counts_rows_the_writer_has_not_reached(tmp_path):
    landing = tmp_path / "landing"
    landing.mkdir()
    texts = generate(SyntheticSpec(rows=150, seed=4)).column("text")
    pq.write_table(pa.table({"text": texts.slice(0, 100)}), landing / "a.parquet")
    root = tmp_path / "data"
    ingest(Table.of(root), str(landing), rows_per_fragment=50, log=quiet)
    produce(dedup_flag.PRODUCER, Table.of(root), log=quiet)
    uri = paths.table_uri(root)
    assert null_share_metadata(Table.of(uri), ["is_dup"]) == {"null_share/is_dup": 0.0}

    pq.write_table(pa.table({"text": texts.slice(100, 50)}), landing / "b.parquet")
    ingest(Table.of(root), str(landing), rows_per_fragment=50, log=quiet)  # 50 rows without is_dup yet
    assert null_share_metadata(Table.of(uri), ["is_dup"]) == {"null_share/is_dup": round(50 / 150, 6)}


def test_curation_numbers_equal_sums_over_the_rows_each_rule_keeps(tokenized_root):
    ds = lance.dataset(paths.table_uri(tokenized_root))
    rules = {"exact_dup": "NOT is_dup", "long": "word_count >= 60", "broken": "no_such_column > 1"}
    numbers = curation_numbers(rules_lib.evaluate(ds, rules), rules_lib.token_hits(ds, rules))

    table = ds.to_table(columns=["is_dup", "word_count", "n_tokens"])
    tokens = table["n_tokens"].fill_null(0)
    keeps = {"exact_dup": pc.invert(table["is_dup"]),
             "long": pc.greater_equal(table["word_count"], 60)}
    for rule, keep in keeps.items():
        keep = keep.fill_null(False)  # NULL does not pass a rule
        assert numbers[f"removed_rows/{rule}"] == table.num_rows - pc.sum(keep).as_py()
        assert numbers[f"removed_tokens/{rule}"] == pc.sum(pc.if_else(keep, 0, tokens)).as_py()
        assert isinstance(numbers[f"removed_tokens/{rule}"], int)
    assert numbers["total_tokens"] == pc.sum(tokens).as_py() > 0
    # a broken rule has no figures, and nothing is "kept" while one is broken
    assert "removed_rows/broken" not in numbers and "kept_tokens" not in numbers

    usable = {k: v for k, v in rules.items() if k != "broken"}
    numbers = curation_numbers(rules_lib.evaluate(ds, usable), rules_lib.token_hits(ds, usable))
    both = pc.and_(*(k.fill_null(False) for k in keeps.values()))
    assert numbers["kept_tokens"] == pc.sum(pc.if_else(both, tokens, 0)).as_py()
    assert numbers["kept_token_share"] == round(numbers["kept_tokens"] / numbers["total_tokens"], 4)


def write_metrics(path, steps: list[int], eval_every: int) -> None:
    lines = []
    for step in steps:
        if step % eval_every == 0:
            lines.append({"step": step, "val_loss": 10.0 / (step + 1), "val_bpb": 1.0})
        if step > 0:
            lines.append({"step": step, "loss": 5.0 / step, "lr": 1e-3})
    path.write_text("".join(json.dumps(x) + "\n" for x in lines))


@settings(max_examples=30, deadline=None)
@given(last=st.integers(1, 3000), eval_every=st.integers(1, 400), resumed_at=st.integers(0, 3000))
def test_loss_curve_table_keeps_every_evaluation_and_thins_the_rest(tmp_path_factory, last,
                                                                    eval_every, resumed_at):
    # a run that was resumed at `resumed_at` logs the steps after its checkpoint again
    steps = list(range(last + 1)) + list(range(min(resumed_at, last), last + 1))
    path = tmp_path_factory.mktemp("curve") / "metrics.jsonl"
    write_metrics(path, steps, eval_every)
    rows = loss_curve_records(path)

    got = [r["step"] for r in rows]
    assert got == sorted(set(got))  # one row per step, in order
    evals = set(range(0, last + 1, eval_every))
    assert {r["step"] for r in rows if r["val_loss"] is not None} == evals
    assert got[0] == 0 and got[-1] == last
    assert len(rows) <= MAX_CURVE_ROWS + len(evals)
    assert all(r["train_loss"] == 5.0 / r["step"] for r in rows if r["step"] > 0)
