"""FineWeb's four quality filters as columns: each statistic exactly as datatrove computes it.

``RULE_SETS["fineweb"]`` (``curation/rules.py``) reads these columns to keep what FineWeb's
pipeline keeps: ``GopherRepetitionFilter``, ``GopherQualityFilter``, ``C4QualityFilter`` as
FineWeb set it (no terminal punctuation filter) and ``FineWebQualityFilter``. The definitions
follow datatrove's code, not a paraphrase: words are spaCy's English tokens (``web_words``, every
punctuation mark a word), n-grams are case-sensitive, the top n-gram is the most frequent one,
repeated n-grams are counted by datatrove's greedy scan, line splits are Python's
(``splitlines`` for Gopher quality and C4, ``\\n+`` for Gopher repetition), and FineWeb's
filter reads the text as C4 hands it on (its kept lines, stripped, citations removed, blank
lines dropped). Ratios are float64 and divided as Python divides, so a threshold compares the
same number datatrove compares.

``quality_signals`` keeps the project's own definitions (its rule set, ``RULE_SETS["lance_assets"]``,
reads those); docs/curation.md lists every difference. Vectorised per batch like it: flat Arrow
arrays of lines and words with parent indices, counts by ``bincount``, repeats by sorting; the
one Python loop walks repeated n-grams in datatrove's greedy order.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from functools import lru_cache

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from lance_assets.curation.quality_signals import ngram_windows
from lance_assets.curation.quality_signals import repeats as _duplicates
from lance_assets.fineweb import web_words
from lance_assets.table.producer import ColumnProducer

# datatrove's constants (pipeline/filters/gopher_quality_filter.py, c4_filters.py)
STOP_WORDS = ["the", "be", "to", "of", "and", "that", "have", "with"]
CITATION_RE = r"\[\p{Nd}*\]|\[edit\]|\[citation needed\]"  # C4's CITATION_REGEX (\d: Unicode)
POLICY_SUBSTRINGS = ["terms of use", "privacy policy", "cookie policy", "uses cookies",
                     "use of cookies", "use cookies"]
C4_MIN_WORDS, C4_MAX_WORD = 3, 1000
SHORT_LINE = 30  # FineWeb's short_line_length
TOP_NGRAMS = (2, 3, 4)
DUP_NGRAMS = (5, 6, 7, 8, 9, 10)
# Python's str.splitlines boundaries and str.isspace characters, for RE2
LINE_BREAK = r"\r\n|[\n\r\x0b\x0c\x1c\x1d\x1e\x{85}\x{2028}\x{2029}]"
SPACE = r"[\t\n\x0b\x0c\r\x1c-\x1f\x{85}\p{Z}]"
SPACES = ("\t\n\x0b\x0c\r\x1c\x1d\x1e\x1f \x85\xa0\u1680" + "".join(map(chr, range(0x2000, 0x200b)))
          + "\u2028\u2029\u202f\u205f\u3000")  # str.isspace, for Arrow's trim
BATCH_ROWS = 2048

_F = pa.float64()
SIGNALS: list[tuple[str, pa.DataType, str]] = [
    ("gr_dup_para_share", _F, "paragraphs (split on \\n{2,} after strip) equal to an earlier one "
     "/ paragraphs [Gopher repetition, <= 0.3]"),
    ("gr_dup_para_char_share", _F, "characters of those paragraphs / characters [Gopher "
     "repetition, <= 0.2]"),
    ("gr_dup_line_share", _F, "lines (split on \\n+, blank pieces included) equal to an earlier "
     "one / lines [Gopher repetition, <= 0.3]"),
    ("gr_dup_line_char_share", _F, "characters of those lines / characters [Gopher repetition, "
     "<= 0.2]"),
    *[(f"gr_top_{n}gram_char_share", _F, f"characters of the most frequent word {n}-gram "
       f"(spaCy words, case-sensitive, joined by spaces) x its count / characters "
       f"[Gopher repetition, <= {lim}]") for n, lim in zip(TOP_NGRAMS, (0.2, 0.18, 0.16))],
    *[(f"gr_dup_{n}gram_char_share", _F, f"characters of repeated word {n}-grams found by "
       f"datatrove's greedy scan (a repeat skips its {n} words; words joined without spaces) / "
       f"characters [Gopher repetition, <= {lim}]")
      for n, lim in zip(DUP_NGRAMS, (0.15, 0.14, 0.13, 0.12, 0.11, 0.10))],
    ("gq_word_count", pa.int32(), "spaCy words with a character outside datatrove's punctuation "
     "[Gopher quality, 50..100,000]"),
    ("gq_mean_word_length", _F, "mean characters of those words [Gopher quality, 3..10]"),
    ("gq_symbol_word_ratio", _F, "max(count of '#', count of '...' and '…') / all spaCy words, "
     "punctuation included [Gopher quality, <= 0.1]"),
    ("gq_bullet_line_share", _F, "lines (splitlines) starting with '•' or '-' after leading "
     "spaces [Gopher quality, <= 0.9]"),
    ("gq_ellipsis_line_share", _F, "lines (splitlines) ending with '...' or '…' before trailing "
     "spaces [Gopher quality, <= 0.3]"),
    ("gq_alpha_word_share", _F, "spaCy words with a letter / all spaCy words [Gopher quality, "
     ">= 0.8]"),
    ("gq_stop_words", pa.int32(), "distinct stop words among the words (the, be, to, of, and, "
     "that, have, with; case-sensitive) [Gopher quality, >= 2]"),
    ("c4_lorem_ipsum_line", pa.bool_(), "a line C4 reads (3+ words, none over 1,000 characters) "
     "holds 'lorem ipsum', any case [C4, false]"),
    ("c4_curly_bracket_line", pa.bool_(), "such a line without 'javascript' holds '{' [C4, "
     "false]"),
    ("c4_sentences", pa.int32(), "sentences (spaCy's sentencizer) in the lines C4 keeps: 3+ "
     "words, none over 1,000 characters, no 'javascript', no cookie or terms-of-use phrase "
     "[C4, >= 5]"),
    ("fw_lines", pa.int32(), "non-blank lines of the text C4 hands on [FineWeb, > 0]"),
    ("fw_terminal_punct_line_share", _F, "of those lines, the share ending in terminal "
     "punctuation (datatrove's set: . ! ? and other scripts' stops; not quotes) [FineWeb, "
     ">= 0.12]"),
    ("fw_short_line_share", _F, f"of those lines, the share of at most {SHORT_LINE} "
     "characters [FineWeb, <= 0.67]"),
    ("fw_dup_line_char_share", _F, "characters of those lines equal to an earlier one / "
     "characters of the text C4 hands on, newlines excluded [FineWeb, <= 0.01]"),
    ("fw_newline_word_ratio", _F, "newlines / spaCy words of the text C4 hands on [FineWeb, "
     "<= 0.3]"),
]
FIELDS = [pa.field(name, t) for name, t, _ in SIGNALS]
SCHEMA = pa.schema(FIELDS)
COLUMNS = [f.name for f in FIELDS]
DESCRIPTIONS = {name: d for name, _, d in SIGNALS}


@lru_cache(maxsize=1)
def _punctuation() -> tuple[str, pa.Array]:
    """An RE2 class of datatrove's PUNCTUATION_SET's complement, and its TERMINAL_PUNCTUATION."""
    raw = json.loads(web_words.RULES_FILE.read_text(encoding="utf-8"))
    not_punct = "[^" + "".join(f"\\x{{{ord(c):x}}}" for c in raw["punctuation"]) + "]"
    return not_punct, pa.array(raw["terminal_punctuation"], pa.string())


def _np(arr) -> np.ndarray:
    return arr.to_numpy(zero_copy_only=False)


def _count(parents: np.ndarray, n: int, weights=None) -> np.ndarray:
    return np.bincount(parents, weights=weights, minlength=n)[:n]


def _ratio(num, den) -> np.ndarray:
    """num / den in float64 (Python's division), 0 where den is 0."""
    num = np.asarray(num, dtype=np.float64)
    den = np.asarray(den, dtype=np.float64)
    out = np.zeros(len(num), dtype=np.float64)
    np.divide(num, den, out=out, where=den > 0)
    return out


def _split(strings, pattern: str):
    """``strings`` split on ``pattern``: (pieces, parent index of each)."""
    parts = pc.split_pattern_regex(strings, pattern)
    return parts.flatten(), _np(pc.list_parent_indices(parts))


def _ngram_signals(parents, ids, wlen, n_docs, n_chars) -> dict[str, np.ndarray]:
    """Gopher repetition's n-gram signals: the top n-gram (the most frequent, the earliest of
    equals, as ``Counter.most_common``) and datatrove's greedy scan for repeated n-grams.
    Windows grouped as ``quality_signals`` groups them (only those that may repeat)."""
    out = {name: np.zeros(n_docs) for name in
           [*(f"gr_top_{k}gram_char_share" for k in TOP_NGRAMS),
            *(f"gr_dup_{k}gram_char_share" for k in DUP_NGRAMS)]}
    cum = np.concatenate([[0], np.cumsum(wlen, dtype=np.int64)])
    for k, valid, w in ngram_windows(parents, ids, range(min(TOP_NGRAMS), max(DUP_NGRAMS) + 1)):
        twice = w.count[w.group] > 1
        if k in TOP_NGRAMS:
            if len(valid) == 0:
                continue
            # a document without a repeated n-gram: its first one, once (Counter's first key)
            lead = valid[np.r_[True, parents[valid][1:] != parents[valid][:-1]]]
            best = np.zeros(n_docs, dtype=np.int64)
            best[parents[lead]] = cum[lead + k] - cum[lead] + (k - 1)
            heads = np.flatnonzero(w.first & twice)  # each repeated n-gram's first window
            if len(heads):
                first, doc, count = w.start[heads], w.doc[heads], w.count[w.group[heads]]
                most = np.zeros(n_docs, dtype=np.int64)
                np.maximum.at(most, doc, count)
                top = count == most[doc]
                pos = np.full(n_docs, len(cum))
                np.minimum.at(pos, doc[top], first[top])  # the earliest of the most frequent
                has = pos < len(cum)
                p = pos[has]
                best[has] = (cum[p + k] - cum[p] + (k - 1)) * most[has]
            out[f"gr_top_{k}gram_char_share"] = _ratio(best, n_chars)
        else:
            # only n-grams that occur twice or more can be (or make) a repeat
            events = np.argsort(w.start[twice], kind="stable")
            at = _greedy_repeats(w.start[twice][events], w.group[twice][events], k)
            out[f"gr_dup_{k}gram_char_share"] = _ratio(
                _count(parents[at], n_docs, cum[at + k] - cum[at]), n_chars)
    return out


def _greedy_repeats(events: np.ndarray, keys: np.ndarray, k: int) -> np.ndarray:
    """datatrove's scan over one batch: from the first word, an n-gram seen before (at a
    position the scan visited) is a repeat and the scan jumps ``k`` words; otherwise it is
    remembered and the scan moves one word. ``events``: the positions of n-grams that occur
    more than once (the others never matter), ascending; ``keys``: their n-grams (document
    included, so no two documents share one). Returns the repeats' positions."""
    seen: set[int] = set()
    skip_to = -1
    repeats = []
    for p, key in zip(events.tolist(), keys.tolist()):
        if p < skip_to:
            continue
        if key in seen:
            repeats.append(p)
            skip_to = p + k
        else:
            seen.add(key)
    return np.asarray(repeats, dtype=np.int64)


def compute_signals(texts: pa.Array) -> pa.RecordBatch:
    """Every column of ``SIGNALS`` for a batch of texts (a string array, no nulls)."""
    texts = pc.cast(texts, pa.string())
    n = len(texts)
    n_chars = _np(pc.utf8_length(texts)).astype(np.int64)
    not_punct, terminal = _punctuation()

    # Gopher repetition: paragraphs and \n+ lines
    paras, pparent = _split(pc.utf8_trim_whitespace(texts), r"\n{2,}")
    dup_paras, dup_para_chars = _duplicates(pparent, paras, _np(pc.utf8_length(paras)), n)
    glines, gparent = _split(texts, r"\n+")
    dup_lines, dup_line_chars = _duplicates(gparent, glines, _np(pc.utf8_length(glines)), n)

    # splitlines: the last piece goes when empty (a final line break makes no line)
    lines_list = pc.split_pattern_regex(texts, LINE_BREAK)
    offsets = _np(lines_list.offsets)
    lines, lparent = lines_list.flatten(), _np(pc.list_parent_indices(lines_list))
    llen = _np(pc.utf8_length(lines)).astype(np.int64)
    keep = np.ones(len(lines), dtype=bool)
    last = offsets[1:][offsets[1:] > offsets[:-1]] - 1
    keep[last[llen[last] == 0]] = False
    lines, lparent, llen = lines.filter(pa.array(keep)), lparent[keep], llen[keep]
    n_lines = _count(lparent, n)

    # words of every line (a document's words are its lines' words, in order)
    # per distinct word, then spread to every word: the regexes run once per distinct word
    words = web_words.words_of(lines)
    encoded = pc.dictionary_encode(words.words)
    ids = _np(encoded.indices).astype(np.int64)
    distinct = encoded.dictionary
    wlen = _np(pc.utf8_length(distinct)).astype(np.int64)[ids]
    real = _np(pc.match_substring_regex(distinct, not_punct))[ids]
    alpha = _np(pc.match_substring_regex(distinct, r"\pL"))[ids]
    stop = _np(pc.index_in(distinct, value_set=pa.array(STOP_WORDS)).fill_null(-1))[ids]
    ends, punct = (f[ids] for f in web_words.sentence_flags(distinct))
    line_words = _count(words.parents, len(lines))
    wparent = lparent[words.parents]
    n_words = _count(wparent, n)
    word_count = _count(wparent[real], n)
    stop_kinds = np.zeros((n, len(STOP_WORDS)), dtype=bool)
    stop_kinds[wparent[stop >= 0], stop[stop >= 0]] = True
    hashes = _np(pc.count_substring(texts, "#"))
    ellipses = _np(pc.count_substring(texts, "...")) + _np(pc.count_substring(texts, "…"))

    def line_share(pattern: str) -> np.ndarray:
        return _ratio(_count(lparent, n, _np(pc.match_substring_regex(lines, pattern))), n_lines)

    # C4 (FineWeb's settings): per stripped line
    stripped = pc.utf8_trim(lines, characters=SPACES)
    chunks = pc.utf8_split_whitespace(stripped)
    n_chunks = _np(pc.list_value_length(chunks)).astype(np.int64)
    long_word = _count(_np(pc.list_parent_indices(chunks)), len(lines),
                       _np(pc.utf8_length(chunks.flatten())) > C4_MAX_WORD) > 0
    cleaned = pc.replace_substring_regex(stripped, CITATION_RE, "")
    lower = pc.utf8_lower(cleaned)
    read = (n_chunks >= C4_MIN_WORDS) & ~long_word
    js = _np(pc.match_substring(lower, "javascript"))
    policy = np.zeros(len(lines), dtype=bool)
    for phrase in POLICY_SUBSTRINGS:
        policy |= _np(pc.match_substring(lower, phrase))
    lorem = read & _np(pc.match_substring(lower, "lorem ipsum"))
    curly = read & ~js & _np(pc.match_substring(cleaned, "{"))
    c4_kept = read & ~js & ~policy
    # the words and sentences of a kept line are those of its cleaned text: the same as the
    # raw line's unless a citation was cut out
    changed = c4_kept & _np(pc.not_equal(cleaned, stripped))
    sentences = web_words.sentence_counts(words.parents, ends, punct, len(lines))
    kept_words = line_words.copy()
    if changed.any():
        which = np.flatnonzero(changed)
        redo = web_words.words_of(cleaned.take(pa.array(which)))
        kept_words[which] = _count(redo.parents, len(which))
        sentences[which] = web_words.sentence_counts(redo.parents,
                                                     *web_words.sentence_flags(redo.words),
                                                     len(which))

    # FineWeb: the text C4 hands on is its kept lines joined by \n, then stripped
    fw = _fineweb(cleaned.filter(pa.array(c4_kept)), lparent[c4_kept], kept_words[c4_kept],
                  n, terminal)

    cols = {
        "gr_dup_para_share": _ratio(dup_paras, _count(pparent, n)),
        "gr_dup_para_char_share": _ratio(dup_para_chars, n_chars),
        "gr_dup_line_share": _ratio(dup_lines, _count(gparent, n)),
        "gr_dup_line_char_share": _ratio(dup_line_chars, n_chars),
        **_ngram_signals(wparent, ids, wlen, n, n_chars),
        "gq_word_count": word_count,
        "gq_mean_word_length": _ratio(_count(wparent[real], n, wlen[real]), word_count),
        "gq_symbol_word_ratio": np.maximum(_ratio(hashes, n_words), _ratio(ellipses, n_words)),
        "gq_bullet_line_share": line_share(f"^{SPACE}*[•-]"),
        "gq_ellipsis_line_share": line_share(f"(\\.\\.\\.|…){SPACE}*$"),
        "gq_alpha_word_share": _ratio(_count(wparent, n, alpha), n_words),
        "gq_stop_words": stop_kinds.sum(axis=1),
        "c4_lorem_ipsum_line": _count(lparent, n, lorem) > 0,
        "c4_curly_bracket_line": _count(lparent, n, curly) > 0,
        "c4_sentences": _count(lparent[c4_kept], n, sentences[c4_kept]),
        **fw,
    }
    return pa.RecordBatch.from_arrays([pa.array(cols[f.name], f.type) for f in FIELDS],
                                      schema=SCHEMA)


def _fineweb(kept: pa.Array, parent: np.ndarray, words: np.ndarray, n: int,
             terminal: pa.Array) -> dict[str, np.ndarray]:
    """FineWeb's filter on ``"\\n".join(kept lines).strip()``, per document (``parent``: each
    kept line's document, ``words``: its spaCy words)."""
    blank = _np(pc.equal(pc.utf8_length(pc.utf8_trim(kept, characters=SPACES)), 0))
    # strip(): blank lines before a document's first and after its last non-blank line vanish
    # with their newlines; the first loses its leading spaces, the last its trailing ones
    idx = np.arange(len(kept))
    nb = np.flatnonzero(~blank)
    first = np.full(n, len(kept))
    last = np.full(n, -1)
    np.minimum.at(first, parent[nb], nb)
    np.maximum.at(last, parent[nb], nb)
    inside = (idx >= first[parent]) & (idx <= last[parent])
    lead = pa.array(np.isin(idx, first))
    trail = pa.array(np.isin(idx, last))
    text = pc.if_else(lead, pc.utf8_ltrim(kept, characters=SPACES), kept)
    text = pc.if_else(trail, pc.utf8_rtrim(text, characters=SPACES), text)
    tlen = _np(pc.utf8_length(text)).astype(np.int64)
    line = inside & ~blank
    n_lines = _count(parent[line], n)
    ends = _np(pc.is_in(pc.utf8_slice_codeunits(text, -1), value_set=terminal)) & line
    _, dup_chars = _duplicates(parent[line], text.filter(pa.array(line)), tlen[line], n)
    newlines = np.maximum(_count(parent[inside], n) - 1, 0)
    return {
        "fw_lines": n_lines,
        "fw_terminal_punct_line_share": _ratio(_count(parent, n, ends), n_lines),
        "fw_short_line_share": _ratio(_count(parent[line], n, tlen[line] <= SHORT_LINE), n_lines),
        "fw_dup_line_char_share": _ratio(dup_chars, _count(parent[inside], n, tlen[inside])),
        "fw_newline_word_ratio": _ratio(newlines, _count(parent, n, words)),
    }


def fragment_signals(frag) -> Iterator[pa.RecordBatch]:
    """Every signal for one fragment (module-level: a Ray task can run it)."""
    for batch in frag.to_batches(columns=["text"], batch_size=BATCH_ROWS):
        yield compute_signals(batch.column("text"))


PRODUCER = ColumnProducer(
    name="fineweb_signals",
    doc="FineWeb's quality filters (datatrove's Gopher repetition, Gopher quality, C4 as FineWeb "
        "set it, FineWeb) as columns, each statistic computed exactly as datatrove does: spaCy's "
        "English words, Python's line splits, the text C4 hands on for FineWeb's ratios. "
        "`RULE_SETS['fineweb']` reads them; vectorised per fragment.",
    fields=FIELDS, descriptions=DESCRIPTIONS, compute=lambda settings, state: fragment_signals,
    group="fineweb", kinds=("lance", "numpy"))
