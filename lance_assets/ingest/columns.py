"""What a source's rows become: the text, the source's own columns with their types, and the
lines that cannot be stored, skipped and named.

Every column a source brings is kept next to the text, under its own name and with its type
(FineWeb's columns under the names and types of ``MAPPED_COLUMNS``), unless the user drops it
(raw_text's ``drop_columns``). A column whose name is one the table computes (``source``,
``is_dup``, ``input_ids`` ...) is refused with the fix, never stored under another meaning.

A line is the unit of loss. A JSON line that is not an object, or whose value in any column has
another JSON type than the column (the most common type among the lines, or the table's
column's), is skipped and counted under a reason naming its file, its 1-based line number, the
column and the value's type; a parquet row whose value cannot be cast to the table's column
likewise, by its 1-based row number. A parquet file whose column has a type that cannot be cast
to the table's (another file brought it first) is refused, naming both files.
"""

from __future__ import annotations

import io
import json
import re
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Optional

import lance
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.json as pajson

from lance_assets.table import RAW_SCHEMA, Table

LINE = "_line"  # a raw batch's 1-based line (JSON lines) or row (parquet) number in its file
READ_BATCH_ROWS = 1024
MAX_LINES_NAMED = 20  # bad lines named one by one per file; the rest are counted

# FineWeb(-Edu) columns, stored under these names and types.
MAPPED_COLUMNS = {
    "id": ("doc_id", pa.string()),
    "url": ("url", pa.string()),
    "dump": ("dump", pa.string()),
    "date": ("date", pa.string()),
    "score": ("score", pa.float64()),
    "int_score": ("int_score", pa.int64()),
    "language": ("language", pa.string()),
    "language_score": ("language_score", pa.float64()),
    "token_count": ("token_count", pa.int64()),
}
MAPPED_COLUMNS["doc_id"] = MAPPED_COLUMNS["id"]  # a source that names its id as we store it
# Columns ingest itself computes: a source's column of that name would be overwritten.
COMPUTED = ("id", "source", "source_part", "n_chars", "text")
# Field metadata of a source's own column in the table: the file that brought it first.
SOURCE_COLUMN_KEY = "lance_assets.source_column"
NAME_RE = re.compile(r"^[A-Za-z][A-Za-z0-9_]{0,127}$")


class SourceError(ValueError):
    """A source that cannot be read; the message names the input and the fix."""


@dataclass
class SkipCounter:
    """Rows left out of the table, by reason; for one file: the lines read, the bad ones
    (unreadable: they count against the share a file may lose) and the first of them."""

    counts: dict[str, int] = field(default_factory=dict)
    lines: int = 0
    bad: int = 0
    first_bad: list[str] = field(default_factory=list)
    named: int = 0
    first_line: Optional[int] = None  # the first line read (where a refused rest begins)
    # the JSON type each of the table's source columns holds: a JSON-lines chunk whose lines
    # disagree on a column's type keeps the lines of this type, else of its most common one
    kinds: dict[str, str] = field(default_factory=dict)

    def add(self, reason: str, n: int) -> None:
        if n:
            self.counts[reason] = self.counts.get(reason, 0) + int(n)

    def bad_line(self, where: str, line: int, why: str, kind: str = "wrong type") -> None:
        """Line ``line`` (1-based) of ``where`` skipped because ``why``: named under its own
        reason for the first ``MAX_LINES_NAMED`` of a file, counted together after."""
        self.bad_rows(f"{kind}: {where} line {line}" + (f": {why}" if why else ""), 1, where)

    def bad_rows(self, reason: str, n: int, where: str) -> None:
        """``n`` unreadable rows counted under ``reason`` (named while few are)."""
        self.bad += n
        if len(self.first_bad) < MAX_LINES_NAMED:
            self.first_bad.append(reason)
        if " line " in reason:
            self.named += 1
            if self.named > MAX_LINES_NAMED:
                reason = f"bad lines: {where}, after the first {MAX_LINES_NAMED} named"
        self.add(reason, n)

    def merge(self, other: SkipCounter) -> None:
        for k, v in other.counts.items():
            self.add(k, v)


def check_drop_columns(drop, text_column: str = "text") -> None:
    """``drop_columns``: a list of column names, not the text (validated before any side
    effect)."""
    if not isinstance(drop, (list, tuple)) or not all(
            isinstance(c, str) and c.strip() for c in drop):
        raise SourceError(f"drop_columns {drop!r}: a list of the source's column names to leave "
                          "out, e.g. [\"file_path\"]")
    if text_column in drop:
        raise SourceError(f"drop_columns {drop!r}: {text_column!r} is the document (text_column); "
                          "it cannot be dropped")


def _kind(value) -> Optional[str]:
    """A JSON value's type, as a user reads it (None for null)."""
    if value is None:
        return None
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int):
        return "an integer"
    if isinstance(value, float):
        return "a float"
    if isinstance(value, str):
        return "a string"
    return "an array" if isinstance(value, list) else "an object"


def _family(kind: Optional[str]) -> Optional[str]:
    return "a number" if kind in ("an integer", "a float") else kind


def parse_json_lines(chunk: bytes, where: str, text_column: str, skipped: SkipCounter,
                     first_line: int) -> Iterator[pa.RecordBatch]:
    """The JSON lines of ``chunk`` (whose first line is line ``first_line`` of ``where``), as
    batches with a ``LINE`` column. A line that is not a JSON object, or that has a value whose
    type differs from its column's (the most common type of the column's values in the chunk;
    text is a string), is skipped and named (``SkipCounter.bad_line``); the others land."""
    raws = [(n, raw if raw.endswith(b"\n") else raw + b"\n")
            for n, raw in enumerate(chunk.splitlines(keepends=True), start=first_line)
            if raw.strip()]
    skipped.lines += len(raws)
    if not raws:
        return
    if skipped.first_line is None:
        skipped.first_line = raws[0][0]
    try:
        table = _read(b"".join(raw for _, raw in raws))
        lines = [n for n, _ in raws]
    except pa.ArrowInvalid:
        table, lines = _read_line_by_line(raws, where, text_column, skipped)
        if table is None:
            return
    table = table.append_column(LINE, pa.array(lines, pa.int64()))
    yield from table.to_batches(max_chunksize=READ_BATCH_ROWS)


def _read(data: bytes, strings: tuple[str, ...] = ()) -> pa.Table:
    """JSON lines as a table. JSON has no timestamps: a column pyarrow reads as one (a string
    that looks like a date) is read again as the string it is."""
    opts = pajson.ReadOptions(block_size=max(len(data) + 1, 1 << 20))
    parse = pajson.ParseOptions(explicit_schema=pa.schema([(s, pa.string()) for s in strings]),
                                unexpected_field_behavior="infer") if strings else None
    table = pajson.read_json(io.BytesIO(data), read_options=opts, parse_options=parse)
    dates = tuple(f.name for f in table.schema if pa.types.is_timestamp(f.type)
                  or pa.types.is_date(f.type))
    return _read(data, strings + dates) if dates else table


_CHANGED = re.compile(r"Column\((?P<col>[^)]*)\) changed from (?P<a>\w+) to (?P<b>\w+) in row "
                      r"(?P<row>\d+)")


def _read_line_by_line(raws: list[tuple[int, bytes]], where: str, text_column: str,
                       skipped: SkipCounter) -> tuple[Optional[pa.Table], list[int]]:
    """The chunk's lines that are JSON objects whose values have their column's type."""
    docs = []
    for n, raw in raws:
        try:
            doc = json.loads(raw)
        except ValueError:
            doc = None
        if isinstance(doc, dict):
            docs.append((n, raw, doc))
        else:
            skipped.bad_line(where, n, "", kind="malformed JSON")
    votes: dict[str, Counter] = {}
    for _, _, doc in docs:
        for key, value in doc.items():
            if value is not None:
                votes.setdefault(key, Counter())[_family(_kind(value))] += 1
    major = {k: skipped.kinds.get(k) or c.most_common(1)[0][0] for k, c in votes.items()}
    major[text_column] = "a string"
    good = []
    for n, raw, doc in docs:
        wrong = next(((k, _kind(v)) for k, v in doc.items()
                      if v is not None and _family(_kind(v)) != major.get(k)), None)
        if wrong is None:
            good.append((n, raw))
        else:
            skipped.bad_line(where, n, f"column {wrong[0]!r} holds {wrong[1]} where the "
                                       f"column holds {major[wrong[0]].split(' ', 1)[1]}s")
    while good:  # nested values whose types disagree: pyarrow names the row
        try:
            return _read(b"".join(raw for _, raw in good)), [n for n, _ in good]
        except pa.ArrowInvalid as exc:
            m = _CHANGED.search(str(exc))
            if m is None or int(m["row"]) >= len(good):
                raise SourceError(f"{where}: not valid JSON lines ({exc}). Fix or remove the "
                                  "file.") from exc
            n, _ = good.pop(int(m["row"]))
            skipped.bad_line(where, n, f"column {m['col'].lstrip('/')!r} holds {m['b']} "
                                       f"where the column holds {m['a']}")
    return None, []


def _value_kind(value) -> str:
    return _kind(value) or "null"


def _cast_rows(column: pa.Array, typ: pa.DataType, name: str, lines: pa.Array, where: str,
               skipped: SkipCounter, what: str) -> tuple[pa.Array, Optional[pa.Array]]:
    """``column`` cast to ``typ``; values that do not cast become null and their lines are
    skipped and named. Returns the cast column and a keep-mask (None: every row kept)."""
    try:
        return pc.cast(column, typ), None
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError):
        pass
    out, keep = [], []
    for value, line in zip(column.to_pylist(), lines.to_pylist()):
        try:
            out.append(pa.array([value], column.type).cast(typ)[0].as_py())
            keep.append(True)
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError):
            skipped.bad_line(where, line, f"column {name!r} holds {_value_kind(value)} "
                                          f"({repr(value)[:40]}) where {what}")
            out.append(None)
            keep.append(False)
    return pa.array(out, typ), pa.array(keep, pa.bool_())


def select_columns(batch: pa.RecordBatch, where: str, text_column: str, skipped: SkipCounter,
                   drop: tuple[str, ...] = (), reserved: Callable[[], frozenset] = frozenset
                   ) -> pa.RecordBatch:
    """``text``, FineWeb's columns under their names and types, and every other column of the
    source as it is (less ``drop``); a row whose FineWeb value does not cast is skipped and
    named. ``reserved()``: names of columns the project computes (refused)."""
    names = [n for n in batch.schema.names if n != LINE]
    if text_column not in names:
        raise SourceError(no_text_column(text_column, names))
    text = batch.column(text_column)
    if pa.types.is_null(text.type):
        text = text.cast(pa.string())
    if not (pa.types.is_string(text.type) or pa.types.is_large_string(text.type)
            or pa.types.is_binary(text.type) or pa.types.is_large_binary(text.type)):
        raise SourceError(f"column {text_column!r} has type {text.type}, expected text")
    lines = batch.column(LINE) if LINE in batch.schema.names else \
        pa.array(range(1, batch.num_rows + 1), pa.int64())
    cols: dict[str, pa.Array] = {"text": text}
    keep = None
    taken: dict[str, str] = {}
    for name in names:
        if name == text_column or name in drop:
            continue
        if name in MAPPED_COLUMNS:
            dst, typ = MAPPED_COLUMNS[name]
            col, ok = _cast_rows(batch.column(name), typ, name, lines, where, skipped,
                                 f"{dst} holds {typ}")
            keep = _both(keep, ok)
        else:
            dst, col = name, batch.column(name)
            if not NAME_RE.match(name) or name in COMPUTED or name in reserved():
                raise SourceError(
                    f"the source's column {name!r} " + (
                        "is not a plain column name (a letter, then letters, digits or _)"
                        if not NAME_RE.match(name) else "has the name of a column the table "
                        "computes") + f"; leave it out with drop_columns: [{name!r}] in "
                    "raw_text's config, or rename it in the source")
            if _untyped(col.type):
                continue  # only nulls so far: nothing to store, no type to give the column
        if dst in taken:
            raise SourceError(f"columns {taken[dst]!r} and {name!r} are both stored "
                              f"as {dst!r}; leave one out with drop_columns")
        taken[dst] = name
        cols[dst] = col
    cols[LINE] = lines
    out = pa.RecordBatch.from_pydict(cols)
    return out if keep is None else out.filter(keep)


def _untyped(typ: pa.DataType) -> bool:
    """A type that holds no information: only nulls (or empty lists and objects)."""
    if pa.types.is_null(typ):
        return True
    if pa.types.is_list(typ) or pa.types.is_large_list(typ):
        return _untyped(typ.value_type)
    return pa.types.is_struct(typ) and (typ.num_fields == 0 or all(
        _untyped(typ.field(i).type) for i in range(typ.num_fields)))


def conform(batch: pa.RecordBatch, columns: dict[str, tuple[pa.DataType, str]], where: str,
            skipped: SkipCounter, typed: bool) -> pa.RecordBatch:
    """The batch's source columns cast to the types they have in the table (``columns``: name
    -> (type, the file that brought it)). A value that does not cast skips its line, named; in a
    ``typed`` source (parquet) a whole column that does not cast refuses the file."""
    keep = None
    lines = batch.column(LINE)
    for i, name in enumerate(batch.schema.names):
        if name in ("text", LINE) or name not in columns:
            continue
        typ, origin = columns[name]
        col = batch.column(i)
        if col.type == typ:
            continue
        if typed and not _widens(col.type, typ):
            raise SourceError(
                f"column {name!r} is {col.type} in {where} but {typ} in {origin}, which brought "
                f"it first; rewrite one file with the other's type, or leave the column out "
                f"with drop_columns: [{name!r}] in raw_text's config")
        col, ok = _cast_rows(col, typ, name, lines, where, skipped,
                             f"the column holds {typ} (from {origin})")
        batch = batch.set_column(i, name, col)
        keep = _both(keep, ok)
    return batch if keep is None else batch.filter(keep)


def _both(a: Optional[pa.Array], b: Optional[pa.Array]) -> Optional[pa.Array]:
    return b if a is None else a if b is None else pc.and_(a, b)


def _widens(a: pa.DataType, b: pa.DataType) -> bool:
    """Values of type ``a`` fit type ``b`` without a change of kind (a wider integer, an integer
    as a float, a string of another width, a struct with fewer fields...)."""
    t = pa.types
    if t.is_null(a) or a == b:
        return True
    if t.is_dictionary(a):
        return _widens(a.value_type, b)
    kinds = [(t.is_integer, t.is_integer), (t.is_integer, t.is_floating),
             (t.is_floating, t.is_floating), (t.is_boolean, t.is_boolean),
             (_is_text, _is_text), (_is_bytes, _is_bytes), (t.is_timestamp, t.is_timestamp),
             (t.is_date, t.is_date), (_is_list, _is_list), (t.is_struct, t.is_struct)]
    if not any(ka(a) and kb(b) for ka, kb in kinds):
        return False
    if _is_list(a):
        return _widens(a.value_type, b.value_type)
    if t.is_struct(a):
        return all(b.get_field_index(a.field(i).name) >= 0 and _widens(
            a.field(i).type, b.field(b.get_field_index(a.field(i).name)).type)
                   for i in range(a.num_fields))
    return True


def _is_text(typ: pa.DataType) -> bool:
    return pa.types.is_string(typ) or pa.types.is_large_string(typ)


def _is_bytes(typ: pa.DataType) -> bool:
    return pa.types.is_binary(typ) or pa.types.is_large_binary(typ)


def _is_list(typ: pa.DataType) -> bool:
    return pa.types.is_list(typ) or pa.types.is_large_list(typ)


_JSON_KINDS = [(lambda t: pa.types.is_integer(t) or pa.types.is_floating(t), "a number"),
               (lambda t: _is_text(t), "a string"), (pa.types.is_boolean, "a boolean"),
               (lambda t: _is_list(t), "an array"), (pa.types.is_struct, "an object")]


class TableColumns:
    """The table's columns a source may fill: name -> (type, the file that brought it first),
    and the names the table computes (a source's column may not take one)."""

    def __init__(self, table: Table):
        self.types: dict[str, tuple[pa.DataType, str]] = {}
        self.fields: list[pa.Field] = []  # the source columns, in the table's order
        self._derived: set[str] = set()
        self._reserved: Optional[frozenset] = None
        schema = table.newest().schema if table.exists() else pa.schema([])
        for f in RAW_SCHEMA:
            if f.name not in COMPUTED:
                self.types[f.name] = (f.type, "the table (FineWeb's column)")
        for f in schema:
            origin = (f.metadata or {}).get(SOURCE_COLUMN_KEY.encode())
            if origin is not None:
                self.types[f.name] = (f.type, origin.decode())
                self.fields.append(f)
            elif f.name not in RAW_SCHEMA.names:
                self._derived.add(f.name)

    def kinds(self) -> dict[str, str]:
        """The JSON type of each source column (``SkipCounter.kinds``)."""
        out = {src: "a number" for src, (_, typ) in MAPPED_COLUMNS.items()
               if pa.types.is_integer(typ) or pa.types.is_floating(typ)}  # FineWeb's scores
        for name, (typ, _) in self.types.items():
            if name in RAW_SCHEMA.names:
                continue
            kind = next((k for test, k in _JSON_KINDS if test(typ)), None)
            if kind:
                out[name] = kind
        return out

    def reserved(self) -> frozenset:
        if self._reserved is None:  # only once a source brings a column of its own
            from lance_assets.table.producer import producers

            self._reserved = frozenset(f.name for p in producers() for f in p.fields) | \
                frozenset(self._derived)
        return self._reserved

    def schema(self) -> pa.Schema:
        return pa.schema(list(RAW_SCHEMA) + self.fields)

    def new_in(self, batch: pa.RecordBatch, where: str) -> list[pa.Field]:
        return [pa.field(f.name, f.type, metadata={SOURCE_COLUMN_KEY: where})
                for f in batch.schema if f.name not in self.types and f.name not in
                ("text", LINE)]

    def add(self, table: Table, new: list[pa.Field], log: Callable[[str], None]) -> None:
        """Add ``new`` to the table, null for every row stored so far (a commit of the schema
        alone: no data file is written or rewritten)."""
        def attempt(ds: lance.LanceDataset) -> None:
            missing = []
            for f in new:
                if f.name not in ds.schema.names:
                    missing.append(f)
                elif ds.schema.field(f.name).type != f.type:
                    raise SourceError(f"column {f.name!r} was added to the table as "
                                      f"{ds.schema.field(f.name).type} meanwhile, not {f.type}")
            if missing:
                ds.add_columns(pa.schema(missing))

        table.commit(f"add source columns {[f.name for f in new]}", attempt, log=log)
        for f in new:
            self.types[f.name] = (f.type, f.metadata[SOURCE_COLUMN_KEY.encode()].decode())
            self.fields.append(f)
        log(f"added the source's column(s) {', '.join(f.name for f in new)} to the table")

    def drop(self, table: Table, names: list[str], log: Callable[[str], None]) -> None:
        """Take ``names`` out again: columns that a refused file added and no stored row holds."""
        def attempt(ds: lance.LanceDataset) -> None:
            present = [n for n in names if n in ds.schema.names]
            if present:
                ds.drop_columns(present)

        table.commit(f"drop source columns {names}", attempt, log=log)
        for name in names:
            self.types.pop(name, None)
        self.fields = [f for f in self.fields if f.name not in names]
        log(f"took the column(s) {', '.join(names)} of a file not ingested out of the table again")


def no_text_column(text_column: str, names: list[str]) -> str:
    return (f"no text column {text_column!r} (columns: {', '.join(names)}). Set raw_text's "
            "text_column in the run config to the right name, or move the file out of the source")
