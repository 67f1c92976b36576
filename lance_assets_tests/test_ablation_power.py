"""Ablations that can tell: planted junk is found and called real, a null comparison is not.

Each planting is a new corpus (``corpus.synthetic.planted_junk``): clean documents (short
sentences, which a `tiny` model learns within a few hundred steps) and word salad made of the
same words in random order, about a fifth of the bytes, marked by a FineWeb-Edu-style ``score``
(4 clean, 0.5 salad). The held-out yardstick is the clean text (``eval_filter: score >= 3``).

- **junk**: ``keep_all`` against ``drop_junk`` (``score >= 3``): ``drop_junk`` must be named
  and its lead called real;
- **null**: the junk removed from both arms, ``drop_junk`` against ``drop_junk_subset`` (a fifth
  of the clean documents dropped by id): no lead may be called real.

The comparison is the asset's own: its config (every default but the budget and the curve's
points, ``TEST_SETTINGS``), its plan, ``run_arms`` seed by seed and the paired verdict, with
every run the trainer's CLI on the asset's own arguments, run in this process instead of under
torchrun (the launch is `test_ablation.py`'s subject).
"""

from pathlib import Path

import lance
import pyarrow as pa
import pytest

from lance_assets import paths
from lance_assets.ablation import plan as ablation
from lance_assets.ingest.synthetic import planted_junk
from lance_assets.table import Table
from lance_assets_tests.helpers import build_table, quiet, write_fineweb_parquet

JUNK = {"keep_all": {}, "drop_junk": {"quality": "score >= 3"}}
NULL = {"drop_junk": {"quality": "score >= 3"},
        "drop_junk_subset": {"quality": "score >= 3", "subset": "id % 5 != 0"}}
# Half the default's steps (256 of the default batch) at half the default context: this corpus
# is learnt by then (in fewer steps the proxies still differ by chance, which is why the default
# budget is 512 steps). One planting runs here; the benchmark
# (`benchmarks/ablation_power.py`) runs more. One validation pass per run besides the
# first: the verdict reads the last one only (the others draw the curves), and a pass changes
# nothing in training, so the figures are those of the default's four.
TEST_SETTINGS = {"token_budget": 65_536, "seq_len": 32, "evals_per_run": 1}


@pytest.fixture(autouse=True)
def one_thread():
    """A proxy's losses depend on torch's thread count (the order in which a matrix product
    adds up), so the figures are pinned to one thread, whatever the cores or the test workers
    beside this one. With one thread planting 0 gives: junk, ``drop_junk`` leads by 0.093 ±
    0.030 val_bpb (every seed's lead 0.08–0.11, the budget's detectable lead 0.038); null, 0.005
    ± 0.029, not real. Two threads cost half as much CPU again for the same verdicts."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def planted_root(base: Path, seed: int) -> Path:
    texts, scores = planted_junk(seed=seed)
    source = write_fineweb_parquet(base / f"planted-{seed}.parquet", texts,
                                   extra={"score": pa.array(scores, pa.float64())})
    return build_table(base / f"data-{seed}", str(source), rows_per_fragment=300,
                       upto=["dedup_flag", "token_ids"])


def compare(root: Path, rule_sets: dict, name: str) -> ablation.Outcome:
    """The asset's comparison, every run the trainer's CLI in this process."""
    from lance_assets.ablation import runner
    from lance_assets.defs.training.ablation import AblationConfig, pinned_version, plan_for
    from lance_assets.train.trainer import main

    config = AblationConfig(name=name, rule_sets=rule_sets, eval_filter="score >= 3",
                            **TEST_SETTINGS)
    table = Table.of(root)
    tag, version = pinned_version(table, name)
    plan = plan_for(config, table.open(version), rule_sets)
    table.snapshots.hold(tag, version, owner="test", kind="ablation")
    snapshot = (tag, version)

    def spec(arm, seed, out):
        return runner.run_spec(table, config, plan, arm, seed, out, snapshot)

    def folder(arm):
        return ablation.arm_folder(arm, runner.result_key(spec(arm, 0, Path("x")), plan,
                                                          {"train": arm.train_filter}))

    runs = ablation.run_arms(plan, config.seeds, paths.ablation_dir(root, name), folder,
                             log=quiet)
    while True:
        try:
            arm, seed, out = next(runs)
        except StopIteration as done:
            return done.value
        assert main(spec(arm, seed, out).argv()) == 0


def test_planted_junk_is_named_and_real_and_a_null_comparison_is_not(tmp_path):
    root = planted_root(tmp_path, 0)
    share = ablation.plan_ablation(lance.dataset(paths.table_uri(root)), JUNK, token_budget=1,
                                   seq_len=64, global_batch=32, num_splits=8,
                                   eval_filter="score >= 3")
    junk_tokens = 1 - share.arm("drop_junk").tokens / share.arm("keep_all").tokens
    assert 0.17 < junk_tokens < 0.23  # about a fifth of what keep_all trains on is junk

    junk = compare(root, JUNK, "junk")
    v = junk.verdict
    assert v.best == "drop_junk" and v.real is True, v.text
    assert len(v.lead.seeds) == 3 and all(d > 0 for d in v.lead.diffs)
    assert v.lead.held_out_se is not None and v.lead.held_out_docs > 20
    assert junk.power and junk.power[-1].detectable < v.lead.lead  # it could see this lead

    null = compare(root, NULL, "junk")  # drop_junk's runs are found again, not retrained
    assert null.reused == 3 and null.trained == 3
    assert null.verdict.real is False, null.verdict.text
