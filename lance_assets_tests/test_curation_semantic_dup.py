"""Semantic duplicates: reworded copies (which MinHash misses) flagged against their original,
distractors on the same topics kept, new rows compared against old ones without rewriting old
values, rows in other languages left out, and the flag usable in a curation rule. The sentence
model is stood in for by a bag of words with synonyms folded (the real model's figures are in
docs/benchmarks.md)."""

import dataclasses
import json

import lance
import numpy as np
import pyarrow as pa
import pytest

from lance_assets import keys, paths
from lance_assets.curation import minhash, rules
from lance_assets.curation import semantic_clusters as sc
from lance_assets.curation import semantic_compare as cmp
from lance_assets.curation import semantic_dup as sd
from lance_assets.curation import semantic_store as ss
from lance_assets.curation.detected_language import LANG, LANG_SCORE
from lance_assets.embeddings import chunk_embeddings
from lance_assets.embeddings import int8_vectors as iv
from lance_assets.embeddings import vector_files as vf
from lance_assets.ingest.raw_text import ingest
from lance_assets.table import Table, data_files_by_field, get_json_config
from lance_assets.table.columns import write_columns
from lance_assets.table.producer import produce
from lance_assets.testing.semantic_planted import SynonymBagEmbedder, planted_set
from lance_assets_tests.helpers import quiet

# Bag-of-words vectors of this set: copies >= 0.8 with their original, other pairs <= 0.55
THRESHOLD = 0.75
REWORD = {"drop": 0.1, "synonyms": 0.4, "shuffle": 0.5}
ALL = sd.SemanticDupSettings(threshold=THRESHOLD, languages=[])
DEFAULTS_ALL = sd.SemanticDupSettings(languages=[])  # the defaults, on every row


def add_rows(root, path, texts):
    path.write_text("".join(json.dumps({"text": t}) + "\n" for t in texts))
    ingest(Table.of(root), str(path), rows_per_fragment=10, log=quiet)
    produce(chunk_embeddings.PRODUCER, Table.of(root),
            chunk_embeddings.ChunkEmbeddingsSettings(chunk_tokens=64, overlap_tokens=8,
                                                     embedder=SynonymBagEmbedder()),
            log=quiet)


def rows(root, cols=sd.COLUMNS[:4]):
    return lance.dataset(paths.table_uri(root)).to_table(
        columns=["id", *cols]).sort_by("id").to_pylist()


def test_planted_copies_are_flagged_against_their_original_and_distractors_kept(tmp_path):
    planted = planted_set(12, 1, 12, seed=3, **REWORD)
    doc, sh = minhash.shingles(pa.array(planted.texts), 5)
    sets = minhash.per_doc_sets(doc, sh, len(planted.texts))
    # the copies are not near-duplicates: MinHash LSH (Jaccard >= 0.8) cannot confirm them
    assert max(minhash.jaccard(sets[c], sets[o]) for c, o in planted.copy_of.items()) < 0.6
    root = tmp_path / "data"
    add_rows(root, tmp_path / "a.jsonl", planted.texts)
    got = produce(sd.PRODUCER, Table.of(root), ALL, log=quiet)
    summary = sd.PRODUCER.summary(Table.of(root), got)
    assert got.rows_written == len(planted.texts)
    assert summary["new_rows_flagged"] == len(planted.copy_of)
    assert summary["not_computed"] == 0 and summary["clusters_trained_now"]
    assert summary["semantic_dup_rate"] == round(len(planted.copy_of) / len(planted.texts), 4)
    for r in rows(root, sd.COLUMNS):  # ids are positions in the planted list here
        if r["id"] in planted.copy_of:
            assert r["semantic_dup"] and r["semantic_rep"] == planted.copy_of[r["id"]], r
            assert THRESHOLD <= r["semantic_cos"] < 1.0
        else:
            assert not r["semantic_dup"] and r["semantic_rep"] == r["id"], r
            assert r["semantic_cos"] < THRESHOLD  # the nearest earlier document, not a copy
        assert r["semantic_cluster"] is not None and len(r["semantic_vector"]) == 384
        assert max(abs(v) for v in r["semantic_vector"]) == 127

    # usable in rules (opt-in): `NOT semantic_dup` removes exactly the copies
    ds = lance.dataset(paths.table_uri(root))
    evaluation = rules.evaluate(ds, {"semantic_dup": "NOT semantic_dup"})
    assert evaluation.ok and evaluation.hits[0].removed == len(planted.copy_of)
    assert rules.validate(ds, {"semantic_dup": "NOT semantic_dup"})
    assert "semantic_dup" not in rules.DEFAULT_RULES

    # a rerun is a no-op; other settings on the written columns are refused
    again = produce(sd.PRODUCER, Table.of(root), ALL, log=quiet)
    stats = again.stats
    assert again.nothing_to_do and stats.documents == 0
    with pytest.raises(sd.SettingsMismatchError, match="drop the columns"):
        produce(sd.PRODUCER, Table.of(root), sd.SemanticDupSettings(threshold=0.9, languages=[]), log=quiet)


def test_new_rows_are_compared_against_old_ones_without_rewriting(tmp_path, monkeypatch):
    planted = planted_set(18, 1, 12, seed=5, **REWORD)
    copies = set(planted.copy_of)
    first = [t for i, t in enumerate(planted.texts) if i not in copies]
    position = {i: n for n, i in enumerate(i for i in range(len(planted.texts)) if i not in copies)}
    second_src = sorted(copies)
    settings = sd.SemanticDupSettings(threshold=THRESHOLD, rows_per_cluster=10, seed=1,
                                      languages=[])
    root = tmp_path / "data"
    uri = paths.table_uri(root)
    add_rows(root, tmp_path / "a.jsonl", first)
    produce(sd.PRODUCER, Table.of(root), settings, fragments_per_commit=1, log=quiet)
    before = lance.dataset(uri)
    old_rows, old_files = rows(root, sd.COLUMNS), data_files_by_field(before, "semantic_dup")
    stored = get_json_config(before, keys.SEMANTIC_DUP_KEY)
    state = ss.side_store(Table.of(root)).load_state()
    assert state["clusters"] == 3 and state["rows"] == len(first)
    assert not any(r["semantic_dup"] for r in old_rows)
    assert len({r["semantic_cluster"] for r in old_rows}) == 3

    add_rows(root, tmp_path / "b.jsonl", [planted.texts[i] for i in second_src])
    with monkeypatch.context() as m:  # the store was left whole: no run reads the table's ids
        m.setattr(ss, "written_ids", lambda ds: pytest.fail("the written ids were read"))
        report = produce(sd.PRODUCER, Table.of(root), settings, log=quiet)
        stats = report.stats
    assert report.rows_written == len(second_src) and stats.earlier_rows == len(first)
    assert not stats.trained and stats.side_rows_read <= len(first)
    after = lance.dataset(uri)
    new_rows = rows(root, sd.COLUMNS)
    assert new_rows[:len(first)] == old_rows  # old values unchanged ...
    assert {k: v for k, v in data_files_by_field(after, "semantic_dup").items()
            if k in old_files} == old_files  # ... and their files untouched
    assert get_json_config(after, keys.SEMANTIC_DUP_KEY) == stored
    for r, src in zip(new_rows[len(first):], second_src):
        original = old_rows[position[planted.copy_of[src]]]
        assert r["semantic_dup"] and r["semantic_rep"] == original["id"], r
    assert stats.flagged_against_earlier_runs == len(second_src)
    assert ss.side_store(Table.of(root)).load_state()["rows"] == len(planted.texts)
    assert produce(sd.PRODUCER, Table.of(root), settings, log=quiet).nothing_to_do


def test_rows_without_chunk_embeddings_are_refused_with_the_fix(tmp_path):
    root = tmp_path / "data"
    (tmp_path / "a.jsonl").write_text(json.dumps({"text": "one short document"}) + "\n")
    ingest(Table.of(root), str(tmp_path / "a.jsonl"), log=quiet)
    with pytest.raises(sd.MissingChunkEmbeddingsError, match="materialize `chunk_embeddings`"):
        produce(sd.PRODUCER, Table.of(root), DEFAULTS_ALL, log=quiet)
    produce(chunk_embeddings.PRODUCER, Table.of(root),
            chunk_embeddings.ChunkEmbeddingsSettings(chunk_tokens=64, overlap_tokens=8,
                                                     embedder=SynonymBagEmbedder()),
            log=quiet)
    with pytest.raises(sd.MissingLanguageError, match="materialize `detected_language`"):
        produce(sd.PRODUCER, Table.of(root), log=quiet)  # the default compares English rows only
    (tmp_path / "b.jsonl").write_text(json.dumps({"text": "another short document"}) + "\n")
    ingest(Table.of(root), str(tmp_path / "b.jsonl"), log=quiet)  # no chunk_embeddings for it yet
    # an ingest that landed after `chunk_embeddings` ran: its rows wait, the rest is written
    report = produce(sd.PRODUCER, Table.of(root), DEFAULTS_ALL, log=quiet)
    stats = report.stats
    assert report.rows_written == 1 and report.fragments_pending == 1 and stats.documents == 1
    assert rows(root)[1]["semantic_cluster"] is None
    produce(chunk_embeddings.PRODUCER, Table.of(root),
            chunk_embeddings.ChunkEmbeddingsSettings(chunk_tokens=64, overlap_tokens=8,
                                                     embedder=SynonymBagEmbedder()),
            log=quiet)
    report = produce(sd.PRODUCER, Table.of(root), DEFAULTS_ALL, log=quiet)
    stats = report.stats
    assert report.rows_written == 1 and stats.earlier_rows == 1
    assert [r["semantic_rep"] for r in rows(root)] == [0, 1]


def test_blocked_comparison_equals_brute_force(monkeypatch):
    monkeypatch.setattr(cmp, "NEW_BLOCK", 7)
    monkeypatch.setattr(cmp, "OLD_BLOCK", 5)
    rng = np.random.default_rng(0)
    base = rng.standard_normal((40, 384)).astype(np.float32)
    vecs = np.concatenate([base, base[rng.integers(0, 40, 40)]
                           + 0.15 * rng.standard_normal((40, 384)).astype(np.float32)])
    vecs /= np.linalg.norm(vecs, axis=1, keepdims=True)
    ids = np.sort(rng.choice(1000, 80, replace=False)).astype(np.int64)
    cluster = rng.integers(0, 2, 80)
    dup, rep, cos = cmp.compare_batch(ids, vecs, cluster, 0.9)
    q = iv.quantize(vecs).astype(np.float64)
    unit = q / np.linalg.norm(q, axis=1, keepdims=True)
    rep_of = {}
    for i in range(80):  # brute force, in id order
        earlier = [j for j in range(i) if cluster[j] == cluster[i]]
        sims = [float(unit[i] @ unit[j]) for j in earlier]
        best = max(sims) if sims else 0.0
        is_dup = best >= 0.9
        rep_of[i] = rep_of[earlier[int(np.argmax(sims))]] if is_dup else i
        assert dup[i] == is_dup and rep[i] == ids[rep_of[i]] and abs(cos[i] - best) < 1e-5
    assert dup.sum() > 5


def test_the_integer_product_is_exact_and_equals_the_float_one_to_the_bit(monkeypatch):
    """The store's cosines come from an int8 product (ONNX Runtime's MatMulInteger) where it is
    exact, else from float32 BLAS: on extreme vectors (where a kernel summing pairs into 16 bits
    saturates) and random ones, both give the exact dot products, so the same float32 bits."""
    rng = np.random.default_rng(5)
    x = np.concatenate([np.full((3, 384), 127, np.int8), np.full((3, 384), -127, np.int8),
                        rng.integers(-127, 128, (40, 384)).astype(np.int8)])
    x[1, 1::2] = -127
    y = np.concatenate([x[::-1], rng.integers(-127, 128, (30, 384)).astype(np.int8)])
    xi, yi = iv.inv_norms(x), iv.inv_norms(y)
    exact = (x.astype(np.int64) @ y.T.astype(np.int64)).astype(np.float32)
    expected = exact * xi[:, None]
    expected *= yi[None, :]
    got = iv.cosines(x, xi, y.T, yi)
    assert iv.kernel() == "int8 MatMulInteger"  # the fast path on the test machines
    assert got.dtype == np.float32 and np.array_equal(got, expected)
    assert np.isclose(got[0, 0 + len(x) - 1], 1.0)  # two equal vectors: cosine 1 (x[0] = y[-1])
    monkeypatch.setattr(iv, "_integer_product", lambda: None)
    assert iv.kernel() == "float32 BLAS"
    assert np.array_equal(iv.cosines(x, xi, y.T, yi), expected)


def test_rows_without_chunks_get_nulls_and_are_counted(tmp_path):
    from lance_assets.embeddings.chunk_embeddings import CHUNK_EMBEDDINGS, to_arrow

    planted = planted_set(4, 1, 2, seed=7, **REWORD)
    root = tmp_path / "data"
    (tmp_path / "a.jsonl").write_text("".join(json.dumps({"text": t}) + "\n"
                                              for t in planted.texts))
    ingest(Table.of(root), str(tmp_path / "a.jsonl"), log=quiet)
    no_chunks = {0: None, 1: []}  # a null list and an empty one

    def one_chunk_each(frag):
        t = frag.to_table(columns=["id", "text"])
        ids, texts = t.column("id").to_pylist(), t.column("text").to_pylist()
        vecs = SynonymBagEmbedder().encode(texts)
        counts = np.array([0 if i in no_chunks else 1 for i in ids])
        col = to_arrow(vecs[counts == 1], counts)
        col = pa.ListArray.from_arrays(col.offsets, col.values,
                                       mask=pa.array([no_chunks.get(i, 0) is None for i in ids]))
        return [pa.RecordBatch.from_arrays([col], schema=pa.schema([CHUNK_EMBEDDINGS]))]

    write_columns(Table.of(root), [CHUNK_EMBEDDINGS], one_chunk_each, log=quiet)
    got = produce(sd.PRODUCER, Table.of(root), ALL, log=quiet)
    summary = sd.PRODUCER.summary(Table.of(root), got)
    assert summary["not_computed"] == 2 and got.rows_written == len(planted.texts)
    for r in rows(root, sd.COLUMNS):
        if r["id"] in no_chunks:
            assert all(r[c] is None for c in sd.COLUMNS), r
        else:
            assert r["semantic_cluster"] is not None and r["semantic_rep"] is not None


def _languages(root, lang_of):
    def compute(frag):
        ids = frag.to_table(columns=["id"]).column("id").to_pylist()
        return [pa.RecordBatch.from_arrays([pa.array([lang_of(i) for i in ids]),
                                            pa.array(np.ones(len(ids), np.float32))],
                                           schema=pa.schema([LANG, LANG_SCORE]))]
    write_columns(Table.of(root), [LANG, LANG_SCORE], compute, log=quiet)


def test_rows_outside_the_languages_are_left_out_counted_and_never_flagged(tmp_path):
    planted = planted_set(8, 1, 4, seed=11, **REWORD)
    root = tmp_path / "data"
    add_rows(root, tmp_path / "a.jsonl", planted.texts)
    # one pair (a copy and its original) says it is French, another copy alone is Chinese
    pairs = sorted(planted.copy_of.items())
    (fr_copy, fr_orig), (zh_copy, _) = pairs[0], pairs[1]
    other = {fr_copy: "fr", fr_orig: "fr", zh_copy: "zh"}
    _languages(root, lambda i: other.get(i, "en"))
    # (a copy of this set sits at 0.74 from its original: 0.7, still far above other pairs)
    got = produce(sd.PRODUCER, Table.of(root), sd.SemanticDupSettings(threshold=0.7), log=quiet)
    summary = sd.PRODUCER.summary(Table.of(root), got)
    assert summary["other_languages"] == 3
    assert summary["new_rows_flagged"] == len(planted.copy_of) - 2
    for r in rows(root, sd.COLUMNS):
        if r["id"] in other:  # not compared: never flagged, nothing else written
            assert r["semantic_dup"] is False, r
            assert all(r[c] is None for c in sd.COLUMNS if c != "semantic_dup"), r
        else:
            assert r["semantic_dup"] == (r["id"] in planted.copy_of), r
    ds = lance.dataset(paths.table_uri(root))  # the rule keeps them
    assert ds.count_rows(filter="NOT semantic_dup") == len(planted.texts) - (len(planted.copy_of) - 2)


def _topic_set(per_topic=8):
    """Originals on six topics (a list per topic) and a reworded copy of each."""
    import random

    from lance_assets.testing.semantic_planted import TOPICS, original, reworded

    rng = random.Random(2)
    topics = sorted(TOPICS)
    docs = {t: [original(rng, t, s) for s in rng.sample(TOPICS[t]["x"], per_topic)]
            for t in topics}
    copies = {t: [reworded(d, rng, **REWORD) for d in docs[t]] for t in topics}
    return topics, docs, copies


def _recall(root, originals_at, copies_at):
    got = {r["id"]: r for r in rows(root)}
    return np.mean([got[c]["semantic_dup"] and got[c]["semantic_rep"] == o
                    for c, o in zip(copies_at, originals_at)])


def test_incremental_recall_follows_one_batch_run_when_increments_bring_new_topics(tmp_path):
    """The first run sees one topic; increments bring the five others and reworded copies of
    every topic. The clusters are trained again as the table drifts and grows, and a copy is
    compared with its original's cluster from three probes: the copies found incrementally are
    within 5% of those one batch run over the same rows finds."""
    topics, docs, copies = _topic_set()
    settings = sd.SemanticDupSettings(threshold=THRESHOLD, rows_per_cluster=6, languages=[])
    steps = [docs[topics[0]],
             [d for t in topics[1:3] for d in docs[t]] + copies[topics[0]],
             [d for t in topics[3:] for d in docs[t]] + [c for t in topics[1:] for c in copies[t]]]
    order = [x for step in steps for x in step]  # ids are positions in this list
    originals_at = [order.index(d) for t in topics for d in docs[t]]
    copies_at = [order.index(c) for t in topics for c in copies[t]]

    batch = tmp_path / "batch"
    for n, step in enumerate(steps):
        add_rows(batch, tmp_path / f"b{n}.jsonl", step)
    report = produce(sd.PRODUCER, Table.of(batch), settings, log=quiet)
    stats = report.stats
    assert stats.clusters == sc.auto_clusters(len(order), 6)
    batch_recall = _recall(batch, originals_at, copies_at)

    inc = tmp_path / "inc"
    reasons, clusters = [], []
    for n, step in enumerate(steps):
        add_rows(inc, tmp_path / f"i{n}.jsonl", step)
        report = produce(sd.PRODUCER, Table.of(inc), settings, log=quiet)
        stats = report.stats
        reasons.append(stats.retrained)
        clusters.append(stats.clusters)
    inc_recall = _recall(inc, originals_at, copies_at)
    assert reasons[0] == "first run" and any(r.startswith(("drifted", "grown"))
                                             for r in reasons[1:]), reasons
    assert clusters[0] < clusters[-1]  # the number of clusters follows the rows
    assert batch_recall >= 0.9
    assert inc_recall >= batch_recall - 0.05, (inc_recall, batch_recall, reasons, clusters)
    # retraining never rewrites a value: the first run's rows kept theirs
    first = rows(inc)[:len(steps[0])]
    assert all(r["semantic_cluster"] < clusters[0] for r in first)


def test_the_side_store_is_made_again_after_forget_and_a_rerun_equals_one_with_it(tmp_path):
    from lance_assets.table.forget import forget
    from lance_assets.table.side import holds_files

    planted = planted_set(10, 1, 6, seed=13, **REWORD)
    copies = set(planted.copy_of)
    first = [t for i, t in enumerate(planted.texts) if i not in copies]
    later = [planted.texts[i] for i in sorted(copies)]
    settings = sd.SemanticDupSettings(threshold=THRESHOLD, rows_per_cluster=8, languages=[])
    root = tmp_path / "data"
    add_rows(root, tmp_path / "a.jsonl", first + ["a document about nothing at all"])
    produce(sd.PRODUCER, Table.of(root), settings, log=quiet)
    store_dir = paths.semantic_dup_dir(root)
    assert ss.side_store(Table.of(root)).load_state() is not None and holds_files(store_dir)
    report = forget(Table.of(root), f"id = {len(first)}", log=quiet)
    assert any(f["path"] == str(store_dir) for f in report.files_removed)
    assert holds_files(store_dir) == []  # it held the forgotten row's vector
    assert ss.side_store(Table.of(root)).load_state() is None
    add_rows(root, tmp_path / "b.jsonl", later)
    report = produce(sd.PRODUCER, Table.of(root), settings, log=quiet)
    stats = report.stats
    assert stats.retrained == "store made again" and stats.earlier_rows == len(first)
    got = {r["id"]: r for r in rows(root)}
    n_first = len(first) + 1
    flagged = [got[n_first + k]["semantic_dup"] for k in range(len(later))]
    assert all(flagged), flagged
    state = ss.side_store(Table.of(root)).load_state()
    assert state["rows"] == len(first) + len(later)
    assert len(first) not in ss.side_store(Table.of(root)).ids(state)


def test_a_run_killed_before_its_store_append_is_caught_up(tmp_path, monkeypatch):
    """The store is appended after the commit: a run that dies in between leaves rows the
    store lacks; the next run adds them first, and finds copies of them."""
    planted = planted_set(10, 1, 6, seed=17, **REWORD)
    copies = set(planted.copy_of)
    first = [t for i, t in enumerate(planted.texts) if i not in copies]
    later = [planted.texts[i] for i in sorted(copies)]
    root = tmp_path / "data"
    add_rows(root, tmp_path / "a.jsonl", first)
    produce(sd.PRODUCER, Table.of(root), ALL, log=quiet)
    add_rows(root, tmp_path / "b.jsonl", later[:1] + ["an unrelated sentence or two here"])
    real = ss.store_group

    def killed(*args):
        raise KeyboardInterrupt("killed between the commit and the store append")
    monkeypatch.setattr(ss, "store_group", killed)
    with pytest.raises(KeyboardInterrupt):
        produce(sd.PRODUCER, Table.of(root), ALL, log=quiet)
    monkeypatch.setattr(ss, "store_group", real)
    assert rows(root)[-1]["semantic_cluster"] is not None  # committed
    add_rows(root, tmp_path / "c.jsonl", later[1:])
    report = produce(sd.PRODUCER, Table.of(root), ALL, log=quiet)
    stats = report.stats
    assert stats.caught_up == 2
    assert ss.side_store(Table.of(root)).load_state()["rows"] == len(planted.texts) + 1
    assert all(r["semantic_dup"] for r in rows(root)[len(first) + 2:])


def test_a_run_killed_before_its_commit_leaves_the_store_as_it_was(tmp_path, monkeypatch):
    """Killed before its commit, a run leaves the store as it was (it switches the state only
    after the commit); the next run finds it whole (no rows to add) and writes the rows itself,
    equal to a run that was never killed."""
    planted = planted_set(10, 1, 6, seed=19, **REWORD)
    root = tmp_path / "data"
    add_rows(root, tmp_path / "a.jsonl", planted.texts[:16])
    produce(sd.PRODUCER, Table.of(root), ALL, log=quiet)
    store = ss.side_store(Table.of(root))
    before = store.read()
    add_rows(root, tmp_path / "b.jsonl", planted.texts[16:])

    def killed(*args, **kwargs):
        raise KeyboardInterrupt("killed before the commit")
    monkeypatch.setattr("lance_assets.table.producer.write_columns", killed)
    with pytest.raises(KeyboardInterrupt):
        produce(sd.PRODUCER, Table.of(root), ALL, log=quiet)
    monkeypatch.undo()
    assert store.read() == before and before.state["rows"] == 16
    report = produce(sd.PRODUCER, Table.of(root), ALL, log=quiet)
    stats = report.stats
    assert stats.caught_up == 0 and stats.documents == len(planted.texts) - 16
    assert store.load_state()["rows"] == len(planted.texts)
    fresh = tmp_path / "fresh"
    add_rows(fresh, tmp_path / "f.jsonl", planted.texts[:16])
    produce(sd.PRODUCER, Table.of(fresh), ALL, log=quiet)
    add_rows(fresh, tmp_path / "g.jsonl", planted.texts[16:])
    produce(sd.PRODUCER, Table.of(fresh), ALL, log=quiet)
    assert rows(root, sd.COLUMNS) == rows(fresh, sd.COLUMNS)


def test_a_store_an_earlier_release_wrote_is_adopted_or_made_again(tmp_path):
    """A state file of the release before (``state.json``, format 2) is adopted once, checked
    against the table and removed; a store of float32 vectors (format 1) is not read: the run
    makes it again from the columns and removes the old files."""
    import shutil

    planted = planted_set(10, 1, 6, seed=23, **REWORD)
    root = tmp_path / "data"
    add_rows(root, tmp_path / "a.jsonl", planted.texts[:16])
    produce(sd.PRODUCER, Table.of(root), ALL, log=quiet)
    store_dir = paths.semantic_dup_dir(root)
    store = ss.side_store(Table.of(root))
    state = store.load_state()
    legacy = {k: v for k, v in state.items() if k not in ("digest", "table_sig")}
    legacy["ids_through"] = 15  # what the release before kept instead
    shutil.rmtree(store_dir / "state.lance")
    (store_dir / "state.json").write_text(json.dumps(legacy))
    assert store.load_state() == legacy
    add_rows(root, tmp_path / "b.jsonl", planted.texts[16:20])
    report = produce(sd.PRODUCER, Table.of(root), ALL, log=quiet)
    stats = report.stats
    assert stats.caught_up == 0 and not stats.trained and stats.earlier_rows == 16
    assert not (store_dir / "state.json").exists()
    now = store.load_state()
    assert now["generation"] == state["generation"] and now["rows"] == 20

    old = {**now, "format": 1}  # an older release's store: its files are never read
    store.switch(store.read(), old)
    stale = store_dir / f"g{now['generation']}" / "c0" / "0-15-16.bin"
    add_rows(root, tmp_path / "c.jsonl", planted.texts[20:])
    report = produce(sd.PRODUCER, Table.of(root), ALL, log=quiet)
    stats = report.stats
    assert stats.retrained == "store made again" and stats.earlier_rows == 20
    now = store.load_state()
    assert now["format"] == vf.FORMAT and now["generation"] != old["generation"]
    assert not stale.exists() and now["rows"] == len(planted.texts)
    assert not (store_dir / f"g{old['generation']}").exists()
    assert sum(r["semantic_dup"] for r in rows(root)) >= 5


def test_a_truncated_store_file_is_refused_with_the_fix(tmp_path):
    store = vf.Store(str(tmp_path / "store"))
    vecs = np.random.default_rng(0).integers(-127, 128, (6, 384)).astype(np.int8)
    ids = np.arange(6, dtype=np.int64)
    entry = store.write_segment(0, 0, ids, ids, vecs)
    assert np.array_equal(store.read_segment(0, entry).vt.T, vecs)
    path = tmp_path / "store" / "g0" / entry[0]
    path.write_bytes(path.read_bytes()[:-10])
    with pytest.raises(RuntimeError, match="shorter than its 6 rows; the next run"):
        store.read_segment(0, entry)


def test_cluster_groups_give_the_columns_of_one_group(tmp_path):
    """Grouping the clusters (one task each under Ray) changes nothing: exact int8 cosines,
    ties to the smallest id."""
    topics, docs, copies = _topic_set(per_topic=5)
    texts = [d for t in topics for d in docs[t]] + [c for t in topics for c in copies[t]]
    settings = sd.SemanticDupSettings(threshold=THRESHOLD, rows_per_cluster=5, languages=[])
    got = {}
    for parts in (1, 4):
        root = tmp_path / f"p{parts}"
        add_rows(root, tmp_path / f"p{parts}-a.jsonl", texts[:30])
        produce(sd.PRODUCER, Table.of(root), dataclasses.replace(settings, partitions=parts), log=quiet)
        add_rows(root, tmp_path / f"p{parts}-b.jsonl", texts[30:])
        report = produce(sd.PRODUCER, Table.of(root), dataclasses.replace(settings, partitions=parts),
                         log=quiet)
        stats = report.stats
        assert stats.groups == min(parts, stats.clusters)
        got[parts] = rows(root, sd.COLUMNS)
    assert got[1] == got[4]
    assert sum(r["semantic_dup"] for r in got[1]) >= 24


def test_the_store_compacts_a_cluster_read_from_many_runs_and_removes_what_it_replaced(tmp_path):
    store = vf.Store(str(tmp_path / "store"))
    rng = np.random.default_rng(0)
    state = {"generation": 0, "segments": {}}
    expected = {0: [], 1: []}
    for run in range(20):  # one file a run for both clusters; compacted past MAX_SEGMENTS
        ids = np.arange(run * 10, run * 10 + 10, dtype=np.int64)
        homes = rng.integers(0, 2, 10)
        vecs = rng.integers(-127, 128, (10, 384)).astype(np.int8)
        got = store.append_run(0, state["segments"], homes, ids, ids + 1000, vecs)
        after = {**state, "segments": {**state["segments"], **got}}
        store.remove_replaced(state, after)
        state = after
        for c in (0, 1):
            expected[c] += [(int(i), v) for i, v, h in zip(ids, vecs, homes) if h == c]
    for c in (0, 1):
        assert len(state["segments"][str(c)]) <= vf.MAX_SEGMENTS
        ids, reps, vecs = store.read_cluster(state, c)
        assert ids.tolist() == [i for i, _ in expected[c]] and (reps == ids + 1000).all()
        assert np.array_equal(vecs, np.stack([v for _, v in expected[c]]))
    files = {p.relative_to(tmp_path / "store" / "g0").as_posix()
             for p in (tmp_path / "store" / "g0").rglob("*.bin")}
    assert files == store.referenced(state)  # nothing left that no state lists


def test_a_cluster_is_read_for_comparing_as_one_part_in_id_order(tmp_path):
    """The comparison reads a cluster as its largest file plus the slices of the runs since,
    each run file read once for the clusters of a group; together, in id order, they are the
    cluster's rows. Slices whose ids do not follow the largest file's come back as a second
    part (the same rows)."""
    store = vf.Store(str(tmp_path / "store"))
    rng = np.random.default_rng(3)

    def vecs(n):
        return rng.integers(-127, 128, (n, 384)).astype(np.int8)
    segments = {str(c): [store.write_segment(0, c, np.arange(c * 50, c * 50 + 40),
                                             np.arange(c * 50, c * 50 + 40), vecs(40))]
                for c in (0, 1, 2)}
    state = {"generation": 0, "segments": segments}
    for run in range(3):  # three runs, one file each for every cluster's new rows
        ids = np.arange(1000 + 100 * run, 1000 + 100 * run + 12)
        got = store.append_run(0, state["segments"], rng.integers(0, 3, 12), ids, ids + 7,
                               vecs(12))
        state = {**state, "segments": {**state["segments"], **got}}
    tails = store.tails(state, [0, 1, 2])
    for c in (0, 1, 2):
        parts = store.cluster(state, c, tails)
        ids, reps, v = store.read_cluster(state, c)
        assert len(parts) == 1 and len(state["segments"][str(c)]) > 1
        got = parts[0]
        assert got.ids.tolist() == ids.tolist() and got.reps.tolist() == reps.tolist()
        assert np.array_equal(got.vt.T, v) and np.array_equal(got.inv, iv.inv_norms(v))
    # a slice of smaller ids than the largest file's: two parts, the same rows
    early = store.write_segment(0, 0, np.arange(3, 6), np.arange(3, 6), vecs(3))
    state["segments"]["0"] = state["segments"]["0"] + [early]
    parts = store.cluster(state, 0, store.tails(state, [0]))
    ids, _, v = store.read_cluster(state, 0)
    assert len(parts) == 2
    both = np.concatenate([p.ids for p in parts])
    order = np.argsort(both)
    assert both[order].tolist() == ids.tolist()
    assert np.array_equal(np.concatenate([p.vt for p in parts], axis=1)[:, order].T, v)


def _stored_rows(root) -> dict[int, int]:
    """id -> representative of every row in the side store."""
    store = ss.side_store(Table.of(root))
    state = store.load_state()
    out = {}
    for c in range(int(state["clusters"])):
        ids, reps, _ = store.files.read_cluster(state, c)
        out.update(zip(ids.tolist(), reps.tolist()))
    return out


def test_two_runs_at_once_then_an_increment_flag_what_one_run_does(tmp_path):
    """Two `semantic_dup` processes on one table at once (two Dagster instances would do the
    same), then an increment of reworded copies: as many copies flagged as after one run, and
    the side store holds what one clean run's holds."""
    import shutil
    import subprocess
    import sys

    from lance_assets_tests.fault_driver import run as run_writer

    planted = planted_set(24, 1, 72, seed=31, **REWORD)
    copies = set(planted.copy_of)
    first = [t for i, t in enumerate(planted.texts) if i not in copies]
    later = [planted.texts[i] for i in sorted(copies)]
    settings = json.dumps({"threshold": THRESHOLD, "rows_per_cluster": 30})
    base = tmp_path / "base"
    add_rows(base, tmp_path / "a.jsonl", first)
    clean, raced = tmp_path / "clean", tmp_path / "raced"
    shutil.copytree(base, clean)
    shutil.copytree(base, raced)
    run_writer("semantic_dup", str(clean), settings)
    procs = [subprocess.Popen([sys.executable, "-m", "lance_assets_tests.fault_driver",
                               "semantic_dup", str(raced), "none", "0", settings],
                              stderr=subprocess.PIPE, text=True) for _ in range(2)]
    for proc in procs:
        _, err = proc.communicate(timeout=300)
        assert proc.returncode == 0, err[-3000:]
    assert _stored_rows(raced) == _stored_rows(clean)
    for root in (clean, raced):
        add_rows(root, tmp_path / f"{root.name}-b.jsonl", later)
        run_writer("semantic_dup", str(root), settings)
    flagged = {root.name: sum(r["semantic_dup"] for r in rows(root)[len(first):])
               for root in (clean, raced)}
    assert flagged["clean"] == len(later) and flagged["raced"] == flagged["clean"], flagged
    assert rows(raced, sd.COLUMNS) == rows(clean, sd.COLUMNS)
    assert _stored_rows(raced) == _stored_rows(clean)


class _Killed(BaseException):
    """Stands for a SIGKILL in this process: nothing after it runs."""


def _dies_after(m, kind: str) -> None:
    """The run is killed right after its first switch of the store's state of ``kind``
    (``retrain``: a new generation; ``append``: rows added to the same generation; ``repair``:
    rows added from the columns) or, for ``before append``, between its commit and its switch."""
    if kind == "before append":
        m.setattr(ss, "store_group", lambda *a: (_ for _ in ()).throw(_Killed(kind)))
        return
    real = ss.SideStore.switch

    def switch(self, read, state):
        out = real(self, read, state)
        old = read.state
        new_gen = state is not None and (old is None or state["generation"] != old["generation"])
        grown = state is not None and old is not None and not new_gen and \
            state["rows"] > old["rows"]
        if {"retrain": new_gen and state.get("reason"), "append": grown and not kind_repair(),
                "repair": grown and kind_repair()}[kind]:
            raise _Killed(kind)
        return out

    def kind_repair() -> bool:  # a repair switches inside reconcile()
        import traceback
        return any(f.name == "reconcile" for f in traceback.extract_stack())
    m.setattr(ss.SideStore, "switch", switch)


@pytest.mark.parametrize("kills", [{1: "retrain"}, {1: "append"},
                                   {1: "before append", 2: "repair"}],
                         ids=["retrain", "append", "repair"])
def test_a_run_killed_at_any_switch_of_its_store_is_continued_equal_to_a_clean_one(tmp_path,
                                                                                 monkeypatch,
                                                                                 kills):
    """Killed right after a switch of the store's state (its clusters trained again, its rows
    appended, its repair from the columns when the run with the next rows finds that a run died
    before its append), the next run ends with the store and the columns one clean sequence of
    runs leaves."""
    planted = planted_set(10, 1, 6, seed=37, **REWORD)
    steps = [planted.texts[:8], planted.texts[8:18], planted.texts[18:]]
    settings = sd.SemanticDupSettings(threshold=THRESHOLD, rows_per_cluster=8, languages=[])

    def run_all(root, kills=None):
        for n, texts in enumerate(steps):
            add_rows(root, tmp_path / f"{root.name}{n}.jsonl", texts)
            if n in (kills or {}):
                with monkeypatch.context() as m:
                    _dies_after(m, kills[n])
                    with pytest.raises(_Killed):
                        produce(sd.PRODUCER, Table.of(root), settings, log=quiet)
                if kills[n] == "before append":
                    continue  # its rows are committed: the next run with new rows repairs
            produce(sd.PRODUCER, Table.of(root), settings, log=quiet)

    clean, killed = tmp_path / "clean", tmp_path / "killed"
    run_all(clean)
    run_all(killed, kills)
    assert rows(killed, sd.COLUMNS) == rows(clean, sd.COLUMNS)
    assert _stored_rows(killed) == _stored_rows(clean)
