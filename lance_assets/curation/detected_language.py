"""Detected language: the ``lang`` and ``lang_score`` columns, from CLD2 (``pycld2``).

The raw table may already hold ``language`` / ``language_score``: what the *source* says
(FineWeb's fastText label). These columns are what this project detects itself, on every row
whatever its source, so a curation rule can rely on them.

CLD2 was chosen over Lingua (``lingua-language-detector``) on a labelled sample of twelve
languages (``benchmarks/curation_tags.py``, docs/benchmarks.md): the same accuracy on
paragraphs (100% both) and on single sentences (99.2% both), at 30-50 times the speed, from a
10 MB wheel instead of 96 MB. Google's CLD3 (``gcld3``) has no wheel for this Python and its
source build needs the protobuf compiler, so it was not an option. The model is inside the
wheel: nothing is downloaded.

CLD2 refuses text with control characters ("invalid UTF-8"), so those are replaced by spaces
before detection; text CLD2 cannot place (empty, digits only, symbols) gets ``und`` and score 0.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from typing import Union

import pyarrow as pa
import pyarrow.compute as pc

from lance_assets.markdown import markdown_table
from lance_assets.table import Table
from lance_assets.table.columns import ColumnWriteReport
from lance_assets.table.producer import ColumnProducer, Markdown, fixed, produce

LANG = pa.field("lang", pa.string())
LANG_SCORE = pa.field("lang_score", pa.float32())
FIELDS = [LANG, LANG_SCORE]
UNDETERMINED = "und"
DESCRIPTIONS = {
    LANG.name: "Language detected from `text` by CLD2: an ISO 639-1 code where one exists ('en', "
               "'fr', 'zh'...), 'und' when undetermined. Not the source's own label (that is "
               "`language`).",
    LANG_SCORE.name: "Share (0-1) of the text CLD2 attributes to `lang`; 0 when undetermined. "
                     "Not the source's own confidence (that is `language_score`).",
}
BATCH_ROWS = 2048
# C0/C1 controls except tab and newline: CLD2 rejects them as invalid UTF-8
CONTROL_CHARS_RE = r"[\x00-\x08\x0b-\x1f\x7f-\x9f]"


def detect(texts: pa.Array) -> pa.RecordBatch:
    """``lang`` and ``lang_score`` for a batch of texts (nulls count as empty)."""
    import pycld2

    clean = pc.replace_substring_regex(pc.fill_null(pc.cast(texts, pa.string()), ""),
                                       CONTROL_CHARS_RE, " ")
    langs, scores = [], []
    for text in clean.to_pylist():
        try:
            _reliable, _bytes, details = pycld2.detect(text, bestEffort=True)
            _name, code, percent, _score = details[0]
        except pycld2.error:
            code, percent = "un", 0
        if code == "un":
            langs.append(UNDETERMINED)
            scores.append(0.0)
        else:
            langs.append(code)
            scores.append(percent / 100.0)
    return pa.RecordBatch.from_arrays([pa.array(langs, pa.string()),
                                       pa.array(scores, pa.float32())], schema=pa.schema(FIELDS))


def fragment_language(frag) -> Iterator[pa.RecordBatch]:
    """Both columns for one fragment (module-level: a Ray task can run it)."""
    for batch in frag.to_batches(columns=["text"], batch_size=BATCH_ROWS):
        yield detect(batch.column("text"))


def language_id(table: Union[Table, str, os.PathLike], *, fragments_per_commit: int | None = None,
                executor: str | None = None,
                log: Callable[[str], None] = print) -> ColumnWriteReport:
    """Write ``lang`` and ``lang_score`` for every fragment of the newest version that lacks
    them (``table``: a ``Table`` or a data root)."""
    return produce(PRODUCER, table, executor=executor, fragments_per_commit=fragments_per_commit,
                   log=log, summarize=False).write


def language_shares(ds) -> list[dict]:
    """Rows per detected language, largest first: ``[{"lang", "rows", "share"}]``."""
    if LANG.name not in ds.schema.names:
        return []
    col = ds.to_table(columns=[LANG.name]).column(LANG.name)
    counts = pc.value_counts(col.combine_chunks() if col.num_chunks else pa.array([], pa.string()))
    total = len(col)
    out = [{"lang": c["values"].as_py(), "rows": c["counts"].as_py()} for c in counts]
    out = [r for r in out if r["lang"] is not None]
    for r in out:
        r["share"] = round(r["rows"] / total, 4) if total else 0.0
    return sorted(out, key=lambda r: (-r["rows"], r["lang"]))


def main_languages(ds, min_share: float) -> list[str]:
    """The corpus's main languages: each detected language (not ``und``) that holds at least
    ``min_share`` of the rows. Empty when ``lang`` has not been computed."""
    return sorted(r["lang"] for r in language_shares(ds)
                  if r["lang"] != UNDETERMINED and r["share"] >= min_share)


def summary(table: Table, report: ColumnWriteReport, settings) -> dict:
    shares = language_shares(table.newest())
    return {"languages": Markdown(markdown_table(shares[:15])), "distinct_languages": len(shares)}


PRODUCER = ColumnProducer(
    name="detected_language",
    doc="`lang` (ISO 639-1 code, 'und' when undetermined) and `lang_score` (share of the text in "
        "that language), detected by CLD2 from `text` on every row, offline (the model is inside "
        "the pycld2 wheel). Not the source's own `language` label. `curation_rules` keeps the "
        "corpus's main languages by default.",
    fields=FIELDS, descriptions=DESCRIPTIONS, compute=fixed(fragment_language), summary=summary)
