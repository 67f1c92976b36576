"""Training on a mixture (`--domains`, `--weights`): each domain's share of tokens over every
window of steps, resume on another world size, and the refusals.

The table is `tokenized_root` copied, with a `domain` column added the way a user would add one
(a Lance column computed from `id`), and a `patchy` one that leaves some rows in no domain.
"""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

from lance_assets.table import Table
from lance_assets.train import checkpoint
from lance_assets.train.domains import quotas, schedule
from lance_assets.train.read_record import rows_read
from lance_assets.train.trainer import main
from lance_assets_tests.helpers import steps_logged

WEIGHTS = {"a": 0.6, "b": 0.3, "c": 0.1}
SMALL = {"small": "id % 100 = 1", "rest": "id % 100 != 1"}
EMPTY_DOMAIN = {"abc": "domain IN ('a', 'b', 'c')", "code": "domain = 'code'"}  # no row is code
DAGSTER = str(Path(sys.executable).with_name("dagster"))
REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def domain_root(tokenized_root, tmp_path_factory):
    root = tmp_path_factory.mktemp("mixture") / "data"
    shutil.copytree(tokenized_root, root)

    def columns(batch: pa.RecordBatch) -> pa.RecordBatch:
        ids = batch.column("id").to_pylist()
        return pa.record_batch({
            "domain": pa.array(["abc"[i % 3] for i in ids], pa.string()),
            "patchy": pa.array([None if i % 7 == 0 else ("even", "odd")[i % 2] for i in ids],
                               pa.string())})

    Table.of(root).commit("domain columns",
                          lambda ds: ds.add_columns(columns, read_columns=["id"]))
    return root


def args(root, out, *extra):
    return ["--data", str(root), "--out", str(out), "--seq-len", "16", "--batch-size", "8",
            "--eval-every", "1000", "--eval-blocks", "8", "--log-every", "1000", *extra]


def test_the_schedule_keeps_every_share_within_two_blocks_over_any_window():
    rng = np.random.default_rng(0)
    for trial in range(30):
        weights = rng.dirichlet(np.ones(int(rng.integers(2, 7))) * rng.choice([0.3, 1.0, 3.0]))
        sched = schedule(list(weights), seed=trial)
        share = quotas(list(weights)) / len(sched)  # the weights to 1 / PERIOD
        assert np.abs(share - weights).max() <= 1 / len(sched)
        twice = np.concatenate([sched, sched])  # the schedule repeats: windows wrap around
        for d, w in enumerate(share):
            drift = np.cumsum(twice == d) - w * np.arange(1, len(twice) + 1)
            assert drift.max() - drift.min() < 2, (trial, d)  # any window: within 2 blocks
        assert sched.tolist() == schedule(list(weights), seed=trial).tolist()  # deterministic


def test_each_domain_reads_its_share_of_tokens_over_every_window_of_50_steps(domain_root,
                                                                           tmp_path):
    """`--domains domain` (a column: one domain per value) at 0.6 / 0.3 / 0.1: every window of
    50 steps reads each domain's share of the tokens within 2 % of its weight; the summary and
    the read record say the tokens read per domain, and every document read is in its domain."""
    out = tmp_path / "run"
    assert main(args(domain_root, out, "--steps", "120", "--domains", "domain",
                     "--weights", json.dumps(WEIGHTS))) == 0
    steps = steps_logged(out)
    assert sorted(steps) == list(range(1, 121))
    per_step = np.array([[steps[s]["domain_tokens"][d] for d in WEIGHTS] for s in sorted(steps)])
    assert (per_step.sum(axis=1) == [steps[s]["tokens"] - steps.get(s - 1, {"tokens": 0})["tokens"]
                                     for s in sorted(steps)]).all()  # every token has a domain
    windows = np.lib.stride_tricks.sliding_window_view(per_step, 50, axis=0).sum(axis=2)
    shares = windows / windows.sum(axis=1, keepdims=True)
    assert np.abs(shares - list(WEIGHTS.values())).max() < 0.02

    summary = json.loads((out / "summary.json").read_text())
    read = summary["domains"]
    assert sum(v["tokens_read"] for v in read.values()) == summary["tokens_seen"]
    assert {d: round(v["share_read"], 2) for d, v in read.items()} == WEIGHTS
    record = json.loads((out / "read.json").read_text())
    assert record["domains"] == read and {e["domain"] for e in record["epochs"]} == set(WEIGHTS)
    ids = rows_read(out)
    ds = Table.of(domain_root).newest()
    by_domain = ds.to_table(columns=["id", "domain"]).to_pydict()
    domain_of = dict(zip(by_domain["id"], by_domain["domain"]))
    got = {d: sum(domain_of[i] == d for i in ids.tolist()) for d in WEIGHTS}
    assert got["a"] > got["b"] > got["c"] > 0  # documents read follow the weights


def test_a_mixture_resumes_on_another_world_size_with_the_same_blocks(domain_root, tmp_path):
    """Two ranks, then one rank with twice the accumulation from the step-20 checkpoint: the
    same blocks in every later step, the small domain repeated past its first epoch in both."""
    ref = tmp_path / "ref"
    common = ["--domains", json.dumps(SMALL), "--weights", '{"small": 0.7, "rest": 0.3}',
              "--seq-len", "64", "--steps", "40", "--ckpt-every", "20", "--keep-ckpts", "3",
              "--log-batch-hashes"]
    subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone",
                    "--nproc-per-node", "2", "-m", "lance_assets.train",
                    *args(domain_root, ref, "--batch-size", "4", *common)],
                   check=True, timeout=300, capture_output=True)
    reference = steps_logged(ref)
    one = tmp_path / "one"
    shutil.copytree(ref, one)
    (one / "ckpt_0000040.pt").unlink()
    assert checkpoint.load(one / "ckpt_0000020.pt")["world_size"] == 2
    assert main(args(domain_root, one, *common, "--batch-size", "4", "--grad-accum", "2",
                     "--resume", "auto")) == 0
    resumed = steps_logged(one)
    for step in range(21, 41):
        assert resumed[step]["batch_hashes"] == reference[step]["batch_hashes"], step
        assert resumed[step]["domain_tokens"] == reference[step]["domain_tokens"], step
    ref_summary = json.loads((ref / "summary.json").read_text())
    one_summary = json.loads((one / "summary.json").read_text())
    assert ref_summary["world_size"] == 2 and one_summary["world_size"] == 1
    assert one_summary["domains"] == ref_summary["domains"]
    assert ref_summary["domains"]["small"]["epochs"] > 1  # it ran out and started again
    assert rows_read(one).tolist() == rows_read(ref).tolist()


@pytest.mark.parametrize("extra, said", [
    (["--domains", "patchy", "--weights", '{"even": 1, "odd": 1}'], "in no domain"),
    (["--domains", json.dumps({"x": "id % 2 = 0", "y": "id % 3 = 0 OR id % 2 = 1"}),
      "--weights", '{"x": 1, "y": 1}'], "in two or more"),
    (["--domains", "domain", "--weights", '{"a": 1, "b": 1}'], "missing c"),
    (["--domains", "domain", "--weights", '{"a": 1, "b": 1, "c": 1, "d": 1}'],
     "no domain named d"),
    (["--domains", json.dumps({"x": "id >= 0; DROP TABLE corpus"}), "--weights", '{"x": 1}'],
     "';'"),
    (["--domains", "domain", "--weights", '{"a": 0.1, "b": 0.1, "c": 0.8}', "--steps", "3000",
      "--max-repeats", "1"], "more than --max-repeats 1"),
    (["--domains", "domain"], "--domains and --weights go together"),
    # a key given twice is refused, not silently taken as its last value
    (["--domains", '{"x": "id < 0", "y": "id % 2 = 1", "x": "id % 2 = 0"}', "--weights",
      '{"x": 1, "y": 1}'], "--domains: 'x' is given twice"),
    (["--domains", "domain", "--weights", '{"a": 1, "b": 1, "c": 1, "a": 2}'],
     "--weights: 'a' is given twice"),
    (["--domains", json.dumps(EMPTY_DOMAIN), "--weights", '{"abc": 1, "code": 1}'],
     "domain 'code' (predicate `domain = 'code'`) holds 0 rows / 0 tokens at version"),
    (["--domains", "domain", "--weights", '{"a": 1, "b": 1, "c": 1}', "--num-workers", "2"],
     "use --num-workers 0"),
])
def test_a_mixture_that_cannot_train_is_one_line_naming_the_flag(domain_root, tmp_path, capsys,
                                                                 extra, said):
    try:
        status = main(args(domain_root, tmp_path / "run", "--steps", "5", *extra))
    except SystemExit as e:  # argparse: the flags alone are inconsistent
        status = e.code
    assert status == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and said in err and "--" in err, err
    assert not (tmp_path / "run" / "metrics.jsonl").exists()


def test_the_assets_refuse_an_empty_domain_or_arm_before_any_tag_plan_or_process(domain_root,
                                                                                  tmp_path):
    """`mixture_search` and `pretrained_model` with a domain that holds no row, and
    `curation_ablation` with an arm that keeps none, in one `dagster asset materialize`: each
    step fails naming the domain or arm with its rows and tokens, and nothing was tagged,
    planned or launched."""
    root = tmp_path / "data"
    shutil.copytree(domain_root, root)
    config = {"ops": {
        "mixture_search": {"config": {"name": "refused", "filter": "NOT is_dup",
                                      "domains": EMPTY_DOMAIN}},
        "pretrained_model": {"config": {"run_name": "refused", "domains": json.dumps(EMPTY_DOMAIN),
                                        "weights": '{"abc": 0.9, "code": 0.1}', "steps": 5,
                                        "seq_len": 16, "eval_blocks": 8}},
        "curation_ablation": {"config": {"name": "refused", "seeds": [0, 1], "token_budget": 4096,
                                         "evals_per_run": 1, "eval_blocks": 8,
                                         "rule_sets": {"kept": {}, "code": {"c": "domain = 'code'"}}}},
    }}
    env = {k: v for k, v in os.environ.items() if k != "DAGSTER_HOME"}
    env.update(LANCE_ASSETS_DATA=str(root), DAGSTER_HOME=str(tmp_path / "home"), LANCE_LOG="error")
    (tmp_path / "home").mkdir()
    run = subprocess.run([DAGSTER, "asset", "materialize", "-m", "lance_assets.definitions",
                          "--select", "mixture_search,pretrained_model,curation_ablation",
                          "--config-json", json.dumps(config)], cwd=REPO, env=env,
                         capture_output=True, text=True, timeout=600)
    said = run.stdout + run.stderr
    assert run.returncode != 0, said[-3000:]
    # each step's failure as the instance recorded it (a step process's own log lines may reach
    # the CLI's output after it exits)
    import dagster as dg

    with dg.DagsterInstance.from_config(str(tmp_path / "home")) as instance:
        [record] = instance.get_run_records()
        failed = {e.step_key: e.dagster_event.step_failure_data.error.message
                  for e in instance.all_logs(record.dagster_run.run_id,
                                             of_type=dg.DagsterEventType.STEP_FAILURE)}
    assert set(failed) == {"mixture_search", "pretrained_model", "curation_ablation"}, failed
    empty = "domain 'code' (predicate `domain = 'code'`) holds 0 rows / 0 tokens at version"
    assert empty in failed["mixture_search"] and empty in failed["pretrained_model"], failed
    assert "nothing was tagged or launched" in failed["pretrained_model"]
    assert ("arm 'code' (rules {'c': \"domain = 'code'\"}) keeps 0 rows / 0 tokens"
            in failed["curation_ablation"]), failed
    assert not any(w in m for m in failed.values() for w in ("ValueError", "Dirichlet")), failed
    assert "launching:" not in said
    tags = list(Table.of(root).newest().tags.list())
    assert not [t for t in tags if t.startswith(("ablation-", "train-"))], tags
    assert not list(root.glob("ablations/**/plan.json")) and not (root / "train" / "refused").exists()



def test_a_mixture_resumes_on_its_snapshot_after_a_forget_redacted_it(domain_root, tmp_path):
    """A mixture run and a plain packed run read one tagged snapshot; a forget of one document
    of the small domain the mixture read redacts the snapshot; `--resume auto` of each goes on
    there (the loader's epoch on the copy's length, no part-filled block of before), and says
    one document is gone; the mixture keeps its domains and never reads the document again."""
    from lance_assets.table.forget import forget
    from lance_assets.table.snapshots import RUN
    from lance_assets_tests.helpers import quiet

    root = tmp_path / "data"
    shutil.copytree(domain_root, root)
    table = Table.of(root)
    table.snapshots.hold("train-mix", table.newest().version, owner="test", kind=RUN)
    out = tmp_path / "mix"
    common = ["--table-tag", "train-mix", "--domains", json.dumps(SMALL),
              "--weights", '{"small": 0.5, "rest": 0.5}', "--ckpt-every", "4"]
    assert main(args(root, out, *common, "--steps", "4")) == 0
    plain = tmp_path / "plain"
    assert main(args(root, plain, "--table-tag", "train-mix", "--steps", "2", "--pack")) == 0
    small = [int(i) for i in rows_read(out) if int(i) % 100 == 1]
    assert small  # the run read the small domain
    report = forget(table, f"id = {small[0]}", force=True, log=quiet)
    assert "train-mix" in report.redacted and table.snapshots.get("train-mix").branch
    assert main(args(root, out, *common, "--steps", "8", "--resume", "auto")) == 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["step"] == 8 and set(summary["domains"]) == set(SMALL)
    assert summary["redacted"]["documents"] == 1 and summary["redacted"]["from_step"] == 4
    assert small[0] not in rows_read(out).tolist()
    assert main(args(root, plain, "--table-tag", "train-mix", "--steps", "4", "--pack",
                     "--resume", "auto")) == 0
    summary = json.loads((plain / "summary.json").read_text())
    assert summary["step"] == 4 and summary["redacted"]["documents"] == 1
