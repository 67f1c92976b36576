"""Near-duplicates: MinHash LSH against brute-force Jaccard, and incremental writes that match new
documents against old ones without rewriting old values."""

import lance
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from lance_assets import paths
from lance_assets.curation import minhash
from lance_assets.curation import near_dup as nd
from lance_assets.ingest.raw_text import ingest
from lance_assets.ingest.synthetic import SyntheticSpec, generate
from lance_assets.table import Table, data_files_by_field
from lance_assets.table.producer import produce
from lance_assets.testing.curation_reference import brute_force_pairs, plant_near_duplicates, precision_recall
from lance_assets_tests import near_dup_chain
from lance_assets_tests.helpers import quiet


def shingle_sets(texts):
    doc, sh = minhash.shingles(pa.array(texts), 5)
    return [set(s.tolist()) for s in minhash.per_doc_sets(doc, sh, len(texts))]


def test_signature_agreement_estimates_jaccard():
    texts = generate(SyntheticSpec(rows=60, seed=9)).column("text").to_pylist()
    texts, pairs = plant_near_duplicates(texts, 0.5, seed=2, max_edits=6)
    settings = minhash.MinHashSettings()
    doc, sh = minhash.shingles(pa.array(texts), settings.ngram)
    sig = minhash.signatures(doc, sh, len(texts), settings)
    sets = minhash.per_doc_sets(doc, sh, len(texts))
    errors = [abs(np.mean(sig[i] == sig[j]) - minhash.jaccard(sets[i], sets[j])) for i, j in pairs]
    assert np.mean(errors) < 0.05  # 112 permutations: standard error ~0.04 near J = 0.8


def test_planted_near_duplicates_precision_and_recall(tmp_path):
    texts = generate(SyntheticSpec(rows=1200, seed=11, dup_fraction=0.02)).column("text").to_pylist()
    texts, pairs = plant_near_duplicates(texts, 0.15, seed=4)
    pq.write_table(pa.table({"text": texts}), tmp_path / "planted.parquet")
    root = tmp_path / "data"
    ingest(Table.of(root), str(tmp_path / "planted.parquet"), rows_per_fragment=400, log=quiet)
    report = produce(nd.PRODUCER, Table.of(root), log=quiet)
    stats = report.stats
    assert report.rows_written == len(texts) and stats.confirmed_pairs > 0
    t = lance.dataset(paths.table_uri(root)).to_table(
        columns=["id", "near_dup_cluster", "near_dup"]).sort_by("id")
    clusters = t.column("near_dup_cluster").to_pylist()
    flags = t.column("near_dup").to_pylist()

    rng = np.random.default_rng(0)
    sample = sorted({i for p in pairs for i in p} | set(rng.choice(1200, 200, replace=False).tolist()))
    truth = brute_force_pairs(shingle_sets([texts[i] for i in sample]), 0.8)
    got = precision_recall([clusters[i] for i in sample], truth)
    assert got["true_pairs"] > 100
    assert got["recall"] >= 0.9 and got["precision"] >= 0.95, got
    # one document per cluster is kept, and it is the first
    first = {}
    for i, c in enumerate(clusters):
        first.setdefault(c, i)
        assert flags[i] == (first[c] != i)
        assert c == first[c]  # the cluster id is its first member's id (ids are 0..n-1 here)


def test_incremental_matches_new_against_old_without_rewriting(tmp_path):
    base = generate(SyntheticSpec(rows=600, seed=12, dup_fraction=0.0)).column("text").to_pylist()
    planted, pairs = plant_near_duplicates(base, 0.1, seed=5, max_edits=1)
    copies = [planted[c] for c, _ in pairs]
    pq.write_table(pa.table({"text": base}), tmp_path / "a.parquet")
    pq.write_table(pa.table({"text": copies + base[:5]}), tmp_path / "b.parquet")
    root = tmp_path / "data"
    uri = paths.table_uri(root)
    ingest(Table.of(root), str(tmp_path / "a.parquet"), rows_per_fragment=200, log=quiet)
    produce(nd.PRODUCER, Table.of(root), fragments_per_commit=2, log=quiet)
    before = lance.dataset(uri)
    old_values = before.to_table(columns=["id", "near_dup_cluster", "near_dup"]).sort_by("id")
    old_files = data_files_by_field(before, "near_dup")
    assert not any(old_values.column("near_dup").to_pylist())  # no near-dups planted yet

    ingest(Table.of(root), str(tmp_path / "b.parquet"), rows_per_fragment=200, log=quiet)
    report = produce(nd.PRODUCER, Table.of(root), log=quiet)
    stats = report.stats
    assert report.rows_written == len(copies) + 5 and report.fragments_already_done == 3
    after = lance.dataset(uri)
    t = after.to_table(columns=["id", "near_dup_cluster", "near_dup"]).sort_by("id")
    assert t.slice(0, 600).equals(old_values)  # old values unchanged ...
    assert {k: v for k, v in data_files_by_field(after, "near_dup").items() if k in old_files} \
        == old_files  # ... and their files untouched
    new = t.slice(600).to_pylist()
    sources = [src for _, src in pairs] + list(range(5))
    matched = sum(r["near_dup"] and r["near_dup_cluster"] == s for r, s in zip(new, sources))
    assert matched >= 0.95 * len(new)
    assert stats.joined_old_clusters == matched
    assert produce(nd.PRODUCER, Table.of(root), log=quiet).nothing_to_do


def test_changed_settings_are_refused(tmp_path):
    root = tmp_path / "data"
    ingest(Table.of(root), "synthetic:100", log=quiet)
    produce(nd.PRODUCER, Table.of(root), log=quiet)
    with pytest.raises(nd.SettingsMismatchError, match="drop the columns"):
        produce(nd.PRODUCER, Table.of(root),
                nd.NearDupSettings(minhash=minhash.MinHashSettings(bands=20, rows_per_band=5)), log=quiet)


@pytest.mark.parametrize("later", [False, True], ids=["one-run", "c-later"])
def test_a_chain_is_matched_when_its_middle_holds_no_key_of_its_own(tmp_path, later):
    """A -> B -> C: C is a near-copy of B, not of A, and every band key C shares with B is A's
    too (A is each such key's first holder). C joins the chain's cluster, whether it arrives
    with A and B or after they were written."""
    a, b, c = near_dup_chain.chain()
    j = near_dup_chain.jaccards([a, b, c])
    assert j[0, 1] >= 0.8 and j[1, 2] >= 0.8 > j[0, 2]
    ka, kb, kc = near_dup_chain.band_keys([a, b, c])
    assert kc & kb and not (kc & kb) - ka  # C shares keys with B, none that A lacks
    root = tmp_path / "data"
    batches = [[a, b], [c]] if later else [[a, b, c]]
    for i, texts in enumerate(batches):
        pq.write_table(pa.table({"text": texts}), tmp_path / f"{i}.parquet")
        ingest(Table.of(root), str(tmp_path / f"{i}.parquet"), log=quiet)
        produce(nd.PRODUCER, Table.of(root), log=quiet)
    t = lance.dataset(paths.table_uri(root)).to_table(
        columns=["id", "near_dup_cluster", "near_dup"]).sort_by("id").to_pylist()
    assert [(r["near_dup_cluster"], r["near_dup"]) for r in t] == \
        [(0, False), (0, True), (0, True)]
