"""Attribution of passages a model re-flowed, re-wrapped or edited, taken from the second half of
long documents (the part the document-level `embedding` never reads), on a table of 20 long
technical documents with the real model: `embedding`, `chunk_embeddings` and both indexes."""

import json
import re

import lance
import numpy as np
import pytest

from lance_assets import paths
from lance_assets.embeddings import chunk_embeddings as chunks
from lance_assets.embeddings import embeddings as embed
from lance_assets.embeddings import onnx_backend
from lance_assets.embeddings import vector_index as vindex
from lance_assets.forensics.__main__ import main as cli
from lance_assets.forensics.attribution import PASSAGE_MIN_WORDS, Attributor
from lance_assets.ingest.raw_text import ingest
from lance_assets.table import Table
from lance_assets.table.producer import produce
from lance_assets.testing import longdocs
from lance_assets_tests.helpers import quiet

DOCS = 20
PASSAGE_WORDS = 60
SOURCES = (2, 9, 15)  # documents quoted by the layout tests


def normalised(text: str) -> list[str]:
    """The words the attribution compares, spelled out (for checking reported ranges)."""
    return re.findall(r"[a-z0-9\u0080-\U0010ffff]+", text.lower())


@pytest.fixture(scope="module")
def table(tmp_path_factory):
    base = tmp_path_factory.mktemp("reformatted")
    root = base / "data"
    docs = longdocs.corpus(DOCS)
    (base / "docs.jsonl").write_text("".join(json.dumps({"text": t}) + "\n" for t in docs))
    ingest(Table.of(root), str(base / "docs.jsonl"), rows_per_fragment=8, log=quiet)
    produce(embed.PRODUCER, Table.of(root), log=quiet)
    report = produce(chunks.PRODUCER, Table.of(root), log=quiet)
    vindex.vector_index(Table.of(root))
    vindex.vector_index(Table.of(root), target=vindex.CHUNKS)
    ds = lance.dataset(paths.table_uri(root))
    rows = ds.to_table(columns=["id", "text"]).to_pylist()
    id_of = {r["text"]: r["id"] for r in rows}
    return {"root": root, "docs": docs, "ids": [id_of[t] for t in docs], "report": report,
            "attributor": Attributor(Table.of(root), log=quiet)}


def second_half_passage(table, i: int) -> str:
    return longdocs.passage(table["docs"][i], PASSAGE_WORDS, at=0.7)


def test_chunk_embeddings_cover_the_whole_document_and_reuse_the_first(table):
    ds = lance.dataset(paths.table_uri(table["root"]))
    spec = chunks.table_chunk_spec(ds)
    assert spec == chunks.ChunkSpec(backend=onnx_backend.resolve("auto", "cpu"))  # queries alike
    rows = ds.to_table(columns=["text", "embedding", "chunk_embeddings"]).to_pylist()
    spans = chunks.shared_chunker(spec).spans([r["text"] for r in rows])
    for row, row_spans in zip(rows, spans):
        vecs = np.asarray(row["chunk_embeddings"], np.float32)
        assert len(vecs) == len(row_spans) >= 8  # ~1,200 words: many chunks
        assert np.allclose(np.linalg.norm(vecs, axis=1), 1, atol=1e-4)
        assert np.array_equal(vecs[0], np.asarray(row["embedding"], np.float32))  # copied
        assert row_spans[0][0] < 30 and row_spans[-1][1] >= len(row["text"].rstrip()) - 1
        # consecutive chunks overlap, so no passage falls between two of them
        assert all(b[0] < a[1] for a, b in zip(row_spans, row_spans[1:]))
    report = table["report"]
    assert report.chunks_reused == DOCS and report.rows_written == DOCS
    assert report.chunks_embedded == sum(len(s) for s in spans) - DOCS
    # a chunk of a document, embedded as a query would be, is the stored vector
    text = rows[4]["text"]
    start, end = spans[4][3]
    query_spans, qvecs = table["attributor"].query_chunks(text[start:end])
    assert len(query_spans) == 1
    assert float(qvecs[0] @ np.asarray(rows[4]["chunk_embeddings"][3], np.float32)) > 0.999


@pytest.mark.parametrize("variant", ["verbatim", "flattened", "rewrapped", "edited"])
def test_second_half_passage_ranks_its_source_first_whatever_its_layout(table, variant):
    for i in SOURCES:
        passage = second_half_passage(table, i)
        text = {"verbatim": passage,
                "flattened": longdocs.flattened(passage),
                "rewrapped": longdocs.rewrapped(passage, 37),
                "edited": longdocs.words_replaced(passage, 0.08, seed=i)}[variant]
        assert text != passage or variant == "verbatim"
        generated = longdocs.quoted(text)
        result = table["attributor"].attribute(generated, k=5)
        top = result.sources[0]
        assert top.id == table["ids"][i], (variant, i, result.reason)
        assert "ngram" in top.found_by and "vector" in top.found_by
        assert result.verdict == ("edited copy" if variant == "edited" else "near-verbatim"), \
            (variant, i, result.reason)
        assert top.score > 2 * result.sources[1].score
        # every match is a pair of character ranges holding the same words in both texts
        doc = table["docs"][i]
        assert top.matches
        for m in top.matches:
            (t0, t1), (d0, d1) = m["text"], m["doc"]
            assert normalised(generated[t0:t1]) == normalised(doc[d0:d1])
            assert len(normalised(doc[d0:d1])) == m["words"]
        if variant != "edited":  # the whole passage, one unbroken span
            assert top.longest_span_words == top.passage_words == len(normalised(passage))
            assert normalised(top.span) == normalised(passage)
        else:
            assert top.passage_words >= PASSAGE_MIN_WORDS and 0 < top.passage_unmatched <= 0.5


def test_meaning_over_chunks_finds_second_half_passages_the_document_vector_misses(table):
    """30% of the words replaced: few shared spans of 8 words are left, so this is the meaning
    evidence alone. The best chunk of the source is nearest; the document vector, which reads
    only the opening, is not."""
    att = table["attributor"]
    ds = lance.dataset(paths.table_uri(table["root"]))
    chunk_vecs = chunks.read_chunk_vectors(ds, table["ids"])
    doc_vecs = embed.read_embeddings(ds, table["ids"])
    by_chunks = by_document = 0
    for i in range(DOCS):
        text = longdocs.quoted(longdocs.words_replaced(second_half_passage(table, i), 0.3, i))
        _, qvecs = att.query_chunks(text)
        qdoc = att.embedder.encode([text])[0]
        chunk_cos = {r: float((qvecs @ v.T).max()) for r, v in chunk_vecs.items()}
        doc_cos = {r: float(v @ qdoc) for r, v in doc_vecs.items()}
        by_chunks += max(chunk_cos, key=chunk_cos.get) == table["ids"][i]
        by_document += max(doc_cos, key=doc_cos.get) == table["ids"][i]
    assert by_chunks >= 17 and by_chunks >= by_document + 5, (by_chunks, by_document)
    # and through the index, as attribution searches it: the source is a vector hit, ranked 1
    result = att.attribute(longdocs.quoted(
        longdocs.words_replaced(second_half_passage(table, 5), 0.3, 5)), k=5)
    top = result.sources[0]
    assert top.id == table["ids"][5] and "vector" in top.found_by and result.meaning == "chunks"
    chunk = top.closest_chunk
    doc = table["docs"][5]
    assert chunk is not None and chunk["cosine"] == top.cosine
    passage = second_half_passage(table, 5)
    start = doc.index(passage)
    overlap = min(chunk["doc"][1], start + len(passage)) - max(chunk["doc"][0], start)
    assert overlap >= 0.4 * len(passage)  # the chunk holding the passage


def test_short_pieces_of_many_documents_are_remixed(table):
    pieces, used = [], []
    for n, i in enumerate(range(0, DOCS, 2)):
        pieces.append(longdocs.flattened(longdocs.passage(table["docs"][i], 12, at=0.5 + n / 40)))
        used.append(table["ids"][i])
    result = table["attributor"].attribute(" ".join(pieces), k=10)
    assert result.verdict == "remixed", result.reason
    assert all(s.passage_words < PASSAGE_MIN_WORDS for s in result.sources)
    found = {s.id for s in result.sources if s.coverage > 0}
    assert len(found & set(used)) >= 7  # the pieces were found, each in its own document
    assert result.covered_share > 0.7


def test_cli_prints_the_matched_ranges_of_both_texts(table, tmp_path, capsys):
    passage = second_half_passage(table, 9)
    generated = longdocs.quoted(longdocs.rewrapped(passage, 50))
    text_file = tmp_path / "generated.txt"
    text_file.write_text(generated)
    assert cli(["attribute", "--text-file", str(text_file), "--k", "3",
                "--data", str(table["root"])]) == 0
    out = capsys.readouterr().out
    assert out.startswith("verdict: near-verbatim")
    found = re.search(r"^\s+1\. id (\d+) .*\n\s+text\[(\d+):(\d+)\] <-> doc\[(\d+):(\d+)\]", out,
                      re.M)
    assert found, out
    rid, t0, t1, d0, d1 = map(int, found.groups())
    assert rid == table["ids"][9]
    assert normalised(generated[t0:t1]) == normalised(table["docs"][9][d0:d1]) == \
        normalised(passage)
    assert cli(["attribute", "--text-file", str(text_file), "--k", "3", "--json",
                "--data", str(table["root"])]) == 0
    top = json.loads(capsys.readouterr().out)["sources"][0]
    assert top["matches"][0]["text"] == [t0, t1] and top["matches"][0]["doc"] == [d0, d1]
