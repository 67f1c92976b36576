"""Personal data in the text: per-document counts of e-mail addresses, phone numbers, IP
addresses and payment card numbers, and their character spans.

Columns: ``pii_email_count``, ``pii_phone_count``, ``pii_ip_count``, ``pii_card_count`` (int32)
and ``pii_spans`` (list of ``{kind, start, end}``: code-point offsets into ``text``, end
exclusive, sorted by start, never overlapping). The text itself is never changed; ``token_ids``
with ``redact_pii`` encodes a copy where each span is replaced by its placeholder
(``redact``).

How a batch is scanned: one vectorised RE2 pass (``pyarrow.compute``) picks the documents that
could hold each kind at all (an ``@``, a run of digits with separators, hex groups with colons);
only those are scanned with Python's ``re`` for exact spans and checked: IP addresses with
``ipaddress``, card numbers with the Luhn checksum and a known issuer prefix, phone numbers by
their digit count. Every quantifier is bounded, so a huge document costs linear time. Where two
matches overlap, the more specific kind wins (e-mail, card, IP, phone).
"""

from __future__ import annotations

import bisect
import ipaddress
import re
from collections.abc import Iterator

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from lance_assets.table import Table
from lance_assets.table.columns import ColumnWriteReport
from lance_assets.table.producer import ColumnProducer

KINDS = ("email", "card", "ip", "phone")  # overlap priority, most specific first
SPAN = pa.struct([pa.field("kind", pa.string()), pa.field("start", pa.int32()),
                  pa.field("end", pa.int32())])
COUNT_FIELDS = {kind: pa.field(f"pii_{kind}_count", pa.int32()) for kind in
                ("email", "phone", "ip", "card")}
PII_SPANS = pa.field("pii_spans", pa.list_(SPAN))
FIELDS = [*COUNT_FIELDS.values(), PII_SPANS]
COLUMNS = [f.name for f in FIELDS]
DESCRIPTIONS = {
    "pii_email_count": "E-mail addresses in `text` (local@domain.tld).",
    "pii_phone_count": "Phone numbers in `text`: 7-15 digits in a phone layout (+country code, "
                       "(area) code, groups separated by spaces, dots or dashes).",
    "pii_ip_count": "IPv4 and IPv6 addresses in `text` (validated by Python's ipaddress).",
    "pii_card_count": "Payment card numbers in `text`: 13-19 digits passing the Luhn checksum "
                      "with a known issuer prefix (Visa, Mastercard, Amex, Discover, JCB, Diners).",
    "pii_spans": "Where each one is: {kind, start, end} code-point offsets into `text` (end "
                 "exclusive), sorted, non-overlapping. `token_ids` with redact_pii replaces "
                 "them by placeholders in what it tokenizes; `text` never changes.",
}
PLACEHOLDERS = {"email": "<EMAIL>", "phone": "<PHONE>", "ip": "<IP_ADDRESS>",
                "card": "<CARD_NUMBER>"}
BATCH_ROWS = 2048

# Exact patterns (Python re), every quantifier bounded. Lookarounds keep a match from starting
# or ending inside a longer token.
PATTERNS = {
    "email": re.compile(
        r"(?<![\w.%+-])[A-Za-z0-9][A-Za-z0-9._%+-]{0,63}@[A-Za-z0-9](?:[A-Za-z0-9-]{0,62}"
        r"[A-Za-z0-9])?(?:\.[A-Za-z0-9](?:[A-Za-z0-9-]{0,62}[A-Za-z0-9])?){0,8}\.[A-Za-z]{2,24}"
        r"(?![\w-])"),
    "card": re.compile(r"(?<![\d.,-])\d(?:[ -]?\d){12,18}(?![\d])(?!\.\d)(?!,\d)"),
    "ip": re.compile(
        r"(?<![\w.:])(?:(?:\d{1,3}\.){3}\d{1,3}"
        r"|(?:[0-9A-Fa-f]{1,4}:){1,7}(?::|(?::?[0-9A-Fa-f]{1,4}){1,7})"
        r"|::(?:[0-9A-Fa-f]{1,4}(?::[0-9A-Fa-f]{1,4}){0,6})?)(?![\w:]|\.\w)"),
    "phone": re.compile(
        r"(?<![\w+.-])(?:\+\d{1,3}(?:[ .-]?\(\d{1,4}\)|[ .-]?\d{1,4})?(?:[ .-]?\d{1,8}){1,5}"
        r"|\(\d{1,5}\)[ .-]?\d{2,4}(?:[ .-]?\d{2,4}){1,3}"
        r"|\d{2,4}(?:[ .-]\d{2,4}){1,4})(?![\w-]|\.\d)"),
}
# Cheap RE2 prefilters (pyarrow.compute): a document that fails one cannot match that kind.
PREFILTERS = {
    "email": r"[A-Za-z0-9]@[A-Za-z0-9]",
    "card": r"\d(?:[ -]?\d){12}",
    "ip": r"\d\.\d{1,3}\.\d|[0-9A-Fa-f]:[0-9A-Fa-f]*:",
    "phone": r"\d[ .)-]+\d",
}
CARD_PREFIX_RE = re.compile(r"^(?:4|5[1-5]|2(?:2[2-9]|[3-6]\d|7[01]|720)|3[47]|6011|65|64[4-9]|35"
                            r"|36|38|30[0-5])")


PHONE_LAYOUT_RE = re.compile(r"\d{3}([ .-])\d{3}\1\d{4}|0\d{1,4}(?:[ .-]\d{2,4}){2,3}")


def luhn_ok(digits: str) -> bool:
    total = 0
    for i, ch in enumerate(reversed(digits)):
        d = ord(ch) - 48
        if i % 2:
            d = d * 2 - 9 if d > 4 else d * 2
        total += d
    return total % 10 == 0


def _valid(kind: str, match: str) -> bool:
    if kind == "email":
        return True
    if kind == "card":
        digits = re.sub(r"[ -]", "", match)
        return 13 <= len(digits) <= 19 and bool(CARD_PREFIX_RE.match(digits)) and luhn_ok(digits)
    if kind == "ip":
        try:
            addr = ipaddress.ip_address(match)
        except ValueError:
            return False
        # an IPv6 literal needs two colons at least; "1:2" style times are not addresses
        return addr.version == 4 or match.count(":") >= 2
    digits = sum(c.isdigit() for c in match)
    if not 7 <= digits <= 15:
        return False
    # a number with separators is a phone number only in a phone layout: an international
    # prefix, an (area) code, North American 3-3-4, or a national number with a trunk 0
    return (match.startswith(("+", "(")) or bool(PHONE_LAYOUT_RE.fullmatch(match)))


def find_spans(text: str, kinds: tuple[str, ...] = KINDS) -> list[tuple[str, int, int]]:
    """(kind, start, end) of every personal-data match in ``text``: validated, sorted by
    start, overlaps resolved in favour of the earlier kind of ``KINDS``.

    The spans taken so far are kept sorted and never overlap, so their ends are sorted too and
    one bisection tells whether a new match overlaps any of them: O(n log n) in the matches, so
    a huge document full of addresses costs no more than its length."""
    starts: list[int] = []
    ends: list[int] = []
    spans: list[tuple[str, int, int]] = []
    for kind in KINDS:
        if kind not in kinds:
            continue
        accepted = []  # one kind's matches never overlap each other (finditer)
        for m in PATTERNS[kind].finditer(text):
            start, end = m.span()
            if not _valid(kind, m.group()):
                continue
            i = bisect.bisect_left(starts, end)  # taken spans starting before this one ends
            if i and ends[i - 1] > start:
                continue
            accepted.append((kind, start, end))
        if accepted:
            spans = sorted([*spans, *accepted], key=lambda s: s[1])
            starts = [s[1] for s in spans]
            ends = [s[2] for s in spans]
    return spans


def scan(texts: pa.Array) -> pa.RecordBatch:
    """Every PII column for a batch of texts (nulls count as empty)."""
    texts = pc.fill_null(pc.cast(texts, pa.string()), "")
    if isinstance(texts, pa.ChunkedArray):
        texts = texts.combine_chunks()
    n = len(texts)
    maybe = {k: pc.match_substring_regex(texts, PREFILTERS[k]).to_numpy(zero_copy_only=False)
             for k in KINDS}
    any_kind = np.zeros(n, dtype=bool)
    for hits in maybe.values():
        any_kind |= hits
    counts = {k: np.zeros(n, dtype=np.int32) for k in KINDS}
    span_lists: list[list[dict]] = [[] for _ in range(n)]
    for i in np.flatnonzero(any_kind):
        kinds = tuple(k for k in KINDS if maybe[k][i])
        found = find_spans(texts[int(i)].as_py(), kinds)
        for kind, _start, _end in found:
            counts[kind][i] += 1
        span_lists[i] = [{"kind": k, "start": s, "end": e} for k, s, e in found]
    arrays = [pa.array(counts[k], pa.int32()) for k in COUNT_FIELDS]
    arrays.append(pa.array(span_lists, PII_SPANS.type))
    return pa.RecordBatch.from_arrays(arrays, schema=pa.schema(FIELDS))


def fragment_pii(frag) -> Iterator[pa.RecordBatch]:
    """Every PII column for one fragment (module-level: a Ray task can run it)."""
    for batch in frag.to_batches(columns=["text"], batch_size=BATCH_ROWS):
        yield scan(batch.column("text"))


def redact(texts: pa.Array, spans: pa.Array) -> pa.Array:
    """``texts`` with every span replaced by its kind's placeholder (``PLACEHOLDERS``). Rows
    without spans are passed through untouched; the input arrays are not modified."""
    if isinstance(texts, pa.ChunkedArray):
        texts = texts.combine_chunks()
    if isinstance(spans, pa.ChunkedArray):
        spans = spans.combine_chunks()
    lengths = pc.fill_null(pc.list_value_length(spans), 0).to_numpy(zero_copy_only=False)
    rows = np.flatnonzero(lengths > 0)
    if len(rows) == 0:
        return texts
    out = texts.to_pylist()
    for i in rows:
        text = out[i] or ""
        pieces, pos = [], 0
        for span in spans[int(i)].as_py():
            start, end = span["start"], span["end"]
            if not 0 <= pos <= start <= end <= len(text):
                raise ValueError(f"pii span {span} does not fit a text of {len(text)} characters "
                                 f"(row {i}): the pii columns are stale; drop them and "
                                 "materialize `personal_data` again")
            pieces += [text[pos:start], PLACEHOLDERS.get(span["kind"], "<PII>")]
            pos = end
        pieces.append(text[pos:])
        out[i] = "".join(pieces)
    return pa.array(out, pa.string())


def summary(table: Table, report: ColumnWriteReport) -> dict:
    """Rows holding at least one item of each kind."""
    ds = table.newest()
    return {f"rows_with_{kind}": ds.count_rows(filter=f"{field.name} > 0")
            for kind, field in COUNT_FIELDS.items()}


PRODUCER = ColumnProducer(
    name="personal_data",
    doc="Personal data in `text`: counts of e-mail addresses, phone numbers, IP addresses and "
        "Luhn-checked payment card numbers (`pii_*_count`), and their character spans "
        "(`pii_spans`). The text never changes; `token_ids` with `redact_pii: true` tokenizes it "
        "with the spans replaced by placeholders.",
    fields=FIELDS, descriptions=DESCRIPTIONS, compute=lambda settings, state: fragment_pii,
    summary=summary)
