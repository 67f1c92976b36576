"""`curation_ablation`: proxy models per rule set, equal tokens, one held-out split.

The corpus is built here: half clean sentences (score 4), half planted garbage (word salad of
consonant strings and boilerplate lines, score 0.5). One arm keeps everything, one keeps
`score >= 3`, one is too strict to fill the budget. The held-out reference is the clean text
that no arm trains on (`eval_filter`), the DCLM setup: evaluate on what the model should be
good at.
"""

import json
import random
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import lance
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lance_assets import paths
from lance_assets.ablation import plan as ablation
from lance_assets.curation.predicate import safe_predicate
from lance_assets.table import Table
from lance_assets_tests.helpers import build_table, write_fineweb_parquet

SUBJECTS = ["the cat", "a dog", "the bird", "my friend", "the teacher"]
VERBS = ["sees", "likes", "finds", "helps", "follows"]
OBJECTS = ["the ball.", "a house.", "the tree.", "some water.", "the road."]
BOILERPLATE = ["Click here | Subscribe now!!!", "All rights reserved (c) 2024",
               "Login | Register | Cart (0)", "Cookie policy >> accept"]

ARMS = {"keeps_garbage": {},
        "drops_garbage": {"quality": "score >= 3"},
        "too_strict": {"quality": "score >= 3", "first_docs": "id < 30"}}
HELD_OUT_REFERENCE = "NOT is_dup AND score >= 3"
CONFIG = {"rule_sets": ARMS, "eval_filter": HELD_OUT_REFERENCE, "seeds": [0], "seq_len": 32,
          "token_budget": 16384, "eval_blocks": 64, "evals_per_run": 2}


def corpus_texts(n: int, seed: int = 0) -> tuple[list[str], list[float]]:
    rng = random.Random(seed)
    texts, scores = [], []
    for _ in range(n):
        r = rng.random()
        if r < 0.5:
            texts.append(" ".join(f"{rng.choice(SUBJECTS)} {rng.choice(VERBS)} "
                                  f"{rng.choice(OBJECTS)}" for _ in range(rng.randrange(8, 16))))
            scores.append(4.0)
        elif r < 0.75:
            texts.append(" ".join("".join(rng.choice("qxzjkvwpyfgb")
                                          for _ in range(rng.randrange(3, 9)))
                                  for _ in range(rng.randrange(40, 90))))
            scores.append(0.5)
        else:
            texts.append("\n".join(rng.choice(BOILERPLATE) for _ in range(rng.randrange(6, 14))))
            scores.append(0.5)
    return texts, scores


@pytest.fixture(scope="module")
def garbage_root(tmp_path_factory):
    """800 documents, half planted garbage, deduplicated and byte-tokenized."""
    base = tmp_path_factory.mktemp("ablation")
    texts, scores = corpus_texts(800)
    source = write_fineweb_parquet(base / "corpus.parquet", texts,
                                   extra={"score": pa.array(scores, pa.float64())})
    return build_table(base / "data", str(source), rows_per_fragment=400,
                       upto=["dedup_flag", "token_ids"])


def dataset(root: Path) -> lance.LanceDataset:
    return lance.dataset(paths.table_uri(root))


def plan(root: Path, rule_sets, **kw) -> ablation.AblationPlan:
    args = {"token_budget": 16384, "seq_len": 32, "global_batch": 8, "num_splits": 8,
            "eval_filter": HELD_OUT_REFERENCE, **kw}
    return ablation.plan_ablation(dataset(root), rule_sets, **args)


# ---- the plan: held-out split, rule checks, equal tokens


@settings(max_examples=200, deadline=None)
@given(st.integers(min_value=0, max_value=2**62))
def test_id_hash_bucket_in_sql_matches_python(doc_id):
    """The held-out split is the same rows whichever engine evaluates it (DuckDB here, Lance in
    the trainer): the SQL arithmetic equals the Python function for any id."""
    import duckdb

    pred = safe_predicate(f"{ablation.id_hash_bucket_sql()} >= 0", ["id"])
    expr = pred.duckdb.split(" >= ")[0]
    got = duckdb.sql(f"SELECT {expr} FROM (SELECT {doc_id}::BIGINT AS id)").fetchall()[0][0]
    assert got == ablation.id_hash_bucket(doc_id)


def test_held_out_split_is_common_and_disjoint_from_every_arm(garbage_root):
    p = plan(garbage_root, ARMS)
    ds = dataset(garbage_root)
    held = {r["id"] for r in ds.to_table(columns=["id"], filter=p.held_out).to_pylist()}
    clean = {r["id"] for r in ds.to_table(columns=["id"], filter="score >= 3").to_pylist()}
    assert held and held <= clean
    by_python = {i for i in clean if ablation.id_hash_bucket(i) < 10}  # Lance agrees with Python
    assert held == by_python - {r["id"] for r in ds.to_table(columns=["id"],
                                                             filter="is_dup").to_pylist()}
    assert 0.04 < len(held) / len(clean) < 0.2  # about eval_pct = 10 per cent of the reference
    for arm in p.arms:
        trained = {r["id"] for r in ds.to_table(columns=["id"],
                                                filter=arm.train_filter).to_pylist()}
        assert trained and not trained & held, arm.name
    assert p.arm("keeps_garbage").docs > 1.5 * p.arm("drops_garbage").docs


def test_an_arm_short_of_the_budget_is_reported_with_its_epochs_and_not_trained(garbage_root):
    p = plan(garbage_root, ARMS)
    strict = p.arm("too_strict")
    assert strict.epochs_needed > 1 and not strict.trained
    assert f"{strict.epochs_needed:.2f} epochs" in strict.note and "allow_repeats" in strict.note
    assert p.arm("drops_garbage").trained and p.arm("drops_garbage").epochs_needed < 1
    assert plan(garbage_root, ARMS, allow_repeats=True).arm("too_strict").trained


@pytest.mark.parametrize("rules, expected", [
    ({"evil": "score >= 3; DROP TABLE corpus"}, "';'"),
    ({"evil": "score >= 3 OR id IN (SELECT id FROM corpus)"}, "subqueries"),
    ({"evil": "read_text('/etc/passwd') IS NOT NULL"}, "read_text"),
    ({"evil": "score >= 3 -- comment"}, "comment"),
    ({"evil": "no_such_column > 1"}, "no_such_column"),
    ({"bad name!": "score >= 3"}, "identifier"),
])
def test_hostile_or_broken_rule_sets_are_refused_naming_the_arm_and_rule(garbage_root, rules,
                                                                        expected):
    with pytest.raises(ablation.AblationError) as err:
        plan(garbage_root, {"fine": {}, "suspect": rules})
    message = str(err.value)
    assert "arm 'suspect'" in message and expected in message and "rule_sets" in message
    assert "arm 'fine'" not in message


# ---- verdict: the paired lead against its error


def result(name: str, values: list[float]) -> ablation.ArmResult:
    arm = ablation.ArmPlan(name, {}, "", "", 1, 1, 1.0, 1, 0.5, True)
    return ablation.ArmResult(name, arm, {i: {"val_bpb": v, "tokens_per_s": 1.0}
                                          for i, v in enumerate(values)})


def test_a_lead_hidden_in_the_seed_spread_is_real_when_every_seed_agrees():
    """Seeds move both arms together (a lucky initialisation helps every arm): the unpaired
    spread (sd 0.2) hides a lead of 0.1 that every seed shows; the paired verdict sees it."""
    shared = [2.0, 2.2, 1.8, 2.1]
    paired = ablation.verdict([result("a", shared), result("b", [v + 0.1 + e for v, e in
                                                                zip(shared, [0.004, -0.003,
                                                                             0.002, -0.001])])])
    assert paired.best == "a" and paired.real is True and "real" in paired.text
    assert paired.lead.lead == pytest.approx(0.1005) and paired.lead.se < 0.005
    noisy = ablation.verdict([result("a", [2.0, 2.2, 1.8]), result("b", [2.1, 2.1, 1.85])])
    assert noisy.best == "a" and noisy.real is False and "not shown to be real" in noisy.text
    one_seed = ablation.verdict([result("a", [2.0]), result("b", [1.5])])
    assert one_seed.best == "b" and one_seed.real is None and "two" in one_seed.text


# ---- the asset: cancel mid-arm, rerun, the arm without garbage wins

RUNNER = textwrap.dedent("""
    import json, sys
    from lance_assets.defs.training.ablation import materialize_in_process

    materialize_in_process(sys.argv[1], json.loads(sys.argv[2]), raise_on_error=False)
""")


def run_folder(root: Path, arm: str) -> Path | None:
    """The arm's seed-0 run of the unnamed ablation, which is named after the data it pins
    (``fingerprint.data_version``: the rerun finds the same name)."""
    from lance_assets.defs.training.ablation import unnamed

    found = sorted((paths.ablation_dir(root, unnamed(Table.of(root)))).glob(f"{arm}-*/seed-0"))
    return found[0] if found else None


def loss_lines(folder: Path | None) -> int:
    metrics = folder / "metrics.jsonl" if folder else None
    if metrics is None or not metrics.is_file():
        return 0
    return sum('"loss"' in line for line in metrics.read_text().splitlines())


def test_cancelled_ablation_resumes_and_names_the_arm_without_garbage(garbage_root, tmp_path):
    script = tmp_path / "runner.py"
    script.write_text(RUNNER)
    proc = subprocess.Popen([sys.executable, str(script), str(garbage_root), json.dumps(CONFIG)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.time() + 480  # a runner and two torchruns start: minutes under load
    while time.time() < deadline:  # the first arm finished, the second one mid-way
        if loss_lines(run_folder(garbage_root, "drops_garbage")) >= 3:
            break
        if proc.poll() is not None:
            raise AssertionError("the ablation ended early: " + proc.stderr.read().decode()[-3000:])
        time.sleep(0.05)
    else:
        proc.kill()
        raise AssertionError("the second arm never started: " + proc.stderr.read().decode()[-3000:])
    proc.send_signal(signal.SIGINT)  # what the run worker gets when the run is cancelled
    proc.communicate(timeout=120)

    first, second = run_folder(garbage_root, "keeps_garbage"), run_folder(garbage_root,
                                                                           "drops_garbage")
    finished = json.loads((first / "summary.json").read_text())
    assert not finished["interrupted"]
    interrupted = json.loads((second / "summary.json").read_text())
    assert interrupted["interrupted"] and interrupted["step"] < interrupted["steps_requested"]
    first_files = {p.name: p.stat().st_mtime_ns for p in first.iterdir()}

    from lance_assets.defs.training.ablation import materialize_ablation

    meta = materialize_ablation(garbage_root, CONFIG)

    assert meta["runs_reused"].value == 1 and meta["runs_trained"].value == 1
    assert {p.name: p.stat().st_mtime_ns for p in first.iterdir()} == first_files  # not retrained
    rows = [json.loads(line) for line in (second / "metrics.jsonl").read_text().splitlines()]
    assert sum(r["step"] == 0 for r in rows) == 1  # resumed from its checkpoint, not restarted
    done = json.loads((second / "summary.json").read_text())
    assert done["step"] == done["steps_requested"] == meta["steps_per_run"].value
    assert done["eval_filter"] == finished["eval_filter"]  # one held-out split for every arm
    assert done["table_tag"] == finished["table_tag"] == meta["lance/snapshot_tag"].value
    from lance_assets.defs.training.ablation import unnamed

    # unnamed: the data it compares on
    assert meta["lance/snapshot_tag"].value == f"ablation-{unnamed(Table.of(garbage_root))}"

    arms = {r.data["arm"]: r.data for r in meta["arms"].value.records}
    assert arms["too_strict"]["seeds"] == 0 and arms["too_strict"]["epochs_needed"] > 1
    assert "arm/too_strict/val_bpb" not in meta
    clean, dirty = meta["arm/drops_garbage/val_bpb"].value, meta["arm/keeps_garbage/val_bpb"].value
    assert clean < dirty
    assert meta["best_arm"].value == "drops_garbage"
    assert "val_curves" in meta
    assert meta["arm/drops_garbage/val_bpb_se"].value > 0  # each arm's held-out error
    assert "drops_garbage" in meta["paired_leads"].value and "smallest_detectable_lead" in meta
    held = json.loads((second / "held_out.json").read_text())
    assert sum(held["doc_tokens"]) == done["eval_tokens"] and len(held["doc_tokens"]) > 1
    # the data diff: a fresh instance has no earlier ablation; two arms differ by their rules
    assert "No earlier materialization of `curation_ablation`" in meta["data_diff"].value
    from lance_assets.forensics.diff import diff
    from lance_assets.table.read_record import rows_read

    name = unnamed(Table.of(garbage_root))
    arms = diff(Table.of(garbage_root), f"{name}/keeps_garbage", f"{name}/drops_garbage")
    assert arms.documents["added"] == arms.documents["removed"] == 0  # one pinned version
    (quality,) = arms.rules
    ds = lance.dataset(paths.table_uri(garbage_root), version=meta["lance/table_version"].value)
    assert (quality.rule, quality.status) == ("quality", "added")
    assert quality.out_docs == ds.count_rows(filter="NOT (score >= 3)") > 0
    assert arms.read["a"] == len(rows_read(first)) and arms.read["b"] == len(rows_read(second))


def test_the_trainer_evaluates_on_the_eval_filter_whatever_its_training_filter(garbage_root):
    """--eval-filter: validation is those documents alone, training keeps --filter AND NOT them
    (a NULL in the eval filter's columns keeps a row out of both)."""
    from lance_assets.train import data

    ds = dataset(garbage_root)
    p = plan(garbage_root, ARMS)
    columns = ds.schema.names

    def ids(filter: str) -> set[int]:
        return {r["id"] for r in ds.to_table(columns=["id"], filter=filter).to_pylist()}

    held = ids(p.held_out)
    vals = set()
    for user in ("", "score >= 3", "score < 3"):
        split = data.splits(user, 20, columns, p.held_out)
        vals.add(frozenset(ids(split.val.lance)))
        trained = ids(split.train.lance)
        assert trained and not trained & held
        if user:
            assert trained <= ids(user)
    assert vals == {frozenset(held)}  # the same held-out documents for every training filter
    with pytest.raises(Exception, match="--eval-filter"):
        data.splits("", 20, columns, "score >= 3; DROP TABLE corpus")


def test_the_asset_refuses_a_hostile_rule_set_before_tagging_or_training(garbage_root):
    from lance_assets.defs.training.ablation import materialize_in_process

    config = {**CONFIG, "name": "hostile",
              "rule_sets": {"fine": {}, "evil": {"x": "1 = 1) OR (1 = 1"}}}
    res = materialize_in_process(garbage_root, config, raise_on_error=False)
    assert not res.success
    failure = next(e for e in res.all_events if e.is_step_failure)
    message = failure.step_failure_data.error.message
    assert "arm 'evil'" in message and "rule_sets" in message
    assert "ablation-hostile" not in dataset(garbage_root).tags.list()
    assert not paths.ablation_dir(garbage_root, "hostile").exists()
