"""Semantic duplicates: reworded copies (which MinHash misses) flagged against their original,
distractors on the same topics kept, new rows compared against old ones without rewriting old
values, and the flag usable in a curation rule. The sentence model is stood in for by a bag of
words with synonyms folded (the real model's figures are in docs/benchmarks.md)."""

import json

import lance
import numpy as np
import pyarrow as pa
import pytest

from lance_assets import keys, paths
from lance_assets.curation import minhash, rules
from lance_assets.curation import semantic_dup as sd
from lance_assets.embeddings.chunk_embeddings import chunk_embeddings
from lance_assets.ingest.raw_text import ingest
from lance_assets.table import data_files_by_field, get_json_config
from lance_assets.table.producer import produce
from lance_assets.testing.semantic_planted import SynonymBagEmbedder, planted_set
from lance_assets_tests.helpers import quiet

# Bag-of-words vectors of this set: copies >= 0.8 with their original, other pairs <= 0.55
THRESHOLD = 0.75
REWORD = {"drop": 0.1, "synonyms": 0.4, "shuffle": 0.5}


def add_rows(root, path, texts):
    path.write_text("".join(json.dumps({"text": t}) + "\n" for t in texts))
    ingest(root, str(path), rows_per_fragment=10, log=quiet)
    chunk_embeddings(root, chunk_tokens=64, overlap_tokens=8, embedder=SynonymBagEmbedder(),
                     log=quiet)


def rows(root):
    return lance.dataset(paths.table_uri(root)).to_table(
        columns=["id", *sd.COLUMNS]).sort_by("id").to_pylist()


def test_planted_copies_are_flagged_against_their_original_and_distractors_kept(tmp_path):
    planted = planted_set(12, 1, 12, seed=3, **REWORD)
    doc, sh = minhash.shingles(pa.array(planted.texts), 5)
    sets = minhash.per_doc_sets(doc, sh, len(planted.texts))
    # the copies are not near-duplicates: MinHash LSH (Jaccard >= 0.8) cannot confirm them
    assert max(minhash.jaccard(sets[c], sets[o]) for c, o in planted.copy_of.items()) < 0.6
    root = tmp_path / "data"
    add_rows(root, tmp_path / "a.jsonl", planted.texts)
    got = produce(sd.PRODUCER, root, sd.SemanticDupSettings(threshold=THRESHOLD), log=quiet)
    assert got.write.rows_written == len(planted.texts)
    assert got.summary["new_rows_flagged"] == len(planted.copy_of)
    assert got.summary["not_computed"] == 0 and got.summary["clusters_trained_now"]
    for r in rows(root):  # ids are positions in the planted list here
        if r["id"] in planted.copy_of:
            assert r["semantic_dup"] and r["semantic_rep"] == planted.copy_of[r["id"]], r
            assert THRESHOLD <= r["semantic_cos"] < 1.0
        else:
            assert not r["semantic_dup"] and r["semantic_rep"] == r["id"], r
            assert r["semantic_cos"] == 1.0
        assert r["semantic_cluster"] is not None

    # usable in rules (opt-in): `NOT semantic_dup` removes exactly the copies
    ds = lance.dataset(paths.table_uri(root))
    evaluation = rules.evaluate(ds, {"semantic_dup": "NOT semantic_dup"})
    assert evaluation.ok and evaluation.hits[0].removed == len(planted.copy_of)
    assert rules.validate(ds, {"semantic_dup": "NOT semantic_dup"})
    assert "semantic_dup" not in rules.DEFAULT_RULES

    # a rerun is a no-op; other settings on the written columns are refused
    again, stats = sd.semantic_dup(root, sd.SemanticDupSettings(threshold=THRESHOLD), log=quiet)
    assert again.nothing_to_do and stats.documents == 0
    with pytest.raises(sd.SettingsMismatchError, match="drop the columns"):
        sd.semantic_dup(root, sd.SemanticDupSettings(threshold=0.9), log=quiet)


def test_new_rows_are_compared_against_old_ones_without_rewriting(tmp_path):
    planted = planted_set(18, 1, 12, seed=5, **REWORD)
    copies = set(planted.copy_of)
    first = [t for i, t in enumerate(planted.texts) if i not in copies]
    position = {i: n for n, i in enumerate(i for i in range(len(planted.texts)) if i not in copies)}
    second_src = sorted(copies)
    settings = sd.SemanticDupSettings(threshold=THRESHOLD, clusters=3, seed=1)
    root = tmp_path / "data"
    uri = paths.table_uri(root)
    add_rows(root, tmp_path / "a.jsonl", first)
    sd.semantic_dup(root, settings, fragments_per_commit=1, log=quiet)
    before = lance.dataset(uri)
    old_rows, old_files = rows(root), data_files_by_field(before, "semantic_dup")
    stored = get_json_config(before, keys.SEMANTIC_DUP_KEY)
    assert stored["clusters"] == 3 and not any(r["semantic_dup"] for r in old_rows)
    assert len({r["semantic_cluster"] for r in old_rows}) == 3

    add_rows(root, tmp_path / "b.jsonl", [planted.texts[i] for i in second_src])
    report, stats = sd.semantic_dup(root, settings, log=quiet)
    assert report.rows_written == len(second_src) and stats.earlier_rows == len(first)
    after = lance.dataset(uri)
    new_rows = rows(root)
    assert new_rows[:len(first)] == old_rows  # old values unchanged ...
    assert {k: v for k, v in data_files_by_field(after, "semantic_dup").items()
            if k in old_files} == old_files  # ... and their files untouched
    assert get_json_config(after, keys.SEMANTIC_DUP_KEY) == stored  # the same clusters
    for r, src in zip(new_rows[len(first):], second_src):
        original = old_rows[position[planted.copy_of[src]]]
        assert r["semantic_dup"] and r["semantic_rep"] == original["id"], r
        assert r["semantic_cluster"] == original["semantic_cluster"]
    assert stats.flagged_against_earlier_runs == len(second_src)
    assert sd.semantic_dup(root, settings, log=quiet)[0].nothing_to_do


def test_rows_without_chunk_embeddings_are_refused_with_the_fix(tmp_path):
    root = tmp_path / "data"
    (tmp_path / "a.jsonl").write_text(json.dumps({"text": "one short document"}) + "\n")
    ingest(root, str(tmp_path / "a.jsonl"), log=quiet)
    with pytest.raises(sd.MissingChunkEmbeddingsError, match="materialize `chunk_embeddings`"):
        sd.semantic_dup(root, log=quiet)
    chunk_embeddings(root, chunk_tokens=64, overlap_tokens=8, embedder=SynonymBagEmbedder(),
                     log=quiet)
    (tmp_path / "b.jsonl").write_text(json.dumps({"text": "another short document"}) + "\n")
    ingest(root, str(tmp_path / "b.jsonl"), log=quiet)  # no chunk_embeddings for it yet
    # an ingest that landed after `chunk_embeddings` ran: its rows wait, the rest is written
    report, stats = sd.semantic_dup(root, log=quiet)
    assert report.rows_written == 1 and report.fragments_pending == 1 and stats.documents == 1
    assert rows(root)[1]["semantic_cluster"] is None
    chunk_embeddings(root, chunk_tokens=64, overlap_tokens=8, embedder=SynonymBagEmbedder(),
                     log=quiet)
    report, stats = sd.semantic_dup(root, log=quiet)
    assert report.rows_written == 1 and stats.earlier_rows == 1
    assert [r["semantic_rep"] for r in rows(root)] == [0, 1]


def test_blocked_comparison_equals_brute_force(monkeypatch):
    monkeypatch.setattr(sd, "NEW_BLOCK", 7)
    monkeypatch.setattr(sd, "OLD_BLOCK", 5)
    rng = np.random.default_rng(0)
    base = rng.standard_normal((40, 384)).astype(np.float32)
    vecs = np.concatenate([base, base[rng.integers(0, 40, 40)]
                           + 0.15 * rng.standard_normal((40, 384)).astype(np.float32)])
    vecs /= np.linalg.norm(vecs, axis=1, keepdims=True)
    ids = rng.permutation(80).astype(np.int64)
    cluster = rng.integers(0, 2, 80)
    old = np.flatnonzero(rng.random(80) < 0.4)  # written before: ids interleave with new ones
    new = np.setdiff1d(np.arange(80), old)
    new = new[np.argsort(ids[new])]
    old_rep = ids[old].copy()  # old rows kept (their reps are themselves)
    got = sd.compare(ids[new], vecs[new], cluster[new], ids[old], vecs[old], cluster[old],
                     old_rep, 0.9, sd.SemanticDupStats())
    rep_of = dict(zip(ids[old].tolist(), old_rep.tolist()))
    flagged = 0
    for k, i in enumerate(new):  # brute force, in id order
        earlier = [j for j in range(80)  # old rows, and new rows already done
                   if cluster[j] == cluster[i] and ids[j] < ids[i] and ids[j] in rep_of]
        sims = [float(vecs[i] @ vecs[j]) for j in earlier]
        dup = bool(sims) and max(sims) >= 0.9
        rep = rep_of[int(ids[earlier[int(np.argmax(sims))]])] if dup else int(ids[i])
        rep_of[int(ids[i])] = rep
        assert got.dup[k] == dup and got.rep[k] == rep
        flagged += dup
    assert flagged > 5


def test_rows_without_chunks_get_nulls_and_are_counted(tmp_path):
    from lance_assets.embeddings.chunk_embeddings import CHUNK_EMBEDDINGS, to_arrow
    from lance_assets.table.columns import write_columns

    planted = planted_set(4, 1, 2, seed=7, **REWORD)
    root = tmp_path / "data"
    (tmp_path / "a.jsonl").write_text("".join(json.dumps({"text": t}) + "\n"
                                              for t in planted.texts))
    ingest(root, str(tmp_path / "a.jsonl"), log=quiet)
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

    write_columns(root, [CHUNK_EMBEDDINGS], one_chunk_each, log=quiet)
    got = produce(sd.PRODUCER, root, sd.SemanticDupSettings(threshold=THRESHOLD), log=quiet)
    assert got.summary["not_computed"] == 2 and got.write.rows_written == len(planted.texts)
    for r in rows(root):
        if r["id"] in no_chunks:
            assert all(r[c] is None for c in sd.COLUMNS), r
        else:
            assert r["semantic_cluster"] is not None and r["semantic_rep"] is not None
