"""FineWeb's rule set decides as datatrove's filters do, without datatrove: hand-checked
documents (markup, RST underlines, blank lines, bullets, ellipsis lines, repeated n-grams) with
the rules each must fail, worked out from datatrove's code; spaCy's word split on the cases that
move the decisions; the rule set picked by name puts `fineweb_signals` on the path to training."""

from __future__ import annotations

import json

import lance
import pyarrow as pa
import pytest

from lance_assets import paths
from lance_assets.curation import rules
from lance_assets.fineweb import fineweb_signals, web_words
from lance_assets.ingest.raw_text import ingest
from lance_assets.table import Table
from lance_assets.table.producer import produce, producers
from lance_assets_tests.helpers import quiet

PROSE_LINES = [
    "The river runs past the old mill and the town.",
    "Children walk to school along the bank with their dogs.",
    "In spring the water rises and covers the low fields.",
    "Farmers have learned to plant later in the year.",
    "That is why the harvest comes in late October.",
    "Visitors often stop to watch the boats go by.",
]
PROSE = "\n".join(PROSE_LINES)  # 57 words and 6 full stops, 6 sentences, 5 distinct stop words

# document -> the rules of RULE_SETS["fineweb"] it fails, from datatrove's definitions
# (spaCy words: every punctuation mark is a word; lines: splitlines for Gopher quality and C4,
# \n+ for Gopher repetition; FineWeb's ratios on the text C4 hands on)
DOCS: dict[str, tuple[str, set[str]]] = {
    "prose": (PROSE, set()),
    # an underline of 40 '=' is 40 words: 58 of 104 words have a letter (< 0.8); the 2-gram
    # "= =" 39 times x 3 characters is 0.33 of the 352 characters (> 0.2)
    "rst_underline": ("Installation\n" + "=" * 40 + "\n\n" + PROSE,
                      {"gopher_quality_alpha_words", "gopher_repetition_top_ngrams"}),
    # FineWeb drops blank lines before its line ratios, and C4's hand-on text has none
    "blank_lines": ("\n\n\n\n".join(PROSE_LINES), set()),
    # Gopher's bullets are '•' and '-' only: all 6 lines are '-' bullets (> 0.9), '*' is none
    "dash_bullets": ("\n".join(f"- {line}" for line in PROSE_LINES),
                     {"gopher_quality_bullet_lines"}),
    "star_bullets": ("\n".join(f"* {line}" for line in PROSE_LINES), set()),
    # every line ends with '...' (> 0.3); 6 ellipses among 63 words is under 0.1
    "ellipsis_lines": ("\n".join(line[:-1] + "..." for line in PROSE_LINES),
                       {"gopher_quality_ellipsis_lines"}),
    # '#tag' is 2 words: 12 '#' among 87 words (> 0.1), 69 of 87 with a letter (< 0.8); the
    # 3-gram "# tag #" 11 times x 7 characters is 0.22 of the text (> 0.18); 5-grams repeat
    "hashes": (PROSE + "\n" + " ".join(["#tag"] * 12),
               {"gopher_quality_symbol_word_ratio", "gopher_quality_alpha_words",
                "gopher_repetition_top_ngrams", "gopher_repetition_dup_ngrams"}),
    # the first sentence 4 more times: its 4-grams 5 times (> 0.16), 5-grams repeated
    "repeated_sentence": (PROSE + "\n" + " ".join([PROSE_LINES[0]] * 4),
                          {"gopher_repetition_top_ngrams", "gopher_repetition_dup_ngrams"}),
    # paragraphs on \n{2,}: the prose, then one line 3 times: 2 of 4 repeat (> 0.3); lines
    # on \n+ likewise; FineWeb: 2 repeated lines of 55 characters, over 1% of the characters
    "repeated_paragraph": (PROSE + "\n\n" + "\n\n".join([PROSE_LINES[1]] * 3),
                           {"gopher_repetition_dup_paragraphs", "gopher_repetition_dup_lines",
                            "gopher_repetition_dup_ngrams", "fineweb_dup_line_chars"}),
    # one line again: 1 of 7 lines (<= 0.3), but 10-grams repeat over 0.1 of the characters,
    # and FineWeb's 1% of repeated line characters
    "repeated_line": (PROSE + "\n" + PROSE_LINES[2],
                      {"gopher_repetition_dup_ngrams", "fineweb_dup_line_chars"}),
    # C4 reads a line with 3+ words: 'lorem ipsum' on a 2-word line is not read
    "lorem_ipsum": (PROSE + "\nLorem ipsum dolor sit amet.", {"c4_lorem_ipsum"}),
    "lorem_ipsum_short_line": (PROSE + "\nLorem ipsum", set()),
    # a line with 'javascript' is dropped before C4 looks for '{'
    "curly_bracket": (PROSE + "\nThe settings are {debug: true} here.", {"c4_curly_bracket"}),
    "curly_in_javascript_line": (PROSE + "\nIn JavaScript write {debug: true} here.", set()),
    # one line, commas for full stops: 1 sentence (< 5); 44 words with letters (< 50)
    "few_sentences": (" ".join(PROSE_LINES[:4]).replace(".", ",") + " and then some more words.",
                      {"c4_sentences", "gopher_quality_word_count"}),
    # stop words are matched case-sensitively: 'The', 'And', 'To' ... are none of them
    "capitalised_stop_words": (PROSE.replace(" the ", " The ").replace(" and ", " And ")
                               .replace(" with ", " With ").replace(" to ", " To ")
                               .replace(" have ", " Have ").replace("That ", "Which "),
                               {"gopher_quality_stop_words"}),
    # C4 drops the 2-word lines ('Yes, indeed.'), so FineWeb never sees them; 4-word short
    # lines it keeps: 14 of 20 lines of at most 30 characters (> 0.67)
    "short_lines": (PROSE + "\n" + "\n".join(f"Line {i} is short." for i in range(14)),
                    {"fineweb_short_lines", "gopher_quality_alpha_words",
                     "gopher_repetition_top_ngrams"}),
    "two_word_lines": (PROSE + "\n" + "\n".join(["Yes, indeed."] * 14),
                       {"gopher_repetition_dup_lines", "gopher_repetition_top_ngrams",
                        "gopher_repetition_dup_ngrams", "gopher_quality_alpha_words"}),
    # no line ends in terminal punctuation (< 0.12); quotes are not terminal for FineWeb
    "no_terminal_punct": ("\n".join(line[:-1] for line in PROSE_LINES), {"fineweb_line_punct"}),
    "quoted_line_ends": ("\n".join(f'"{line[:-1]}"' for line in PROSE_LINES),
                         {"fineweb_line_punct"}),
    # 16 lines of 3 words: 15 newlines / 48 words (> 0.3)
    "three_word_lines": ("\n".join(f"we walk {w}" for w in "north south east west up down left "
                                   "right fast slow far near in out back forth".split()),
                         {"fineweb_newlines", "fineweb_line_punct", "fineweb_short_lines",
                          "gopher_quality_word_count", "gopher_quality_stop_words",
                          "gopher_repetition_top_ngrams"}),
    # HTML: '<p' and '>' are words; every line ends in '>' (FineWeb's line punctuation)
    "html_markup": ("\n".join(f'<p class="intro">{line}</p>' for line in PROSE_LINES),
                    {"fineweb_line_punct"}),
    # ' [1].': C4 removes the citation, the '[', '1', ']' words stay for Gopher
    "citations": ("\n".join(line[:-1] + " [1]." for line in PROSE_LINES),
                  {"gopher_quality_alpha_words"}),
}
FAMILY_RULES = [r for r in rules.FINEWEB_RULES if r not in ("exact_dup", "near_dup")]


def test_fineweb_rules_decide_the_hand_checked_documents(tmp_path):
    # through the column write and Lance's filter, as training applies the rules
    src = tmp_path / "docs.jsonl"
    src.write_text("".join(json.dumps({"text": text}) + "\n" for text, _ in DOCS.values()))
    root = tmp_path / "data"
    ingest(Table.of(root), str(src), log=quiet)
    produce(fineweb_signals.PRODUCER, Table.of(root), log=quiet)
    ds = lance.dataset(paths.table_uri(root))
    name_of = {text: name for name, (text, _) in DOCS.items()}
    all_docs = set(DOCS)
    failed: dict[str, set[str]] = {name: set() for name in DOCS}
    for rule in FAMILY_RULES:
        predicate = rules.validate(ds, {rule: rules.FINEWEB_RULES[rule]})
        kept = {name_of[t] for t in ds.to_table(columns=["text"], filter=predicate)
                .column("text").to_pylist()}
        for name in all_docs - kept:
            failed[name].add(rule)
    assert failed == {name: expected for name, (_, expected) in DOCS.items()}


def test_an_empty_document_fails_every_family():
    got = fineweb_signals.compute_signals(pa.array(["", PROSE])).to_pydict()
    assert got["fw_lines"] == [0, 6] and got["gq_word_count"] == [0, 57]
    assert got["c4_sentences"] == [0, 6] and got["gq_stop_words"] == [0, 5]
    # Gopher repetition reads `n_chars > 0` (a raw column) for datatrove's "empty"
    assert rules.FINEWEB_RULES["gopher_repetition_not_empty"] == "n_chars > 0"


@pytest.mark.parametrize("text,words", [
    ("don't stop", ["do", "n't", "stop"]),  # contractions split (special cases)
    ("foo(bar) x", ["foo(bar", ")", "x"]),  # '(' inside a chunk is no split point
    ("=====", ["="] * 5),  # an underline is a word per mark
    ("well-known U.S. 3.5", ["well", "-", "known", "U.S.", "3.5"]),
    ("see https://example.com/a?b=1.", ["see", "https://example.com/a?b=1", "."]),
    ("f(x):", ["f(x", "):"]),  # an emoticon special case cut by the affixes, merged again
    ("end.Next", ["end", ".", "Next"]),
    ("#tag...", ["#", "tag", "..."]),
])
def test_words_split_as_spacy_english_splits_them(text, words):
    assert web_words.split_words(text) == words
    got = web_words.words_of(pa.array([text]))
    assert got.words.to_pylist() == words and set(got.parents.tolist()) == {0}


def test_the_fineweb_set_by_name_puts_its_signals_on_the_path_to_training(monkeypatch):
    # LANCE_ASSETS_RULES=fineweb: the rules the definitions start from, and so the producers
    # upstream of curation_rules (defs/curation/assets.py: RULE_DEPS, as a rules file's are in
    # test_training_path.py)
    monkeypatch.setenv(rules.RULES_ENV, "fineweb")
    configured = rules.configured_rules()
    assert configured == rules.FINEWEB_RULES
    writers = {f.name: p.name for p in producers() for f in p.fields}
    assert {writers[c] for c in rules.rule_columns(configured, frozenset(writers))} == {
        "fineweb_signals", "dedup_flag", "near_dup"}
    for family in rules.FAMILIES:  # every family has rules, named after it
        assert rules.family_rules(rules.FINEWEB_RULES, family)
    assert sum(len(rules.family_rules(rules.FINEWEB_RULES, f)) for f in rules.FAMILIES) == \
        len(rules.FINEWEB_RULES) - 2  # all but exact_dup and near_dup
