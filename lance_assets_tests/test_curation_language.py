"""Detected language (`lang`, `lang_score`): accuracy on the labelled multilingual sample, hostile
inputs, the incremental column write, and the default rule that keeps the corpus's main
languages."""

import lance
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from lance_assets import paths
from lance_assets.curation import detected_language as language
from lance_assets.curation import rules
from lance_assets.ingest.raw_text import ingest
from lance_assets.table import data_files_by_field
from lance_assets.testing.multilingual import SENTENCES, documents
from lance_assets_tests.helpers import quiet


@pytest.mark.parametrize("kind,minimum", [("paragraph", 0.99), ("short", 0.95)])
def test_detects_the_labelled_sample(kind, minimum):
    docs = documents(kind)
    got = language.detect(pa.array([t for t, _ in docs])).to_pydict()
    right = sum(g == want for g, (_, want) in zip(got["lang"], docs))
    assert right / len(docs) >= minimum, [(w, g) for g, (_, w) in zip(got["lang"], docs) if g != w]
    assert all(0 < s <= 1 for s, g in zip(got["lang_score"], got["lang"]) if g != "und")


def test_hostile_inputs_get_a_value_and_never_stop_the_batch():
    huge = "The river flows past the old mill and the children play on its banks. " * 20_000
    texts = [None, "", "   \n\t", "\x00\x01\x02 binary \x7f\x9f bytes \x1b[31m",
             "\ufffd\ufffd\ufffd", "1234 5678 90", huge,
             # mixed scripts: mostly Russian with an English clause
             SENTENCES["ru"][0] + " " + SENTENCES["ru"][3] + " The end.",
             "".join(chr(c) for c in range(0x20, 0x2FF))]
    got = language.detect(pa.array(texts, pa.string())).to_pydict()
    assert len(got["lang"]) == len(texts)
    assert got["lang"][:3] == ["und"] * 3 and got["lang_score"][:3] == [0.0] * 3
    assert got["lang"][5] == "und"
    assert got["lang"][6] == "en" and got["lang"][7] == "ru"


def test_column_write_is_incremental_and_leaves_text_alone(tmp_path):
    root = tmp_path / "data"
    src = tmp_path / "src"
    src.mkdir()
    paragraphs = documents("paragraph")
    pq.write_table(pa.table({"text": [t for t, _ in paragraphs]}), src / "a.parquet")
    ingest(root, str(src), rows_per_fragment=50, log=quiet)
    uri = paths.table_uri(root)
    text_files = data_files_by_field(lance.dataset(uri), "text")
    report = language.language_id(root, fragments_per_commit=2, log=quiet)
    assert report.rows_written == len(paragraphs) and report.commits == 2
    ds = lance.dataset(uri)
    assert data_files_by_field(ds, "text") == text_files
    assert ds.to_table(columns=["lang"]).column(0).to_pylist() == [lang for _, lang in paragraphs]
    assert language.language_id(root, log=quiet).nothing_to_do
    pq.write_table(pa.table({"text": [SENTENCES["fr"][0] * 3]}), src / "b.parquet")
    ingest(root, str(src), rows_per_fragment=50, log=quiet)
    more = language.language_id(root, log=quiet)
    assert more.rows_written == 1 and more.fragments_already_done == 3


def test_the_default_rule_keeps_the_main_languages(tmp_path):
    """70 English, 20 French, 10 German documents: with a 15% minimum share the main languages
    are English and French, and the rule removes exactly the German ones."""
    root = tmp_path / "data"
    src = tmp_path / "src"
    src.mkdir()
    docs = ([(t, "en") for t, lang in documents("paragraph", seed=1) if lang == "en"] * 7
            + [(t, "fr") for t, lang in documents("paragraph", seed=2) if lang == "fr"] * 2
            + [(t, "de") for t, lang in documents("paragraph", seed=3) if lang == "de"])
    pq.write_table(pa.table({"text": [t + f" ({i})" for i, (t, _) in enumerate(docs)]}),
                   src / "mixed.parquet")
    ingest(root, str(src), log=quiet)
    ds = lance.dataset(paths.table_uri(root))
    added, notes = rules.tagger_rules(ds)
    assert added == {} and "not computed yet" in notes[0]

    language.language_id(root, log=quiet)
    ds = lance.dataset(paths.table_uri(root))
    assert language.main_languages(ds, 0.15) == ["en", "fr"]
    assert language.main_languages(ds, 0.5) == ["en"]
    added, _ = rules.tagger_rules(ds, main_language_min_share=0.15)
    assert added == {"main_language": "lang IN ('en', 'fr')"}
    assert ds.count_rows(filter=rules.validate(ds, added)) == 90

    explicit, _ = rules.tagger_rules(ds, keep_languages=["de"])
    assert ds.count_rows(filter=rules.validate(ds, explicit)) == 10
    assert rules.tagger_rules(ds, keep_languages=[])[0] == {}
    with pytest.raises(rules.RuleError, match="not language codes"):
        rules.tagger_rules(ds, keep_languages=["en') OR (1=1"])

