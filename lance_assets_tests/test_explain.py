"""Every document's story (``python -m lance_assets explain``, the ``document_stories`` asset):
the rule that removed it, the runs and ablation arms that trained on it judged at their tagged
versions, its duplicate clusters, the samples attributed to it; stored records are data."""

import json

import dagster as dg
import lance
import pyarrow as pa
import pytest

from lance_assets import paths
from lance_assets.__main__ import main as cli
from lance_assets.curation import dedup_flag, near_dup, rules
from lance_assets.curation.dedup_flag import normalise
from lance_assets.forensics.explain import explain
from lance_assets.ingest.raw_text import ingest
from lance_assets.table import Table
from lance_assets.table import snapshots as snaps
from lance_assets.table.producer import produce
from lance_assets_tests.helpers import build_table, quiet

RULES = {k: rules.DEFAULT_RULES[k] for k in
         ("exact_dup", "near_dup", "gopher_word_count", "gopher_stop_words", "fineweb_line_punct",
          "gopher_top_ngrams")}


def run_record(root, name, tag, version, filter_sql):
    run = paths.run_dir(root, name)
    run.mkdir(parents=True, exist_ok=True)
    (run / "summary.json").write_text(json.dumps({
        "checkpoint": str(run / "ckpt_0000010.pt"), "table_version": version,
        "table_tag": tag, "filter": filter_sql}))


def read_record(run, version, ids, summary: dict | None = None):
    """What a finished run's trainer leaves: ``read.json`` over a stored permutation of the rows
    it read, and (``summary``) its ``summary.json``."""
    run.mkdir(parents=True, exist_ok=True)
    rows = str(run / "permutations" / "epoch-0.lance")
    lance.write_dataset(pa.table({"row_id": pa.array(sorted(ids), pa.uint64())}), rows)
    (run / "read.json").write_text(json.dumps({"format": 1, "table_version": version, "step": 10,
                                               "epochs": [{"epoch": 0, "rows": rows,
                                                           "split_sizes": [len(ids)],
                                                           "positions": None}]}))
    if summary is not None:
        (run / "summary.json").write_text(json.dumps(summary))


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    """A curated synthetic corpus; a training run tagged at it (what ``pretrained_model``
    records), an ablation of two arms, a forensics report attributing a sample; then the rules
    change and new rows arrive, so today's table is not what the run read."""
    root = build_table(tmp_path_factory.mktemp("explain") / "data", "synthetic:300",
                       rows_per_fragment=100, upto=["dedup_flag", "quality_signals", "near_dup"])
    rules.put_in_force(Table.of(root), RULES, keep_languages=[], drop_contaminated=False)
    table = Table.of(root)
    version = table.newest().version
    train_filter = rules.training_filter(Table.of(root))
    table.snapshots.hold("train-r1", version, owner="pretrained_model", kind=snaps.RUN)
    run_record(root, "r1", "train-r1", version, train_filter)
    table.snapshots.hold("ablation-a1", version, owner="curation_ablation", kind=snaps.ABLATION)
    folder = paths.ablation_dir(root, "a1")
    folder.mkdir(parents=True)
    (folder / "plan.json").write_text(json.dumps({
        "tag": "ablation-a1", "version": version, "held_out": "(id % 10) = 0",
        "arms": [{"name": "rules", "train_filter": f"({train_filter}) AND (id % 10) <> 0"},
                 {"name": "no_rules", "train_filter": "(id % 10) <> 0"}]}))
    ds = table.newest()
    kept = sorted(ds.to_table(columns=["id"], filter=train_filter).column("id").to_pylist())
    trained = next(i for i in kept if i % 10)
    # what each run and arm read: a part of what its filter kept (their read records)
    reads = {"r1": set(kept[:len(kept) // 2]),
             "rules": {i for i in kept if i % 10 and i % 3 != 2},
             "no_rules": {i for i in range(0, 120) if i % 10}}
    read_record(paths.run_dir(root, "r1"), version, reads["r1"])
    for arm, seeds in (("rules", 2), ("no_rules", 1)):
        ids = sorted(reads[arm])
        for seed in range(seeds):
            read_record(folder / f"{arm}-0123abcd" / f"seed-{seed}", version, ids[seed::seeds],
                        {"table_version": version, "steps": 10})
    report = {"attributions": [{"prompt": "The lighthouse", "text": "...", "attribution": {
        "verdict": "near-verbatim", "table_version": version,
        "sources": [{"rank": 1, "id": trained, "coverage": 0.9, "cosine": 0.97,
                     "longest_span_words": 40, "span": "a quoted span"}]}}]}
    paths.reports_dir(root).mkdir(parents=True, exist_ok=True)
    (paths.reports_dir(root) / "forensics.json").write_text(json.dumps(report))
    # today: a rule the run did not have, and rows it never saw
    rules.put_in_force(Table.of(root), {**RULES, "long_only": "word_count >= 100000"}, keep_languages=[],
                       drop_contaminated=False)
    ingest(Table.of(root), "synthetic:20", log=quiet)
    return {"root": root, "version": version, "filter": train_filter, "trained": trained,
            "reads": reads}


def rule_verdicts_by_lance(ds, doc_id, rule_set):
    """The rules that do not keep ``doc_id``, one Lance count per rule."""
    preds, problems = rules.rule_predicates(ds, rule_set)
    assert not problems
    return [name for name, p in preds.items()
            if ds.count_rows(filter=f"id = {doc_id} AND ({p.lance})") == 0]


def test_a_removed_document_names_the_rules_that_removed_it(corpus):
    root = corpus["root"]
    ds = lance.dataset(paths.table_uri(root), version=corpus["version"])
    removed = sorted(ds.to_table(columns=["id"], filter=f"NOT ({corpus['filter']})")
                     .column("id").to_pylist())
    assert len(removed) > 20
    for doc_id in removed[:: max(1, len(removed) // 12)]:
        story = explain(Table.of(root), doc_id, ref="train-r1")
        assert story.present and story.version == corpus["version"] and not story.kept_by_rules
        assert story.removed_by == rule_verdicts_by_lance(ds, doc_id, RULES) != []
        assert not [s for s in story.trained_by if s.kind == "run"]
        verdicts = {r.rule: r.verdict for r in story.rules}
        assert all(verdicts[r].startswith("removes") for r in story.removed_by)


def test_a_trained_document_names_the_run_and_its_tag_at_the_tagged_version(corpus):
    root, doc_id = corpus["root"], corpus["trained"]
    story = explain(Table.of(root), doc_id)  # today's rules: `long_only` removes it
    assert story.version > corpus["version"] and "long_only" in story.removed_by
    runs = {s.name: s for s in story.snapshots}
    assert runs["r1"].trained_on and runs["r1"].tag == "train-r1"
    assert runs["r1"].version == corpus["version"]  # judged at the run's version, not today
    assert runs["a1/rules"].trained_on and runs["a1/no_rules"].trained_on
    assert "r1 (tag train-r1)" in story.headline()
    assert story.samples and story.samples[0]["prompt"] == "The lighthouse"
    table = Table.of(root)
    held = explain(table, next(i for i in range(0, 300, 10)
                               if explain(table, i).present))  # id % 10 == 0: held out
    arms = {s.name: s for s in held.snapshots}
    assert not arms["a1/no_rules"].trained_on and "held-out" in arms["a1/no_rules"].note


def test_rows_after_the_tag_were_not_trained_on(corpus):
    root = corpus["root"]
    newest = Table.of(root).newest()
    new_id = max(newest.to_table(columns=["id"]).column("id").to_pylist())
    story = explain(Table.of(root), new_id)
    assert story.present
    for s in story.snapshots:
        assert s.present is False and s.trained_on is False and "not in that version" in s.note


def test_exact_and_near_clusters_name_the_kept_member(corpus):
    root = corpus["root"]
    ds = lance.dataset(paths.table_uri(root), version=corpus["version"])
    dup = ds.to_table(columns=["id", "text"], filter="is_dup").to_pylist()[0]
    everything = ds.to_table(columns=["id", "text"]).to_pylist()
    same = sorted(r["id"] for r in everything if normalise(r["text"]) == normalise(dup["text"]))
    story = explain(Table.of(root), dup["id"], ref=corpus["version"])
    exact = next(c for c in story.duplicates if c.kind == "exact")
    assert exact.members == same[:20] and exact.size == len(same) and exact.kept == same[0]
    assert not exact.this_kept and "exact_dup" in story.removed_by
    near = next(c for c in story.duplicates if c.kind == "near")
    assert near.kept == min(near.members) and set(same) <= set(near.members) | {dup["id"]}


def test_a_tampered_run_record_is_reported_not_run(corpus, tmp_path):
    root = corpus["root"]
    rows, version = Table.of(root).newest().count_rows(), Table.of(root).newest().version
    run_record(root, "evil", "train-r1", corpus["version"],
               "true; DROP TABLE corpus; --")
    try:
        story = explain(Table.of(root), corpus["trained"])
        evil = next(s for s in story.snapshots if s.name == "evil")
        assert evil.trained_on is None and "filter not readable" in evil.note
    finally:
        (paths.run_dir(root, "evil") / "summary.json").unlink()
        paths.run_dir(root, "evil").rmdir()
    assert Table.of(root).newest().count_rows() == rows  # nothing ran, nothing was written
    assert Table.of(root).newest().version == version


def test_cli_explain(corpus, capsys):
    root = corpus["root"]
    ds = lance.dataset(paths.table_uri(root), version=corpus["version"])
    removed = ds.to_table(columns=["id"], filter="NOT (word_count BETWEEN 50 AND 100000)"
                          ).column("id").to_pylist()[0]
    assert cli(["explain", "--id", str(removed), "--version", "train-r1", "--json",
                "--data", str(root)]) == 0
    out = json.loads(capsys.readouterr().out)
    assert "gopher_word_count" in out["removed_by"] and out["tag"] == "train-r1"
    assert cli(["explain", "--id", str(corpus["trained"]), "--data", str(root)]) == 0
    text = capsys.readouterr().out
    assert "r1 (tag train-r1)" in text and "The lighthouse" in text
    assert cli(["explain", "--id", "999999", "--data", str(root)]) == 1
    assert "no row with id 999999" in capsys.readouterr().out
    assert cli(["explain", "--id", "1", "--version", "no-such-tag", "--data", str(root)]) == 2
    err = capsys.readouterr().err
    assert "no-such-tag" in err and "train-r1" in err  # names the tags there are
    assert cli(["explain", "--id", "1", "--version", "999999", "--data", str(root)]) == 2
    err = capsys.readouterr().err
    assert "999999" in err and "does not exist" in err and "Give a version that exists" in err
    assert cli(["explain", "--id", str(2**63), "--data", str(root)]) == 2  # not an id at all
    err = capsys.readouterr().err
    assert str(2**63) in err and "64-bit" in err and "Traceback" not in err


def test_exact_copies_come_from_text_hash_before_near_dup_is_written(tmp_path):
    """A copy ingested after `near_dup` ran is in its original's exact cluster as soon as
    `dedup_flag` hashed it, though the original's near-duplicate cluster does not hold it yet
    (and a copy not hashed yet is hashed on the spot)."""
    import random

    from lance_assets.forensics.explain import explain
    from lance_assets.ingest.raw_text import ingest
    from lance_assets_tests.helpers import quiet, write_fineweb_parquet

    rng = random.Random(0)
    words = ["".join(rng.choice("abcdefghij") for _ in range(6)) for _ in range(300)]
    texts = [" ".join(rng.choice(words) for _ in range(120)) for _ in range(30)]
    root, src = tmp_path / "data", tmp_path / "src"
    src.mkdir()
    write_fineweb_parquet(src / "a.parquet", texts + [texts[4]])
    ingest(Table.of(root), str(src), log=quiet)
    produce(dedup_flag.PRODUCER, Table.of(root), log=quiet)
    produce(near_dup.PRODUCER, Table.of(root), log=quiet)
    write_fineweb_parquet(src / "b.parquet", [texts[4]], start_id=100)
    ingest(Table.of(root), str(src), log=quiet)
    produce(dedup_flag.PRODUCER, Table.of(root), log=quiet)  # hashed and flagged; near_dup not run again
    write_fineweb_parquet(src / "c.parquet", ["  ".join(texts[4].split())], start_id=200)
    ingest(Table.of(root), str(src), log=quiet)  # a third copy, not hashed yet
    story = explain(Table.of(root), 4)
    (exact,) = [c for c in story.duplicates if c.kind == "exact"]
    assert (exact.size, exact.members, exact.kept, exact.this_kept) == (4, [4, 30, 31, 32], 4, True)
    (near,) = [c for c in story.duplicates if c.kind == "near"]
    assert near.members == [4, 30]  # what the near-duplicate columns hold so far


def test_document_stories_asset_shows_each_story(corpus):
    from lance_assets.definitions import defs
    from lance_assets.defs.resources import LanceStore

    root = corpus["root"]
    ds = lance.dataset(paths.table_uri(root), version=corpus["version"])
    removed = ds.to_table(columns=["id"], filter="NOT (word_count BETWEEN 50 AND 100000)"
                          ).column("id").to_pylist()[0]
    result = dg.materialize(
        [defs.get_assets_def("document_stories")],
        resources={"lance_store": LanceStore(data_dir=str(root))},
        run_config={"ops": {"document_stories": {"config": {
            "ids": [removed, corpus["trained"]], "version": "train-r1"}}}})
    assert result.success
    meta = {k: v.value for k, v in
            result.asset_materializations_for_node("document_stories")[0].metadata.items()}
    assert "gopher_word_count" in meta[f"document_{removed}"]
    trained = meta[f"document_{corpus['trained']}"]
    assert "train-r1" in trained and "The lighthouse" in trained
    assert (paths.reports_dir(root) / "stories" / f"{removed}.json").is_file()
    # no ids: the samples' top sources and the first document the rules remove
    result = dg.materialize([defs.get_assets_def("document_stories")],
                            resources={"lance_store": LanceStore(data_dir=str(root))})
    ids = result.asset_materializations_for_node("document_stories")[0].metadata["ids"].value
    assert ids[0] == corpus["trained"] and len(ids) == 2


def test_a_semantic_copy_names_its_cluster_and_the_original_kept(tmp_path):
    from lance_assets.curation import semantic_dup as sd
    from lance_assets.embeddings import chunk_embeddings
    from lance_assets.table.producer import produce
    from lance_assets.testing.semantic_planted import SynonymBagEmbedder, planted_set

    planted = planted_set(6, 1, 12, seed=3, drop=0.1, synonyms=0.4, shuffle=0.5)
    root = tmp_path / "data"
    src = tmp_path / "a.jsonl"
    src.write_text("".join(json.dumps({"text": t}) + "\n" for t in planted.texts))
    ingest(Table.of(root), str(src), rows_per_fragment=10, log=quiet)
    produce(chunk_embeddings.PRODUCER, Table.of(root),
            chunk_embeddings.ChunkEmbeddingsSettings(chunk_tokens=64, overlap_tokens=8,
                                                     embedder=SynonymBagEmbedder()),
            log=quiet)
    produce(sd.PRODUCER, Table.of(root), sd.SemanticDupSettings(threshold=0.75, languages=[]), log=quiet)
    rules.put_in_force(Table.of(root), {"semantic_dup": "NOT semantic_dup"}, keep_languages=[],
                       drop_contaminated=False)
    copy, original = next(iter(planted.copy_of.items()))  # ids are positions here
    story = explain(Table.of(root), copy)
    semantic = next(c for c in story.duplicates if c.kind == "semantic")
    assert semantic.kept == original and not semantic.this_kept
    assert {copy, original} <= set(semantic.members)
    assert story.removed_by == ["semantic_dup"]
    kept = explain(Table.of(root), original)
    assert kept.kept_by_rules and next(c for c in kept.duplicates
                                       if c.kind == "semantic").this_kept


def test_explain_document_stories_and_forget_agree_on_what_each_run_and_arm_read(corpus):
    """A run and two ablation arms that read only part of what their filters kept (their read
    records): `explain`, the `document_stories` asset and `forget` name the same readers for
    every document, and none claims a document no run or seed read."""
    from lance_assets.definitions import defs
    from lance_assets.defs.resources import LanceStore
    from lance_assets.table.forget import forget

    root, reads = corpus["root"], corpus["reads"]
    table = Table.of(root)
    ds = lance.dataset(paths.table_uri(root), version=corpus["version"])
    kept = set(ds.to_table(columns=["id"], filter=corpus["filter"]).column("id").to_pylist())
    arms = reads["rules"] | reads["no_rules"]
    sample = sorted({*sorted(reads["r1"])[:3], *sorted(kept - reads["r1"])[:3],
                     *sorted(kept - arms)[:3], *sorted(arms - reads["r1"])[:3], 0, 10})
    assert kept - reads["r1"] - arms  # documents a filter kept that nothing read
    stories = {i: explain(table, i) for i in sample}
    for i, story in stories.items():
        readers = {s.name for s in story.trained_by}
        expected = {"r1"} if i in reads["r1"] else set()
        expected |= {f"a1/{arm}" for arm in ("rules", "no_rules") if i in reads[arm]}
        assert readers == expected, (i, readers, expected)
    report = forget(table, f"id IN ({', '.join(map(str, sample))})", dry_run=True, log=quiet)
    held = {h.name: h for h in report.holders}
    assert held["r1"].read_record and held["a1"].read_record
    assert held["r1"].trained_on == sum(i in reads["r1"] for i in sample)
    assert held["a1"].trained_on == sum(i in arms for i in sample)
    result = dg.materialize(
        [defs.get_assets_def("document_stories")],
        resources={"lance_store": LanceStore(data_dir=str(root))},
        run_config={"ops": {"document_stories": {"config": {"ids": sample}}}})
    meta = result.asset_materializations_for_node("document_stories")[0].metadata
    table_md = meta["documents"].value
    for i, story in stories.items():
        row = next(line for line in table_md.splitlines() if line.startswith(f"| {i} |"))
        assert row.split("|")[4].strip() == ", ".join(s.name for s in story.trained_by), row
        shown = meta[f"document_{i}"].value  # the instance keeps no url, signal or span
        assert "### Signals" not in shown and "https://" not in shown, shown
