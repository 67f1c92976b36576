"""The embedding and chunk_embeddings columns' mechanics (with a stand-in model), the vector
indexes and their recall, and the pieces of search and attribution that need no model."""

import json

import lance
import numpy as np
import pytest

from lance_assets import paths
from lance_assets.embeddings import chunk_embeddings as chunks
from lance_assets.embeddings import embeddings as embed
from lance_assets.embeddings import onnx_backend
from lance_assets.embeddings import vector_index as vindex
from lance_assets.forensics.attribution import align, build_ngram_index, ngram_hashes, passages
from lance_assets.forensics.search import rrf, snippet
from lance_assets.forensics.words import text_words
from lance_assets.ingest.raw_text import ingest
from lance_assets.table import Table, data_files_by_field
from lance_assets.table.producer import produce
from lance_assets.testing.embedders import ClusteredEmbedder
from lance_assets_tests.helpers import quiet


def test_embedding_column_is_checkpointed_resumable_and_leaves_text_alone(tmp_path):
    root = tmp_path / "data"
    ingest(Table.of(root), "synthetic:600", rows_per_fragment=200, log=quiet)
    uri = paths.table_uri(root)
    text_files = data_files_by_field(lance.dataset(uri), "text")
    with pytest.raises(KeyboardInterrupt):  # killed while embedding the second fragment (a
        # fragment is two calls of the model here: a first range of 64 rows, then the rest)
        produce(embed.PRODUCER, Table.of(root),
                embed.EmbeddingsSettings(embedder=ClusteredEmbedder(fail_after_calls=2)), log=quiet)
    ds = lance.dataset(uri)
    assert ds.count_rows("embedding IS NOT NULL") == 200  # the first fragment was committed
    report = produce(embed.PRODUCER, Table.of(root), embed.EmbeddingsSettings(embedder=ClusteredEmbedder()),
                     log=quiet)
    assert report.fragments_already_done == 1 and len(report.fragments_written) == 2
    ds = lance.dataset(uri)
    assert ds.count_rows("embedding IS NULL") == 0
    assert data_files_by_field(ds, "text") == text_files
    assert ds.schema.field("embedding").type == embed.EMBEDDING.type
    assert not ds.schema.metadata  # table facts live in the manifest config only
    assert embed.table_embedding_spec(ds) == embed.EmbeddingSpec(backend=onnx_backend.resolve("auto", "cpu"))
    again = produce(embed.PRODUCER, Table.of(root), log=quiet)  # no model is loaded when nothing is missing
    assert again.nothing_to_do and again.model_load_s == 0 and again.device == ""
    with pytest.raises(embed.EmbeddingMismatchError, match="max_tokens=128"):
        produce(embed.PRODUCER, Table.of(root),
                embed.EmbeddingsSettings(max_tokens=64, embedder=ClusteredEmbedder()), log=quiet)


def test_vector_index_recall_is_measured_and_kept_current(tmp_path):
    root = tmp_path / "data"
    ingest(Table.of(root), "synthetic:3000", rows_per_fragment=1000, log=quiet)
    produce(embed.PRODUCER, Table.of(root), embed.EmbeddingsSettings(embedder=ClusteredEmbedder()), log=quiet)
    with pytest.raises(ValueError, match="IVF_PQ"):
        vindex.vector_index(Table.of(root), index_type="HNSW")
    report = vindex.vector_index(Table.of(root), recall_queries=50)
    s = report.settings
    assert report.action == "created" and s.index_type == "IVF_HNSW_SQ"
    assert s.num_partitions == round(3000 ** 0.5) and s.recall_queries == 50
    assert s.recall_at_10 >= 0.9 and s.tuning[-1]["recall_at_10"] == s.recall_at_10
    ds = lance.dataset(paths.table_uri(root))
    assert vindex.current_settings(ds) == s and vindex.has_index(ds)
    assert vindex.vector_index(Table.of(root)).action == "up_to_date"
    # appended rows are embedded and added to the index, not rebuilt from scratch
    more = tmp_path / "more.jsonl"
    more.write_text("".join(json.dumps({"text": f"appended document number {i}"}) + "\n"
                            for i in range(300)))
    ingest(Table.of(root), str(more), log=quiet)
    produce(embed.PRODUCER, Table.of(root), embed.EmbeddingsSettings(embedder=ClusteredEmbedder()), log=quiet)
    updated = vindex.vector_index(Table.of(root), recall_queries=50)
    assert updated.action == "updated" and updated.unindexed_rows == 0
    assert updated.settings.recall_at_10 >= 0.9
    # exact search where the table is small, and the index is gone
    flat = vindex.vector_index(Table.of(root), flat_below=10_000)
    assert flat.action == "flat" and flat.settings.index_type == "FLAT"
    assert not vindex.has_index(lance.dataset(paths.table_uri(root)))


def test_index_settings_follow_the_row_count():
    assert vindex.derive_settings(500).index_type == "FLAT"
    small, big = vindex.derive_settings(10_000), vindex.derive_settings(1_000_000)
    assert (small.num_partitions, big.num_partitions) == (100, 1000)
    pq = vindex.derive_settings(100_000, "IVF_PQ")
    assert pq.num_sub_vectors == 48 and pq.refine_factor == 5


def test_reciprocal_rank_fusion():
    fused = rrf([[1, 2, 3], [3, 1, 4]])
    assert fused[1] == pytest.approx(1 / 61 + 1 / 62) and fused[4] == pytest.approx(1 / 63)
    assert sorted(fused, key=lambda r: -fused[r])[:2] == [1, 3]
    assert "needle" in snippet("x " * 200 + "the needle here " + "y " * 200, "needle", 60)


def test_alignment_finds_longest_common_runs_and_where_they_are_in_both():
    doc = np.array([9, 1, 2, 3, 4, 5, 9, 7, 8, 9, 9])
    text = np.array([0, 1, 2, 3, 4, 5, 0, 7, 8, 0])
    al = align(text, doc, min_span=3)
    assert al.longest == 5 and al.segments == [(1, 6, 1, 6)]
    assert al.covered.tolist() == [False] + [True] * 5 + [False] * 4  # [7, 8] is shorter than 3
    # same answer whichever array is the shorter one
    al2 = align(np.tile(text, 3), doc, min_span=3)
    assert al2.longest == 5 and al2.covered.sum() == 15
    assert al2.segments == [(1, 6, 1, 6), (11, 16, 1, 6), (21, 26, 1, 6)]
    # a copy with one value changed every 10: one passage, its gaps counted as unmatched
    rng = np.random.default_rng(3)
    source = rng.integers(0, 1 << 30, 300)
    copy = source[100:200].copy()
    copy[::10] = -1
    segs = align(copy, source, min_span=8).segments
    assert segs == [(k + 1, k + 10, 100 + k + 1, 100 + k + 10) for k in range(0, 100, 10)]
    (p,) = passages(segs)
    assert (p.matched, p.unmatched) == (90, 9) and p.unmatched_share == pytest.approx(9 / 99)
    # two stretches far apart in the document are two passages, not one
    both = np.concatenate([source[0:40], source[200:240]])
    assert [(q.matched, q.unmatched) for q in passages(align(both, source, 8).segments)] == \
        [(40, 0), (40, 0)]


def test_ngram_index_finds_shared_spans_even_when_sampled(tmp_path):
    rng = np.random.default_rng(1)
    vocab = np.array([f"w{i}" for i in range(250)])
    docs = [" ".join(rng.choice(vocab, size=400)) for _ in range(50)]
    import pyarrow as pa

    uri = str(tmp_path / "t.lance")
    lance.write_dataset(pa.table({"id": pa.array(range(50), pa.int64()),
                                  "text": pa.array(docs)}), uri)
    ds = lance.dataset(uri)
    quoted = " ".join(docs[17].split()[100:300]).upper().replace(" ", "\n  ")
    query = text_words(" ".join(rng.choice(vocab, 50)) + " " + quoted + " " +
                       " ".join(rng.choice(vocab, 50))).values
    full = build_ngram_index(ds, None, n=16)
    sampled = build_ngram_index(ds, None, n=16, max_ngrams=len(full.hashes) // 8)
    assert full.sample_mod == 1 and sampled.sample_mod >= 8
    assert len(sampled.hashes) < len(full.hashes) / 4
    for index in (full, sampled):
        assert index.candidates(query)[0][0] == 17
    assert len(ngram_hashes(np.arange(10), 16)) == 0 and len(ngram_hashes(np.arange(20), 16)) == 5


def chunked_table(tmp_path, rows=600):
    root = tmp_path / "data"
    ingest(Table.of(root), f"synthetic:{rows}", rows_per_fragment=200, log=quiet)
    return root


def test_chunk_column_is_checkpointed_resumable_and_holds_one_chunking(tmp_path):
    root = chunked_table(tmp_path)
    uri = paths.table_uri(root)
    text_files = data_files_by_field(lance.dataset(uri), "text")
    with pytest.raises(KeyboardInterrupt):  # killed while embedding the second fragment
        produce(chunks.PRODUCER, Table.of(root),
                chunks.ChunkEmbeddingsSettings(chunk_tokens=32, overlap_tokens=8,
                                               embedder=ClusteredEmbedder(fail_after_calls=2)),
                log=quiet)
    ds = lance.dataset(uri)
    assert ds.count_rows("chunk_embeddings IS NOT NULL") == 200
    report = produce(chunks.PRODUCER, Table.of(root),
                     chunks.ChunkEmbeddingsSettings(chunk_tokens=32, overlap_tokens=8,
                                                    embedder=ClusteredEmbedder()),
                     log=quiet)
    assert report.fragments_already_done == 1 and len(report.fragments_written) == 2
    assert report.chunks_reused == 0  # no `embedding` column: every chunk embedded
    ds = lance.dataset(uri)
    assert ds.count_rows("chunk_embeddings IS NULL") == 0
    assert data_files_by_field(ds, "text") == text_files
    spec = chunks.table_chunk_spec(ds)
    assert (spec.chunk_tokens, spec.overlap_tokens, spec.window, spec.stride) == (32, 8, 30, 22)
    rows = ds.to_table(columns=["text", "chunk_embeddings"]).to_pylist()
    spans = chunks.shared_chunker(spec).spans([r["text"] for r in rows])
    stand_in = ClusteredEmbedder()
    for row, row_spans in zip(rows[::97], spans[::97]):
        assert len(row["chunk_embeddings"]) == len(row_spans) > 1
        want = stand_in.encode([row["text"][a:b] for a, b in row_spans])
        assert np.allclose(np.asarray(row["chunk_embeddings"]), want)  # chunk i is text span i
    again = produce(chunks.PRODUCER, Table.of(root),
                    chunks.ChunkEmbeddingsSettings(chunk_tokens=32, overlap_tokens=8), log=quiet)
    assert again.nothing_to_do and again.model_load_s == 0 and again.device == ""
    with pytest.raises(embed.EmbeddingMismatchError, match="chunk_tokens=32, overlap_tokens=8"):
        produce(chunks.PRODUCER, Table.of(root), chunks.ChunkEmbeddingsSettings(embedder=ClusteredEmbedder()),
                log=quiet)
    with pytest.raises(ValueError, match="overlap_tokens=40"):
        chunks.ChunkSpec(chunk_tokens=32, overlap_tokens=40)


def test_first_chunk_is_copied_from_embedding_when_the_window_is_the_same(tmp_path):
    root = chunked_table(tmp_path, rows=200)
    produce(embed.PRODUCER, Table.of(root),
            embed.EmbeddingsSettings(max_tokens=32, embedder=ClusteredEmbedder()), log=quiet)
    stand_in = ClusteredEmbedder()
    report = produce(chunks.PRODUCER, Table.of(root),
                     chunks.ChunkEmbeddingsSettings(chunk_tokens=32, overlap_tokens=8, embedder=stand_in),
                     log=quiet)
    assert report.chunks_reused == 200
    rows = lance.dataset(paths.table_uri(root)).to_table(
        columns=["embedding", "chunk_embeddings"]).to_pylist()
    assert all(r["chunk_embeddings"][0] == r["embedding"] for r in rows)
    assert report.chunks_embedded == sum(len(r["chunk_embeddings"]) - 1 for r in rows)
    # another window: the first chunk is not the document's vector, so it is embedded
    other = chunked_table(tmp_path / "other", rows=200)
    produce(embed.PRODUCER, Table.of(other),
            embed.EmbeddingsSettings(max_tokens=32, embedder=ClusteredEmbedder()), log=quiet)
    assert produce(chunks.PRODUCER, Table.of(other),
                   chunks.ChunkEmbeddingsSettings(chunk_tokens=48,
                                                  embedder=ClusteredEmbedder()), log=quiet).chunks_reused == 0


def test_chunk_index_recall_is_measured_against_exact_maxsim(tmp_path):
    root = chunked_table(tmp_path, rows=1500)
    produce(chunks.PRODUCER, Table.of(root),
            chunks.ChunkEmbeddingsSettings(chunk_tokens=48, overlap_tokens=8, embedder=ClusteredEmbedder()),
            log=quiet)
    report = vindex.vector_index(Table.of(root), recall_queries=40, target=vindex.CHUNKS)
    s = report.settings
    assert report.action == "created" and s.index_type == "IVF_HNSW_SQ"
    assert s.recall_queries == 40 and s.recall_at_10 >= 0.9
    ds = lance.dataset(paths.table_uri(root))
    assert vindex.has_index(ds, vindex.CHUNKS) and not vindex.has_index(ds)
    assert vindex.current_settings(ds, vindex.CHUNKS) == s and vindex.current_settings(ds) is None
    # a query vector scores a row by its best chunk: each row's own chunks find it first
    rows = ds.to_table(columns=["id", "chunk_embeddings"], limit=5).to_pylist()
    for row in rows:
        last = np.asarray(row["chunk_embeddings"][-1], np.float32)
        assert vindex.knn_ids(ds, last, 3, s, target=vindex.CHUNKS)[0][0] == row["id"]
    assert vindex.vector_index(Table.of(root), target=vindex.CHUNKS).action == "up_to_date"
    with pytest.raises(RuntimeError, match="materialize `embeddings` first"):
        vindex.vector_index(Table.of(root))
