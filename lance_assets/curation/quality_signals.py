"""Per-document quality signals (Gopher, C4, FineWeb), one column each, computed per fragment.

Every signal is a plain number next to the text, so a curation rule is a readable SQL predicate
over it (``word_count BETWEEN 50 AND 100000``). The computation is vectorised over a batch of
documents with ``pyarrow.compute`` and ``numpy``: words and lines are split into flat arrays
with parent indices, counted with ``bincount``, and repeated lines / n-grams are found by
sorting, not by a Python loop per document.

Where the definition differs from datatrove's reference filters (which FineWeb used) the
difference is noted next to the signal in ``SIGNALS``. Words are whitespace-separated tokens
with leading/trailing punctuation trimmed; a token that is only punctuation is not a word.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from lance_assets.markdown import Markdown, markdown_table
from lance_assets.table import Table
from lance_assets.table.columns import ColumnWriteReport
from lance_assets.table.producer import ColumnProducer

# What a word is trimmed of (ASCII punctuation plus common typographic marks).
PUNCTUATION = "!\"#$%&'()*+,-./:;<=>?@[\\]^_`{|}~“”‘’«»…–—·•"
STOP_WORDS = ["the", "be", "to", "of", "and", "that", "have", "with"]  # Gopher's list
TERMINAL_PUNCTUATION_RE = r"[.'\"!?]$"  # FineWeb's stop_chars, checked on the raw line
BULLET_RE = r"^\s*[•‣◦▪●○■□\-*]"
ELLIPSIS_END_RE = r"(\.\.\.|…)\s*$"
SHORT_LINE_CHARS = 30  # FineWeb's short_line_length
TOP_NGRAMS = (2, 3, 4)
DUP_NGRAMS = (5, 6, 7, 8, 9, 10)
BATCH_ROWS = 2048


@dataclass(frozen=True)
class Signal:
    name: str
    type: pa.DataType
    definition: str
    source: str


SIGNALS: list[Signal] = [
    Signal("word_count", pa.int32(), "words in the document", "Gopher (50..100,000)"),
    Signal("mean_word_length", pa.float32(), "mean characters per word", "Gopher (3..10)"),
    Signal("symbol_word_ratio", pa.float32(),
           "max(count of '#', count of '...' or '…') / words", "Gopher (<= 0.1)"),
    Signal("alpha_word_share", pa.float32(), "share of words with an alphabetic character",
           "Gopher (>= 0.8)"),
    Signal("stop_word_count", pa.int32(),
           "words in {the, be, to, of, and, that, have, with}, case-insensitive", "Gopher (>= 2)"),
    Signal("bullet_line_share", pa.float32(), "share of lines starting with a bullet (• - * …)",
           "Gopher (<= 0.9)"),
    Signal("ellipsis_line_share", pa.float32(), "share of lines ending with '...' or '…'",
           "Gopher (<= 0.3)"),
    Signal("terminal_punct_line_share", pa.float32(),
           "share of lines (split on \\n, empty ones included) ending in . ' \" ! ?",
           "FineWeb (> 0.12)"),
    Signal("short_line_share", pa.float32(),
           f"share of lines (split on \\n) of at most {SHORT_LINE_CHARS} characters",
           "FineWeb (< 0.67)"),
    Signal("dup_line_share", pa.float32(),
           "non-empty lines equal to an earlier line / non-empty lines", "Gopher (<= 0.3)"),
    Signal("dup_line_char_share", pa.float32(),
           "characters of repeated non-empty lines / characters other than newlines",
           "FineWeb (< 0.01), Gopher (<= 0.2)"),
    Signal("dup_para_share", pa.float32(),
           "paragraphs (split on blank lines) equal to an earlier one / paragraphs",
           "Gopher (<= 0.3)"),
    Signal("dup_para_char_share", pa.float32(),
           "characters of repeated paragraphs / characters", "Gopher (<= 0.2)"),
    Signal("newline_word_ratio", pa.float32(), "newlines / words", "FineWeb (<= 0.3)"),
    *[Signal(f"top_{n}gram_char_share", pa.float32(),
             f"characters of the most repeated word {n}-gram (count × length) / characters",
             f"Gopher (<= {lim})") for n, lim in zip(TOP_NGRAMS, (0.2, 0.18, 0.16))],
    *[Signal(f"dup_{n}gram_char_share", pa.float32(),
             f"characters of words covered by a repeated word {n}-gram / characters",
             f"Gopher (<= {lim})") for n, lim in zip(DUP_NGRAMS, (0.15, 0.14, 0.13, 0.12, 0.11, 0.10))],
    Signal("has_lorem_ipsum", pa.bool_(), "'lorem ipsum' appears (any case)", "C4 (false)"),
    Signal("has_curly_bracket", pa.bool_(), "a '{' appears", "C4 (false)"),
]
FIELDS = [pa.field(s.name, s.type) for s in SIGNALS]
SCHEMA = pa.schema(FIELDS)
COLUMNS = [s.name for s in SIGNALS]
DESCRIPTIONS = {s.name: f"{s.definition} [{s.source}]" for s in SIGNALS}


def _ratio(num: np.ndarray, den: np.ndarray) -> np.ndarray:
    """num / den as float32, 0 where den is 0 (an empty document has no repeated lines)."""
    num = np.asarray(num, dtype=np.float64)
    den = np.asarray(den, dtype=np.float64)
    out = np.zeros(len(num), dtype=np.float64)
    np.divide(num, den, out=out, where=den > 0)
    return out.astype(np.float32)


def _count(parents: np.ndarray, n: int, weights: np.ndarray | None = None) -> np.ndarray:
    return np.bincount(parents, weights=weights, minlength=n)[:n]


def _np(arr) -> np.ndarray:
    return arr.to_numpy(zero_copy_only=False)


def repeats(parents: np.ndarray, values: pa.Array, lengths: np.ndarray, n: int):
    """Per document: how many elements equal an earlier element of the same document, and
    their characters (datatrove's ``find_duplicates``), by grouping (document, value)."""
    if len(parents) == 0:
        return np.zeros(n), np.zeros(n)
    groups = pa.table({"p": parents, "v": values, "len": lengths}).group_by(["p", "v"]).aggregate(
        [("len", "count"), ("len", "max")])
    extra = _np(groups["len_count"]).astype(np.int64) - 1
    gp = _np(groups["p"])
    return _count(gp, n, extra), _count(gp, n, extra * _np(groups["len_max"]))


def grouping_order(key: np.ndarray) -> np.ndarray:
    """Indices that sort ``key``, equal keys in index order (a stable argsort): one ``np.sort``
    of the key's high bits and the index packed in a word. Keys equal in those bits but not
    in full (a few per million) are put in order block by block."""
    bits = max(1, int(len(key)).bit_length())
    low = np.uint64((1 << bits) - 1)
    packed = (key & ~low) | np.arange(len(key), dtype=np.uint64)
    order = (np.sort(packed) & low).astype(np.int64)
    key_s = key[order]
    high = key_s >> np.uint64(bits)
    clash = np.flatnonzero((key_s[1:] != key_s[:-1]) & (high[1:] == high[:-1])) + 1
    if len(clash):
        blocks = np.flatnonzero(np.r_[True, high[1:] != high[:-1]])
        for i in np.unique(np.searchsorted(blocks, clash, side="right") - 1).tolist():
            lo = blocks[i]
            hi = blocks[i + 1] if i + 1 < len(blocks) else len(order)
            part = order[lo:hi]
            order[lo:hi] = part[np.lexsort((part, key[part]))]
    return order


@dataclass
class Windows:
    """Word windows grouped by (document, n-gram), each group's windows in position order:
    ``start`` (sorted), ``doc``, ``first`` (leads its group), ``group``, ``count`` (per group)."""

    start: np.ndarray
    doc: np.ndarray
    first: np.ndarray
    group: np.ndarray
    count: np.ndarray


def window_groups(key: np.ndarray, start: np.ndarray, parents: np.ndarray) -> Windows:
    """The windows at ``start`` (their n-gram keys ``key``) grouped by document and n-gram."""
    order = grouping_order(key)
    key_s, start_s = key[order], start[order]
    doc_s = parents[start_s]
    first = np.ones(len(order), dtype=bool)
    first[1:] = (key_s[1:] != key_s[:-1]) | (doc_s[1:] != doc_s[:-1])
    group = np.cumsum(first) - 1
    return Windows(start_s, doc_s, first, group, np.bincount(group, minlength=0))


def ngram_windows(parents: np.ndarray, ids: np.ndarray, sizes: range
                  ) -> Iterator[tuple[int, np.ndarray, Windows]]:
    """For each n-gram size k of ``sizes`` (from 2 up, consecutive): the starts of the windows
    of k words inside one document, and those whose n-gram may occur twice grouped.

    A window's 64-bit key is built from the (k-1)-word key of the same start (one pass per
    k), and a k-gram occurs twice only if its (k-1)-gram does: only those windows are grouped
    (the others occur once), so each size sorts fewer windows than the one before."""
    n = len(ids)
    acc = (ids.astype(np.uint64) + np.uint64(1)) * np.uint64(0x9E3779B97F4A7C15)
    word = acc.copy()
    maybe = np.ones(n, dtype=bool)
    for k in range(2, sizes.stop):
        m = n - k + 1
        if m <= 0:
            return
        acc = (acc[:m] * np.uint64(0x100000001B3)) ^ word[k - 1:]
        acc ^= acc >> np.uint64(29)
        inside = parents[:m] == parents[k - 1:]
        start = np.flatnonzero(inside & maybe[:m])
        groups = window_groups(acc[start], start, parents)
        twice = groups.count[groups.group] > 1
        maybe = np.zeros(m, dtype=bool)
        maybe[groups.start[twice]] = True
        if k >= sizes.start:
            yield k, np.flatnonzero(inside), groups


def _ngram_signals(parents: np.ndarray, ids: np.ndarray, wlen: np.ndarray, n_docs: int,
                   n_chars: np.ndarray) -> dict[str, np.ndarray]:
    """Gopher's n-gram repetition signals for every document of a batch at once.

    ``parents``/``ids``/``wlen``: the batch's words in document order (document index, a
    per-batch word id, characters). Windows that cross a document boundary are dropped.
    """
    out = {**{f"top_{k}gram_char_share": np.zeros(n_docs, dtype=np.float32) for k in TOP_NGRAMS},
           **{f"dup_{k}gram_char_share": np.zeros(n_docs, dtype=np.float32) for k in DUP_NGRAMS}}
    cum = np.concatenate([[0], np.cumsum(wlen, dtype=np.int64)])
    for k, valid, w in ngram_windows(parents, ids, range(min(TOP_NGRAMS), max(DUP_NGRAMS) + 1)):
        twice = w.count[w.group] > 1
        if k in TOP_NGRAMS:
            # the largest count x length: a single window's length, or a repeated n-gram's
            best = np.zeros(n_docs, dtype=np.int64)
            np.maximum.at(best, parents[valid], cum[valid + k] - cum[valid] + (k - 1))
            lead = w.first & twice
            s = w.start[lead]
            np.maximum.at(best, w.doc[lead], (cum[s + k] - cum[s] + (k - 1)) * w.count[w.group[lead]])
            out[f"top_{k}gram_char_share"] = _ratio(best, n_chars)
        else:
            # words covered by any repeated occurrence (Gopher's definition; overlaps once)
            rep = w.start[twice & ~w.first]
            size = len(ids) + 1
            diff = np.bincount(rep, minlength=size) - np.bincount(rep + k, minlength=size)
            covered = np.cumsum(diff[:-1]) > 0
            chars = _count(parents[covered], n_docs, wlen[covered] + 1.0)
            out[f"dup_{k}gram_char_share"] = _ratio(chars, n_chars)
    return out


def compute_signals(texts: pa.Array) -> pa.RecordBatch:
    """Every signal in ``SIGNALS`` for a batch of texts (a string array, no nulls)."""
    texts = pc.cast(texts, pa.string())
    n = len(texts)
    n_chars = _np(pc.utf8_length(texts)).astype(np.int64)
    n_newlines = _np(pc.count_substring(texts, "\n")).astype(np.int64)

    # words
    tokens = pc.utf8_split_whitespace(texts)
    tok_parent = _np(pc.list_parent_indices(tokens))
    trimmed = pc.utf8_trim(tokens.flatten(), characters=PUNCTUATION)
    tlen = _np(pc.utf8_length(trimmed)).astype(np.int64)
    is_word = tlen > 0
    words = trimmed.filter(pa.array(is_word))
    parents = tok_parent[is_word]
    wlen = tlen[is_word]
    word_count = _count(parents, n)
    lower = pc.utf8_lower(words)
    alpha = _np(pc.match_substring_regex(words, r"\pL")).astype(np.float64)
    stop = _np(pc.is_in(lower, value_set=pa.array(STOP_WORDS))).astype(np.float64)
    hashes = _np(pc.count_substring(texts, "#"))
    ellipses = _np(pc.count_substring(texts, "...")) + _np(pc.count_substring(texts, "…"))

    # lines: split on "\n" as FineWeb does (empty lines count as lines)
    lines = pc.split_pattern(texts, "\n")
    lparent = _np(pc.list_parent_indices(lines))
    lflat = lines.flatten()
    n_lines = _count(lparent, n)
    llen = _np(pc.utf8_length(lflat)).astype(np.int64)
    non_empty = _np(pc.not_equal(pc.utf8_length(pc.utf8_trim_whitespace(lflat)), 0))
    dup_lines, dup_line_chars = repeats(lparent[non_empty], lflat.filter(pa.array(non_empty)),
                                         llen[non_empty], n)

    # paragraphs: split on blank lines after trimming, as Gopher's repetition filter does
    paras = pc.split_pattern_regex(pc.utf8_trim_whitespace(texts), r"\n{2,}")
    pparent = _np(pc.list_parent_indices(paras))
    pflat = paras.flatten()
    dup_paras, dup_para_chars = repeats(pparent, pflat, _np(pc.utf8_length(pflat)).astype(np.int64), n)

    def line_share(pattern: str) -> np.ndarray:
        hit = _np(pc.match_substring_regex(lflat, pattern)).astype(np.float64)
        return _ratio(_count(lparent, n, hit), n_lines)

    word_ids = _np(pc.dictionary_encode(lower).indices).astype(np.int64)
    cols: dict[str, np.ndarray] = {
        "word_count": word_count.astype(np.int32),
        "mean_word_length": _ratio(_count(parents, n, wlen.astype(np.float64)), word_count),
        "symbol_word_ratio": _ratio(np.maximum(hashes, ellipses), word_count),
        "alpha_word_share": _ratio(_count(parents, n, alpha), word_count),
        "stop_word_count": _count(parents, n, stop).astype(np.int32),
        "bullet_line_share": line_share(BULLET_RE),
        "ellipsis_line_share": line_share(ELLIPSIS_END_RE),
        "terminal_punct_line_share": line_share(TERMINAL_PUNCTUATION_RE),
        "short_line_share": _ratio(_count(lparent, n, (llen <= SHORT_LINE_CHARS).astype(np.float64)),
                                   n_lines),
        "dup_line_share": _ratio(dup_lines, _count(lparent[non_empty], n)),
        "dup_line_char_share": _ratio(dup_line_chars, n_chars - n_newlines),
        "dup_para_share": _ratio(dup_paras, _count(pparent, n)),
        "dup_para_char_share": _ratio(dup_para_chars, n_chars),
        "newline_word_ratio": _ratio(n_newlines, word_count),
        **_ngram_signals(parents, word_ids, wlen, n, n_chars),
        "has_lorem_ipsum": _np(pc.match_substring(texts, "lorem ipsum", ignore_case=True)),
        "has_curly_bracket": _np(pc.match_substring(texts, "{")),
    }
    return pa.RecordBatch.from_arrays([pa.array(cols[s.name], s.type) for s in SIGNALS], schema=SCHEMA)


def fragment_signals(frag) -> Iterator[pa.RecordBatch]:
    """Every signal for one fragment (module-level: a Ray task can run it)."""
    for batch in frag.to_batches(columns=["text"], batch_size=BATCH_ROWS):
        yield compute_signals(batch.column("text"))


def signal_summary(table: Table) -> list[dict]:
    """Per signal: its definition, source rule and p10/p50/p90 over the table (for metadata)."""
    import duckdb

    ds = table.newest()
    con = duckdb.connect()
    con.register("corpus", ds)
    numeric = [s for s in SIGNALS if s.type != pa.bool_()]
    sql = ", ".join(
        f"quantile_cont({s.name}, [0.1, 0.5, 0.9]) AS {s.name}" for s in numeric
    ) + ", " + ", ".join(f"avg({s.name}::INT) AS {s.name}" for s in SIGNALS if s.type == pa.bool_())
    row = con.execute(f"SELECT {sql} FROM corpus").fetchone()
    out = []
    for s, value in zip([*numeric, *[s for s in SIGNALS if s.type == pa.bool_()]], row):
        if isinstance(value, (list, tuple)):
            shown = " / ".join(f"{v:.3g}" for v in value) if value[0] is not None else "-"
        else:
            shown = f"{value:.3%} true" if value is not None else "-"
        out.append({"signal": s.name, "p10 / p50 / p90": shown, "definition": s.definition,
                    "rule": s.source})
    return out


def summary(table: Table, report: ColumnWriteReport) -> dict:
    return {"signals": Markdown(markdown_table(signal_summary(table)))}


PRODUCER = ColumnProducer(
    name="quality_signals",
    doc="Per-document statistics from the Gopher, C4 and FineWeb quality rules, one column each "
        "(`word_count`, `mean_word_length`, `symbol_word_ratio`, `stop_word_count`, "
        "`terminal_punct_line_share`, `dup_line_char_share`, `top_2gram_char_share`, ...). "
        "Computed per fragment with pyarrow.compute and numpy; curation rules are SQL over these "
        "columns.",
    fields=FIELDS, descriptions=DESCRIPTIONS, compute=lambda settings, state: fragment_signals,
    summary=summary,
    kinds=("lance", "numpy"))
