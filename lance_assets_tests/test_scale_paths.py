"""The linear paths behind the seed's real workload: exact dedup by one hash per text, commits
batched by time and size, and the FineWeb-shaped generator with its planted ground truth."""

import re

import lance
import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lance_assets import paths
from lance_assets.curation import dedup_flag as dedup
from lance_assets.curation import minhash
from lance_assets.curation import near_dup as nd
from lance_assets.ingest import synthetic_web as sw
from lance_assets.ingest.raw_text import ingest
from lance_assets.ingest.sources import SkipCounter, SourceError, resolve
from lance_assets.table import Table
from lance_assets.table.columns import CommitPolicy, write_columns
from lance_assets.table.producer import produce
from lance_assets_tests.helpers import quiet

WHITESPACE = " \t\n\r\f\v"


@settings(max_examples=200, deadline=None)
@given(st.text(alphabet=st.sampled_from(list(WHITESPACE) + ["a", "b", "é", "字", "\u00a0",
                                                            "\u2028", "\x1c", "0"]),
               max_size=40))
def test_text_hashes_normalise_exactly_like_the_sql_and_python_twins(text):
    """The bytes.split normalisation equals the regex one on any mix of ASCII whitespace,
    Unicode spaces (which are not collapsed) and multi-byte characters."""
    import hashlib

    expected = hashlib.md5(dedup.normalise(text).encode()).digest()
    got = dedup.text_hashes(pa.array([text])).tobytes()
    assert got == expected
    assert dedup.normalise(text) == re.sub(dedup.WHITESPACE_RUN, " ", text).strip(" ")


def test_is_dup_matches_duckdb_on_planted_copies(tmp_path):
    """The planted exact and respaced copies of the web corpus are flagged, and nothing else
    that DuckDB's own normalise + md5 + first id does not flag."""
    import duckdb

    root = tmp_path / "data"
    spec = sw.WebSpec(rows=3000, seed=5, exact_dup=0.05)
    ingest(Table.of(root), "synthetic-web:3000", rows_per_fragment=700, log=quiet)
    produce(dedup.PRODUCER, Table.of(root), log=quiet)
    ds = lance.dataset(paths.table_uri(root))
    got = ds.to_table(columns=["id", "is_dup"]).sort_by("id").column("is_dup").to_numpy(
        zero_copy_only=False)
    con = duckdb.connect()
    con.register("corpus", ds)
    want = con.sql(f"SELECT id, id > min(id) OVER (PARTITION BY {dedup.NORMALISED_HASH_SQL}) "
                   "AS d FROM corpus ORDER BY id").to_arrow_table().column("d").to_numpy(
        zero_copy_only=False)
    assert np.array_equal(got, want)
    plan = sw.planted(sw.WebSpec(rows=3000))
    exact = np.isin(plan.kind, [sw.EXACT, sw.RESPACED_EXACT])
    assert exact.sum() > 20 and got[exact].all()
    del spec


def test_web_generator_shape_determinism_and_ground_truth():
    spec = sw.WebSpec(rows=6000, seed=3)
    blocks = [sw.generate_block(spec, b) for b in range(spec.n_blocks)]
    again = sw.generate_block(spec, 4)  # any block alone, always the same
    assert again.equals(blocks[4])
    table = pa.concat_tables(blocks)
    texts = table.column("text").to_pylist()
    lengths = np.array([len(t) for t in texts])
    assert table.num_rows == 6000
    assert 3800 < lengths.mean() < 5600 and np.median(lengths) < lengths.mean()  # log-normal
    assert lengths.min() >= 150
    words, counts = np.unique(" ".join(texts[:200]).lower().split(), return_counts=True)
    top = set(words[np.argsort(-counts)[:5]])
    assert top <= set(sw.STOP_WORDS) and "the" in top  # Zipf: stop words lead
    plan = sw.planted(spec)
    copies = np.flatnonzero(plan.kind != sw.ORIGINAL)
    assert len(copies) > 200
    assert (plan.source[copies] < copies).all()  # a copy's original comes before it
    assert (plan.kind[plan.source[copies]] == sw.ORIGINAL).all()  # and is not itself a copy
    for i in copies[:80]:
        a, b = texts[i], texts[plan.source[i]]
        if plan.kind[i] == sw.EXACT:
            assert a == b
        elif plan.kind[i] == sw.RESPACED_EXACT:
            assert dedup.normalise(a) == dedup.normalise(b)
        else:
            assert a != b
    doc, sh = minhash.shingles(pa.array([texts[i] for i in copies] +
                                        [texts[plan.source[i]] for i in copies]), 5)
    sets = minhash.per_doc_sets(doc, sh, 2 * len(copies))
    jac = np.array([minhash.jaccard(sets[k], sets[len(copies) + k]) for k in range(len(copies))])
    assert (jac[plan.kind[copies] == sw.NEAR] >= 0.8).mean() > 0.95
    assert (jac[plan.kind[copies] == sw.PARTIAL] < 0.8).mean() > 0.8


def test_web_source_spec_and_its_errors():
    unit = resolve("synthetic-web:2500").units[0]
    assert unit.n_parts == 3 and "rows=2500" in unit.key
    parts = [p for p, _ in unit.read(2, SkipCounter())]
    assert set(parts) == {2}  # a resumed ingest makes only the blocks after its watermark
    with pytest.raises(SourceError, match="synthetic-web:20000"):
        resolve("synthetic-web:lots")


def test_near_dup_on_web_corpus_finds_planted_copies_and_rejects_partial_ones(tmp_path):
    root = tmp_path / "data"
    spec = sw.WebSpec(rows=4000, seed=0, near_dup=0.06, partial_dup=0.04)
    del spec
    ingest(Table.of(root), "synthetic-web:4000", rows_per_fragment=900, log=quiet)
    produce(nd.PRODUCER, Table.of(root), log=quiet)
    t = lance.dataset(paths.table_uri(root)).to_table(
        columns=["id", "near_dup", "near_dup_cluster"]).sort_by("id")
    flag = t.column("near_dup").to_numpy(zero_copy_only=False)
    cluster = t.column("near_dup_cluster").to_numpy()
    plan = sw.planted(sw.WebSpec(rows=4000))
    near = np.flatnonzero(plan.kind == sw.NEAR)
    partial = np.flatnonzero(plan.kind == sw.PARTIAL)
    assert flag[near].mean() > 0.9
    assert (cluster[near] == cluster[plan.source[near]]).mean() > 0.9
    assert flag[partial].mean() < 0.3  # band collisions that the Jaccard check rejects
    assert not flag[plan.kind == sw.ORIGINAL].any()


def test_commit_policy_batches_by_time_and_size():
    fixed = CommitPolicy(3)
    assert not fixed.due(2, now=1e9) and fixed.due(3, now=0.0)
    p = CommitPolicy(min_seconds=2.0, max_seconds=120.0, overhead_factor=20.0, max_fragments=50)
    p.last_commit_end, p.last_commit_s = 100.0, 0.01
    assert not p.due(0, now=1e6)  # nothing to commit
    assert not p.due(10, now=101.0) and p.due(10, now=102.0)  # at least min_seconds
    p.last_commit_s = 1.5  # a slow commit (big manifest): wait 20x it
    assert not p.due(10, now=120.0) and p.due(10, now=130.0)
    p.last_commit_s = 30.0  # capped at max_seconds
    assert not p.due(10, now=219.0) and p.due(10, now=220.0)
    assert p.due(50, now=100.5)  # or when the group is full


def test_write_columns_commits_in_time_batches_and_loses_at_most_one_group(tmp_path):
    """Unset fragments_per_commit: fast fragments are committed together (fewer commits than
    fragments), every value is written, and a rerun has nothing to do."""
    import time as _time

    root = tmp_path / "data"
    ingest(Table.of(root), "synthetic:1200", rows_per_fragment=50, log=quiet)
    uri = paths.table_uri(root)
    field = pa.field("n_chars2", pa.int64())

    def compute(frag):
        _time.sleep(0.01)
        for b in frag.to_batches(columns=["n_chars"]):
            yield pa.RecordBatch.from_arrays([pa.array(b.column(0).to_numpy() * 2, pa.int64())],
                                             names=["n_chars2"])

    report = write_columns(Table.of(root), [field], compute, log=quiet)
    fragments = len(lance.dataset(uri).get_fragments())
    assert fragments == 24 and len(report.fragments_written) == fragments
    assert report.commits < fragments / 3
    t = lance.dataset(uri).to_table(columns=["n_chars", "n_chars2"])
    assert np.array_equal(t.column(0).to_numpy() * 2, t.column(1).to_numpy())
    assert write_columns(Table.of(root), [field], compute, log=quiet).nothing_to_do


def reference_shingles(text: str, n: int = 5) -> set[int]:
    """One document's shingle set the slow way: words hashed one by one, windows rolled."""
    words = [w for w in minhash.simplify(pa.array([text])).to_pylist()[0].split() if w]
    if not words:
        return set()
    hashes = [minhash._blake(w) for w in words]
    windows = [hashes[i:i + n] for i in range(max(1, len(hashes) - n + 1))]
    out = set()
    mask = (1 << 64) - 1
    for win in windows:
        key = 0
        for h in win:
            key = ((key ^ h) * 0x100000001B3) & mask
        key ^= key >> 29
        key = (key * int(minhash.MIX)) & mask
        out.add(key >> 32)
    return out


@settings(max_examples=60, deadline=None)
@given(st.lists(st.lists(st.sampled_from(["the", "Cat", "sat", "on", "3.5", "mat!", "—", "a"]),
                         max_size=9).map(" ".join), min_size=1, max_size=6))
def test_shingle_stream_equals_word_by_word_hashing(texts):
    """Version 1's two paths (every document with 5+ words: rolled slices; some shorter: masked
    windows) give each document the set the definition gives (version 2: test_minhash_kernel)."""
    doc, sh = minhash.shingle_stream(pa.array(texts), 5, version=1)
    for i, text in enumerate(texts):
        assert set(sh[doc == i].tolist()) == reference_shingles(text)
