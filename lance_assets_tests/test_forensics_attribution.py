"""Attribution, hybrid search and the forensics assets on a small corpus with the real embedding
model: a planted document quoted inside unrelated text is found at rank 1. The table has the
document `embedding` only (no `chunk_embeddings`): meaning falls back to document vectors."""

import json

import dagster as dg
import lance
import numpy as np
import pytest

from lance_assets import paths
from lance_assets.curation import dedup_flag
from lance_assets.embeddings import embeddings as embed
from lance_assets.embeddings.vector_index import vector_index
from lance_assets.forensics import text_index as fts
from lance_assets.forensics.__main__ import main as cli
from lance_assets.forensics.attribution import Attributor
from lance_assets.forensics.near_dups import semantic_near_dups
from lance_assets.forensics.pinned import resolve_pin
from lance_assets.forensics.search import MissingInputError, Searcher
from lance_assets.ingest.raw_text import ingest
from lance_assets.table import Table
from lance_assets.table.producer import produce
from lance_assets_tests.helpers import quiet

MAX_TOKENS = 32  # short inputs keep the test's embedding pass to seconds on 2 CPU cores

PLANTED = (
    "The lighthouse keeper on Varrow Island logged every storm in a green ledger: wind from the "
    "north-west, barometer falling, two fishing boats sheltering in the lee of the breakwater. "
    "In 1911 the ledger records a waterspout that lifted the harbour crane and set it down, "
    "unharmed, on the roof of the customs house. The keeper's daughter, Ilse Marrow, later "
    "catalogued the ledgers and found that the island's worst storms arrived, almost without "
    "exception, in the second week of October, a pattern she attributed to the warm current "
    "that swings past the headland each autumn.")
UNRELATED_HEAD = (
    "My grandmother kept bees behind the railway cutting, and every summer she sold honey from "
    "a folding table by the gate, next to a tin for coins and a hand-lettered price card. ")
UNRELATED_TAIL = (
    " None of this mattered much to the bees, which went on working the clover and the lime "
    "trees regardless of the weather, the timetable or the price of sugar in town.")


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    """400 synthetic documents, then (a later version) the planted one and 3 others; embeddings,
    the full-text index and the vector index (exact: a tiny table)."""
    root = tmp_path_factory.mktemp("forensics") / "data"
    ingest(Table.of(root), "synthetic:400", rows_per_fragment=200, log=quiet)
    before_plant = lance.dataset(paths.table_uri(root)).version
    extra = root.parent / "planted.jsonl"
    extra.write_text("".join(json.dumps({"text": t}) + "\n" for t in [
        "Brewing tea: warm the pot, one spoon per cup, water just off the boil, four minutes.",
        PLANTED,
        "The ferry timetable changes in winter: two sailings a day, none on Sundays.",
        "Knitting a sock starts at the cuff; the heel is turned with short rows."]))
    ingest(Table.of(root), str(extra), log=quiet)
    produce(dedup_flag.PRODUCER, Table.of(root), log=quiet)
    embedder = embed.shared_embedder(MAX_TOKENS)
    report = produce(embed.PRODUCER, Table.of(root),
                     embed.EmbeddingsSettings(max_tokens=MAX_TOKENS, embedder=embedder), log=quiet)
    fts.text_index(Table.of(root))
    index = vector_index(Table.of(root))
    ds = lance.dataset(paths.table_uri(root))
    planted = ds.to_table(filter="text LIKE 'The lighthouse keeper%'",
                          columns=["id"]).to_pylist()[0]
    return {"root": root, "embedder": embedder, "report": report, "index": index,
            "planted_id": planted["id"], "before_plant": before_plant}


def quote_200_chars(corpus) -> str:
    return UNRELATED_HEAD + PLANTED[120:320] + UNRELATED_TAIL  # from the middle of the document


def test_embeddings_are_unit_vectors_that_mean_something(corpus):
    ds = lance.dataset(paths.table_uri(corpus["root"]))
    assert ds.schema.field("embedding").type == embed.EMBEDDING.type
    assert corpus["report"].rows_written == 404 and ds.count_rows("embedding IS NULL") == 0
    vecs = corpus["embedder"].encode(["The telescope observed a distant galaxy.",
                                      "Astronomers watched a far-away star system.",
                                      "Knit the heel of the sock with short rows."])
    assert vecs.shape == (3, 384) and np.allclose(np.linalg.norm(vecs, axis=1), 1, atol=1e-4)
    assert vecs[0] @ vecs[1] > vecs[0] @ vecs[2] + 0.2
    assert embed.table_embedding_spec(ds).max_tokens == MAX_TOKENS
    # a small table gets an exact search, and says so
    assert corpus["index"].settings.index_type == "FLAT" and corpus["index"].action == "flat"


def test_quoted_planted_document_is_attributed_at_rank_1(corpus):
    att = Attributor(Table.of(corpus["root"]), embedder=corpus["embedder"], log=quiet)
    result = att.attribute(quote_200_chars(corpus), k=5)
    top = result.sources[0]
    assert top.id == corpus["planted_id"] and result.meaning == "document"
    assert top.longest_span_chars >= 190 and top.longest_span_words >= 30
    assert "ngram" in top.found_by and "vector" in top.found_by
    assert result.verdict == "near-verbatim" and str(top.id) in result.reason
    assert top.span in PLANTED and top.span in top.snippet
    (t0, t1), (d0, d1) = top.matches[0]["text"], top.matches[0]["doc"]
    assert len(top.matches) == 1 and t1 - t0 == d1 - d0  # same layout: same length
    assert quote_200_chars(corpus)[t0:t1] == PLANTED[d0:d1] == top.span
    assert all(s.longest_span_words < 15 for s in result.sources[1:])


def test_meaning_from_chunks_is_refused_where_there_are_none(corpus):
    with pytest.raises(MissingInputError, match="materialize `chunk_embeddings`"):
        Attributor(Table.of(corpus["root"]), meaning="chunks", log=quiet)
    with pytest.raises(ValueError, match="meaning='words'"):
        Attributor(Table.of(corpus["root"]), meaning="words", log=quiet)
    words_only = Attributor(Table.of(corpus["root"]), meaning="none", log=quiet)
    result = words_only.attribute(quote_200_chars(corpus), k=3)
    assert result.meaning == "none" and result.sources[0].id == corpus["planted_id"]
    assert result.sources[0].cosine is None and result.sources[0].found_by == ["ngram"]


def test_template_text_is_remixed_not_verbatim(corpus):
    att = Attributor(Table.of(corpus["root"]), embedder=corpus["embedder"], log=quiet)
    text = ("Students often ask why the comet does not rotate when the moon is faint. The bright "
            "planet can reflect the star. Scientists measure how a galaxy and a nebula interact.")
    result = att.attribute(text, k=5)
    assert result.verdict == "remixed"
    assert all(s.passage_words < 20 for s in result.sources)
    assert result.sources[0].cosine > 0.5  # an astronomy document, found by meaning


def test_rows_after_the_pinned_version_are_not_training_documents(corpus):
    """A model that trained on the table before the planted document could not have seen it."""
    pin = resolve_pin(Table.of(corpus["root"]), version=corpus["before_plant"])
    result = Attributor(Table.of(corpus["root"]), pin, embedder=corpus["embedder"], log=quiet).attribute(
        quote_200_chars(corpus), k=5)
    assert corpus["planted_id"] not in {s.id for s in result.sources}
    assert result.verdict == "remixed"


def test_hybrid_search_fuses_bm25_and_vectors(corpus):
    searcher = Searcher(Table.of(corpus["root"]), embedder=corpus["embedder"])
    res = searcher.search("lighthouse keeper storm ledger", k=5)
    hit = res.hits[0]
    assert hit.id == corpus["planted_id"] and hit.vector_rank == 1 and hit.text_rank == 1
    assert hit.score == pytest.approx(2 / 61, rel=1e-4)  # RRF, rank 1 in both lists
    assert "lighthouse" in hit.snippet.lower()
    vec = searcher.search("a quiet place to drink tea", k=3, mode="vector")
    assert "tea" in vec.hits[0].snippet.lower() and vec.hits[0].bm25 is None
    txt = searcher.search("ferry timetable", k=3, mode="text")
    assert "ferry" in txt.hits[0].snippet.lower() and txt.hits[0].vector_rank is None


def test_semantic_near_dups_separate_what_dedup_already_flagged(corpus):
    ds = lance.dataset(paths.table_uri(corpus["root"]))
    flagged = set(ds.to_table(columns=["id"], filter="is_dup").column("id").to_pylist())
    assert flagged  # the synthetic corpus has exact duplicates: cosine 1 with their original
    nd = semantic_near_dups(Table.of(corpus["root"]), threshold=0.9, sample=300, top=5)
    assert nd.sample_rows == 300 and nd.pairs == 300 * 299 // 2 and nd.flags == ["is_dup"]
    assert 0 < nd.pairs_above_unflagged < nd.pairs_above
    assert nd.pair_rate == pytest.approx(nd.pairs_above / nd.pairs, abs=1e-6)
    cosines = [p["cosine"] for p in nd.closest]
    assert cosines == sorted(cosines, reverse=True) and cosines[0] >= 0.9
    assert not {p["id_a"] for p in nd.closest} & flagged
    assert not {p["id_b"] for p in nd.closest} & flagged


def test_cli_search_and_attribute(corpus, tmp_path, capsys):
    assert cli(["search", "ferry timetable", "--mode", "text", "--k", "3", "--json",
                "--data", str(corpus["root"])]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["hits"][0]["snippet"].lower().count("ferry") and {"id", "score", "snippet"} <= set(
        out["hits"][0])
    text_file = tmp_path / "generated.txt"
    text_file.write_text(quote_200_chars(corpus))
    assert cli(["attribute", "--text-file", str(text_file), "--k", "3", "--json",
                "--data", str(corpus["root"])]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["sources"][0]["id"] == corpus["planted_id"] and out["verdict"] == "near-verbatim"


def test_forensics_asset_reports_every_sample(corpus):
    from lance_assets.definitions import defs
    from lance_assets.defs.resources import LanceStore

    root = corpus["root"]
    # a model run pinned to the current version, and two samples: one quoting the planted doc
    run = root / "train" / "r1"
    run.mkdir(parents=True)
    version = lance.dataset(paths.table_uri(root)).version
    (run / "summary.json").write_text(json.dumps({"checkpoint": str(run / "ckpt_0000001.pt"),
                                                  "table_version": version, "filter": "true"}))
    paths.latest_checkpoint_pointer(root).write_text(str(run / "ckpt_0000001.pt"))
    quote = quote_200_chars(corpus)
    samples = [{"prompt": "", "completion": quote, "token_ids": list(quote.encode())},
               {"prompt": "The bright", "completion": " star can orbit the moon.",
                "token_ids": list(b" star can orbit the moon.")}]
    paths.samples_dir(root).mkdir(parents=True, exist_ok=True)
    (paths.samples_dir(root) / "samples.json").write_text(json.dumps(
        {"checkpoint": str(run / "ckpt_0000001.pt"), "samples": samples}))
    result = dg.materialize(
        [defs.get_assets_def(k) for k in ("embeddings", "vector_index", "forensics")],
        resources={"lance_store": LanceStore(data_dir=str(root))},
        run_config={"ops": {"embeddings": {"config": {"max_tokens": MAX_TOKENS}},
                            "forensics": {"config": {"near_dup_threshold": 0.9}}}})
    assert result.success
    emb = {k: v.value for k, v in result.asset_materializations_for_node("embeddings")[0].metadata.items()}
    assert emb["nothing_to_do"] and emb["rows_written"] == 0
    idx = {k: v.value for k, v in result.asset_materializations_for_node("vector_index")[0].metadata.items()}
    assert idx["index_type"] == "FLAT" and "exact" in idx["search"] and idx["recall_at_10"] == 1.0
    meta = {k: v.value for k, v in result.asset_materializations_for_node("forensics")[0].metadata.items()}
    assert meta["lance/table_version"] == version and "trained on" in meta["pinned"]
    assert meta["samples"] == 2 and meta["verdicts"] == {"near-verbatim": 1, "remixed": 1}
    assert f"| 1 | {corpus['planted_id']} |" in meta["report"]
    assert "Semantic near-duplicates" in meta["report"] and 0 <= meta["near_dup_pair_rate"] < 1
    assert "dedup did not flag" in meta["report"]
    assert (root / "reports" / "forensics.md").is_file()
