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

import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Union

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from lance_assets.markdown import markdown_table
from lance_assets.table import Table
from lance_assets.table.columns import ColumnWriteReport
from lance_assets.table.producer import ColumnProducer, Markdown, Run, fixed, produce

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


def _repeats(parents: np.ndarray, values: pa.Array, lengths: np.ndarray, n: int):
    """Per document: how many elements equal an earlier element of the same document, and
    their characters (datatrove's ``find_duplicates``), by grouping (document, value)."""
    if len(parents) == 0:
        return np.zeros(n), np.zeros(n)
    groups = pa.table({"p": parents, "v": values, "len": lengths}).group_by(["p", "v"]).aggregate(
        [("len", "count"), ("len", "max")])
    extra = _np(groups["len_count"]).astype(np.int64) - 1
    gp = _np(groups["p"])
    return _count(gp, n, extra), _count(gp, n, extra * _np(groups["len_max"]))


def _ngram_keys(ids: np.ndarray, k: int) -> np.ndarray:
    """A 64-bit key per window of ``k`` word ids starting at each position (wrapping arithmetic)."""
    m = len(ids) - k + 1
    key = np.zeros(m, dtype=np.uint64)
    for j in range(k):
        key = (key ^ ids[j : j + m]) * np.uint64(0x100000001B3)
    return key


def _ngram_signals(parents: np.ndarray, ids: np.ndarray, wlen: np.ndarray, n_docs: int,
                   n_chars: np.ndarray) -> dict[str, np.ndarray]:
    """Gopher's n-gram repetition signals for every document of a batch at once.

    ``parents``/``ids``/``wlen``: the batch's words in document order (document index, a
    per-batch word id, characters). Windows that cross a document boundary are dropped.
    """
    out: dict[str, np.ndarray] = {}
    cum = np.concatenate([[0], np.cumsum(wlen, dtype=np.int64)])
    ids = ids.astype(np.uint64) + np.uint64(1)
    doc_bits = max(1, int(n_docs).bit_length())
    key_bits = 64 - doc_bits
    for k in (*TOP_NGRAMS, *DUP_NGRAMS):
        name = f"top_{k}gram_char_share" if k in TOP_NGRAMS else f"dup_{k}gram_char_share"
        m = len(ids) - k + 1
        if m <= 0:
            out[name] = np.zeros(n_docs, dtype=np.float32)
            continue
        start = np.arange(m)
        valid = parents[:m] == parents[k - 1 :]
        start = start[valid]
        doc = parents[start]
        key = _ngram_keys(ids, k)[valid]
        # one sort on (document in the high bits, key in the rest); stable, so the first
        # occurrence of an n-gram leads its run
        sort_key = (doc.astype(np.uint64) << np.uint64(key_bits)) | (key >> np.uint64(doc_bits))
        order = np.argsort(sort_key, kind="stable")
        sorted_key, doc_s, start_s = sort_key[order], doc[order], start[order]
        new_run = np.ones(len(order), dtype=bool)
        new_run[1:] = sorted_key[1:] != sorted_key[:-1]
        if k in TOP_NGRAMS:
            run_id = np.cumsum(new_run) - 1
            run_count = np.bincount(run_id)
            first = start_s[new_run]
            run_chars = (cum[first + k] - cum[first] + (k - 1)) * run_count
            run_doc = doc_s[new_run]  # ascending
            heads = np.flatnonzero(np.r_[True, run_doc[1:] != run_doc[:-1]])
            best = np.zeros(n_docs, dtype=np.int64)
            best[run_doc[heads]] = np.maximum.reduceat(run_chars, heads)
            out[name] = _ratio(best, n_chars)
        else:
            # words covered by any repeated occurrence (Gopher's definition; overlaps once)
            rep = start_s[~new_run]
            size = len(ids) + 1
            diff = np.bincount(rep, minlength=size) - np.bincount(rep + k, minlength=size)
            covered = np.cumsum(diff[:-1]) > 0
            chars = _count(parents[covered], n_docs, wlen[covered] + 1.0)
            out[name] = _ratio(chars, n_chars)
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
    dup_lines, dup_line_chars = _repeats(lparent[non_empty], lflat.filter(pa.array(non_empty)),
                                         llen[non_empty], n)

    # paragraphs: split on blank lines after trimming, as Gopher's repetition filter does
    paras = pc.split_pattern_regex(pc.utf8_trim_whitespace(texts), r"\n{2,}")
    pparent = _np(pc.list_parent_indices(paras))
    pflat = paras.flatten()
    dup_paras, dup_para_chars = _repeats(pparent, pflat, _np(pc.utf8_length(pflat)).astype(np.int64), n)

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


def quality_signals(
    table: Union[Table, str, os.PathLike], *, fragments_per_commit: int | None = None,
    executor: str | None = None, log: Callable[[str], None] = print,
) -> ColumnWriteReport:
    """Write every quality signal column for each fragment that lacks them (``table``: a
    ``Table`` or a data root)."""
    return produce(PRODUCER, table, executor=executor, fragments_per_commit=fragments_per_commit,
                   log=log, summarize=False).write


def signal_summary(table: Union[Table, str, os.PathLike]) -> list[dict]:
    """Per signal: its definition, source rule and p10/p50/p90 over the table (for metadata);
    ``table``: a ``Table`` or a data root."""
    import duckdb

    ds = Table.of(table).newest()
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


def summary(run: Run) -> dict:
    return {"signals": Markdown(markdown_table(signal_summary(run.table)))}


PRODUCER = ColumnProducer(
    name="quality_signals",
    doc="Per-document statistics from the Gopher, C4 and FineWeb quality rules, one column each "
        "(`word_count`, `mean_word_length`, `symbol_word_ratio`, `stop_word_count`, "
        "`terminal_punct_line_share`, `dup_line_char_share`, `top_2gram_char_share`, ...). "
        "Computed per fragment with pyarrow.compute and numpy; curation rules are SQL over these "
        "columns.",
    fields=FIELDS, descriptions=DESCRIPTIONS, compute=fixed(fragment_signals), summary=summary,
    kinds=("lance", "numpy"))
