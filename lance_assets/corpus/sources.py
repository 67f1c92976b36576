"""What ingest can read: the synthetic corpus and local parquet / jsonl(.gz) / txt files.

A source spec (``LANCE_ASSETS_SOURCE``) resolves to a list of *units*. Each unit has a stable
``key`` that is stored in the table's ``source`` column with its rows, so the table itself records
what has been ingested: a unit whose key is already there is skipped on the next run.
"""

from __future__ import annotations

import glob
import gzip
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterator

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.json as pajson
import pyarrow.parquet as pq

from lance_assets.corpus.synthetic import SyntheticSpec, generate

FILE_SUFFIXES = (".parquet", ".jsonl", ".jsonl.gz", ".txt")
READ_BATCH_ROWS = 1024


class SourceError(ValueError):
    """A source that cannot be read; the message names the input and the fix."""


@dataclass
class SkipCounter:
    """Rows left out of the table, by reason."""

    counts: dict[str, int] = field(default_factory=dict)

    def add(self, reason: str, n: int) -> None:
        if n:
            self.counts[reason] = self.counts.get(reason, 0) + int(n)

    @property
    def total(self) -> int:
        return sum(self.counts.values())


@dataclass
class SourceUnit:
    key: str
    read: Callable[[SkipCounter], Iterator[pa.RecordBatch]]
    """Yields batches with a ``text`` column and optionally ``doc_id``, ``url``, ``score``."""
    n_bytes: int = 0


def _synthetic_unit(spec: SyntheticSpec) -> SourceUnit:
    def read(_: SkipCounter) -> Iterator[pa.RecordBatch]:
        yield from generate(spec).to_batches(max_chunksize=READ_BATCH_ROWS)

    return SourceUnit(key=spec.key, read=read)


def _parse_synthetic(spec: str) -> SyntheticSpec:
    _, _, rows = spec.partition(":")
    if not rows:
        return SyntheticSpec()
    try:
        n = int(rows)
    except ValueError:
        raise SourceError(
            f"LANCE_ASSETS_SOURCE={spec!r}: the row count after 'synthetic:' must be an integer, "
            "e.g. synthetic:20000."
        ) from None
    if n <= 0:
        raise SourceError(f"LANCE_ASSETS_SOURCE={spec!r}: the row count must be positive.")
    return SyntheticSpec(rows=n)


def _no_text_column(path: Path, text_column: str, names: list[str]) -> SourceError:
    return SourceError(
        f"{path}: no text column {text_column!r} (columns: {', '.join(names)}). "
        "Set the text column in raw_text's run config (text_column) to the right name, "
        "or remove the file from the source."
    )


def _select_columns(table_or_batch, path: Path, text_column: str) -> pa.RecordBatch:
    """Map a source's columns onto ``text``, ``doc_id``, ``url``, ``score``."""
    names = table_or_batch.schema.names
    if text_column not in names:
        raise _no_text_column(path, text_column, names)
    cols = {"text": table_or_batch.column(text_column)}
    if "id" in names:
        cols["doc_id"] = pc.cast(table_or_batch.column("id"), pa.string())
    if "url" in names:
        cols["url"] = pc.cast(table_or_batch.column("url"), pa.string())
    if "score" in names:
        cols["score"] = pc.cast(table_or_batch.column("score"), pa.float64())
    if not pa.types.is_string(cols["text"].type) and not pa.types.is_large_string(cols["text"].type):
        raise SourceError(
            f"{path}: column {text_column!r} has type {cols['text'].type}, expected text (string)."
        )
    return pa.RecordBatch.from_pydict({k: _as_array(v) for k, v in cols.items()})


def _as_array(col) -> pa.Array:
    return col.combine_chunks() if isinstance(col, pa.ChunkedArray) else col


def _parquet_unit(path: Path, text_column: str) -> SourceUnit:
    try:
        schema = pq.read_schema(path)
    except Exception as exc:  # pyarrow raises several types for corrupt files
        raise SourceError(
            f"{path}: not a readable parquet file ({exc}). Replace or remove the file."
        ) from exc
    if text_column not in schema.names:
        raise _no_text_column(path, text_column, schema.names)

    def read(_: SkipCounter) -> Iterator[pa.RecordBatch]:
        pf = pq.ParquetFile(path)
        wanted = [c for c in (text_column, "id", "url", "score") if c in schema.names]
        for batch in pf.iter_batches(batch_size=READ_BATCH_ROWS, columns=wanted):
            yield _select_columns(batch, path, text_column)

    return SourceUnit(key=f"file:{path}", read=read, n_bytes=path.stat().st_size)


def _jsonl_unit(path: Path, text_column: str) -> SourceUnit:
    def read(_: SkipCounter) -> Iterator[pa.RecordBatch]:
        opener = gzip.open if path.name.endswith(".gz") else open
        with opener(path, "rb") as fh:
            try:
                table = pajson.read_json(fh)
            except pa.ArrowInvalid as exc:
                raise SourceError(
                    f"{path}: not valid JSON lines ({exc}). Fix or remove the file."
                ) from exc
        for batch in table.to_batches(READ_BATCH_ROWS):
            yield _select_columns(batch, path, text_column)

    return SourceUnit(key=f"file:{path}", read=read, n_bytes=path.stat().st_size)


def _txt_unit(path: Path) -> SourceUnit:
    def read(skipped: SkipCounter) -> Iterator[pa.RecordBatch]:
        try:
            text = path.read_bytes().decode("utf-8")
        except UnicodeDecodeError:
            skipped.add("not_utf8", 1)
            return
        yield pa.RecordBatch.from_pydict({"text": pa.array([text]), "doc_id": pa.array([path.name])})

    return SourceUnit(key=f"file:{path}", read=read, n_bytes=path.stat().st_size)


def _expand_paths(spec: str) -> list[Path]:
    if any(ch in spec for ch in "*?["):
        matches = [Path(p) for p in glob.glob(os.path.expanduser(spec), recursive=True)]
    else:
        p = Path(spec).expanduser()
        if not p.exists():
            raise SourceError(
                f"LANCE_ASSETS_SOURCE={spec!r}: no such file or folder. Point it at a .parquet, "
                ".jsonl, .jsonl.gz or .txt file, a folder or glob of them, or use 'synthetic'."
            )
        matches = sorted(p.rglob("*")) if p.is_dir() else [p]
    files = sorted(m.resolve() for m in matches if m.is_file() and m.name.endswith(FILE_SUFFIXES))
    if not files:
        raise SourceError(
            f"LANCE_ASSETS_SOURCE={spec!r}: no .parquet, .jsonl, .jsonl.gz or .txt files there."
        )
    return files


def resolve(spec: str, text_column: str = "text") -> list[SourceUnit]:
    """Turn a source spec into units, validating every file before anything is written."""
    spec = spec.strip()
    if spec == "synthetic" or spec.startswith("synthetic:"):
        return [_synthetic_unit(_parse_synthetic(spec))]
    if spec.startswith("hf:"):
        raise SourceError(
            f"LANCE_ASSETS_SOURCE={spec!r}: Hugging Face sources are not supported yet; download "
            "the dataset's parquet files and point LANCE_ASSETS_SOURCE at their folder."
        )
    units = []
    for path in _expand_paths(spec):
        if path.name.endswith(".parquet"):
            units.append(_parquet_unit(path, text_column))
        elif path.name.endswith((".jsonl", ".jsonl.gz")):
            units.append(_jsonl_unit(path, text_column))
        else:
            units.append(_txt_unit(path))
    return units
