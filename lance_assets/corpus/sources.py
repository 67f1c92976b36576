"""What ingest can read: the synthetic corpus, local parquet / jsonl(.gz) / txt files, and
Hugging Face datasets (streamed, for users who are online).

A source spec (``LANCE_ASSETS_SOURCE``) resolves to *units* (one file, the synthetic corpus, one
HF dataset), each read as numbered *parts* (a parquet row group, a block of JSON lines, a batch of
1024 rows). Every stored row carries its unit's ``source`` key and its ``source_part``, so the
table itself is the ingest watermark: the next run resumes after the highest part committed for
each unit, exactly once, whatever killed the previous run.
"""

from __future__ import annotations

import glob
import gzip
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterator, Optional

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.json as pajson
import pyarrow.parquet as pq

from lance_assets.corpus.synthetic import SyntheticSpec, generate

FILE_SUFFIXES = (".parquet", ".jsonl", ".jsonl.gz", ".txt")
PART_ROWS = 1024  # rows per part for sources without row groups of their own
READ_BATCH_ROWS = 1024
JSON_BLOCK_BYTES = 1 << 20

# FineWeb(-Edu) columns kept next to the text, with the types they are stored as.
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


class SourceError(ValueError):
    """A source that cannot be read; the message names the input and the fix."""


@dataclass
class SkipCounter:
    """Rows left out of the table, by reason."""

    counts: dict[str, int] = field(default_factory=dict)

    def add(self, reason: str, n: int) -> None:
        if n:
            self.counts[reason] = self.counts.get(reason, 0) + int(n)


# read(first_part, skipped) -> (part index, batch) in part order, starting at first_part
PartReader = Callable[[int, SkipCounter], Iterator[tuple[int, pa.RecordBatch]]]


@dataclass
class SourceUnit:
    key: str
    read: PartReader
    n_parts: Optional[int] = None  # known up front for parquet, synthetic and txt
    n_bytes: int = 0


@dataclass
class ResolvedSource:
    units: list[SourceUnit]
    bad_files: dict[str, str]  # file -> what is wrong and how to fix it


def _no_text_column(path, text_column: str, names: list[str]) -> str:
    return (f"no text column {text_column!r} (columns: {', '.join(names)}). Set raw_text's "
            "text_column in the run config to the right name, or move the file out of the source")


def select_columns(batch: pa.RecordBatch, where: str, text_column: str) -> pa.RecordBatch:
    """Map a source's columns onto ``text`` and the FineWeb columns we keep."""
    names = batch.schema.names
    if text_column not in names:
        raise SourceError(f"{where}: {_no_text_column(where, text_column, names)}")
    text = batch.column(text_column)
    if not (pa.types.is_string(text.type) or pa.types.is_large_string(text.type)
            or pa.types.is_binary(text.type) or pa.types.is_large_binary(text.type)):
        raise SourceError(f"{where}: column {text_column!r} has type {text.type}, expected text")
    cols = {"text": text}
    for src, (dst, typ) in MAPPED_COLUMNS.items():
        if src in names and src != text_column:
            try:
                cols[dst] = pc.cast(batch.column(src), typ)
            except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
                pass  # an optional column of an unexpected type is left out, not fatal
    return pa.RecordBatch.from_pydict(cols)


def _synthetic_unit(spec: SyntheticSpec) -> SourceUnit:
    n_parts = (spec.rows + PART_ROWS - 1) // PART_ROWS

    def read(first: int, _: SkipCounter) -> Iterator[tuple[int, pa.RecordBatch]]:
        if first >= n_parts:
            return
        table = generate(spec)
        for part in range(first, n_parts):
            for batch in table.slice(part * PART_ROWS, PART_ROWS).to_batches():
                yield part, batch

    return SourceUnit(key=spec.key, read=read, n_parts=n_parts)


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


def _parquet_unit(path: Path, text_column: str) -> SourceUnit:
    meta = pq.read_metadata(path)  # raises for a corrupt file: reported by the caller
    names = meta.schema.to_arrow_schema().names
    if text_column not in names:
        raise SourceError(_no_text_column(path, text_column, names))
    wanted = [c for c in [text_column, *MAPPED_COLUMNS] if c in names]

    def read(first: int, _: SkipCounter) -> Iterator[tuple[int, pa.RecordBatch]]:
        pf = pq.ParquetFile(path)
        for rg in range(first, pf.num_row_groups):
            for batch in pf.iter_batches(batch_size=READ_BATCH_ROWS, row_groups=[rg], columns=wanted):
                yield rg, select_columns(batch, str(path), text_column)

    return SourceUnit(key=f"file:{path}", read=read, n_parts=meta.num_row_groups,
                      n_bytes=path.stat().st_size)


def _jsonl_unit(path: Path, text_column: str) -> SourceUnit:
    def read(first: int, _: SkipCounter) -> Iterator[tuple[int, pa.RecordBatch]]:
        opener = gzip.open if path.name.endswith(".gz") else open
        with opener(path, "rb") as fh:
            try:
                reader = pajson.open_json(
                    fh, read_options=pajson.ReadOptions(block_size=JSON_BLOCK_BYTES))
            except pa.ArrowInvalid as exc:
                if "Empty JSON" in str(exc):
                    return  # an empty file: nothing to ingest
                raise SourceError(f"{path}: not valid JSON lines ({exc}). Fix or remove the file.") from exc
            for part, batch in enumerate(reader):
                if part >= first:
                    yield part, select_columns(batch, str(path), text_column)

    return SourceUnit(key=f"file:{path}", read=read, n_bytes=path.stat().st_size)


def _txt_unit(path: Path) -> SourceUnit:
    def read(first: int, skipped: SkipCounter) -> Iterator[tuple[int, pa.RecordBatch]]:
        if first > 0:
            return
        try:
            text = path.read_bytes().decode("utf-8")
        except UnicodeDecodeError:
            skipped.add("not_utf8", 1)
            return
        yield 0, pa.RecordBatch.from_pydict({"text": pa.array([text]), "doc_id": pa.array([path.name])})

    return SourceUnit(key=f"file:{path}", read=read, n_parts=1, n_bytes=path.stat().st_size)


def _hf_unit(spec: str, text_column: str, data_files: Optional[list[str]]) -> SourceUnit:
    """``hf:DATASET[:CONFIG]`` streamed with Hugging Face ``datasets`` (needs the network, except
    for local builders such as ``hf:parquet`` with ``data_files``)."""
    _, _, rest = spec.partition(":")
    name, _, config = rest.partition(":")
    if not name:
        raise SourceError(f"LANCE_ASSETS_SOURCE={spec!r}: expected hf:DATASET or hf:DATASET:CONFIG")

    def read(first: int, _: SkipCounter) -> Iterator[tuple[int, pa.RecordBatch]]:
        try:
            import datasets
        except ImportError as exc:
            raise SourceError(f"{spec}: install Hugging Face datasets (pip install datasets)") from exc
        ds = datasets.load_dataset(name, config or None, split="train", streaming=True,
                                   data_files=data_files)
        ds = ds.skip(first * PART_ROWS)
        for offset, rows in enumerate(ds.iter(batch_size=PART_ROWS)):
            batch = pa.RecordBatch.from_pydict(rows)
            yield first + offset, select_columns(batch, spec, text_column)

    return SourceUnit(key=f"hf:{name}:{config}" if config else f"hf:{name}", read=read)


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
    return sorted(m.resolve() for m in matches if m.is_file() and m.name.endswith(FILE_SUFFIXES))


def resolve(spec: str, text_column: str = "text", *, hf_data_files: Optional[list[str]] = None,
            ) -> ResolvedSource:
    """Turn a source spec into units. Files that cannot be read are reported, not fatal."""
    spec = spec.strip()
    if spec == "synthetic" or spec.startswith("synthetic:"):
        return ResolvedSource([_synthetic_unit(_parse_synthetic(spec))], {})
    if spec.startswith("hf:"):
        return ResolvedSource([_hf_unit(spec, text_column, hf_data_files)], {})
    units, bad = [], {}
    for path in _expand_paths(spec):
        try:
            if path.name.endswith(".parquet"):
                units.append(_parquet_unit(path, text_column))
            elif path.name.endswith((".jsonl", ".jsonl.gz")):
                units.append(_jsonl_unit(path, text_column))
            else:
                units.append(_txt_unit(path))
        except SourceError as exc:
            bad[str(path)] = str(exc)
        except (OSError, pa.ArrowException) as exc:
            bad[str(path)] = f"not a readable {path.suffix} file ({exc}); replace or remove it"
    return ResolvedSource(units, bad)
