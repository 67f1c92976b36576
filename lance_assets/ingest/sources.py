"""What ingest can read: the synthetic corpus, local parquet / jsonl(.gz) / txt files, and
Hugging Face datasets (streamed, for users who are online).

A source spec (``LANCE_ASSETS_SOURCE``) resolves to *units* (one file, the synthetic corpus, one
HF dataset), each read as numbered *parts* (a parquet row group, a block of JSON lines, a batch of
1024 rows). Every stored row carries its unit's ``source`` key and its ``source_part``, so the
table itself is the ingest watermark: the next run resumes after the highest part committed for
each unit, exactly once, whatever killed the previous run.

A file is known by its content: its key is ``file:PATH#FP.SHA`` (``FP``: size, first and last
64 KiB, checked on every run; ``SHA``: the sha256 of every byte, computed once), and a file at a
path the table does not know is matched to the keys of the same content elsewhere, so a moved,
renamed or copied file is not ingested twice. A file that changed since it was ingested is
noticed, never skipped in silence. JSON lines files may grow: each ingest reads the byte range
that is new since the last one as a *generation* ``file:PATH@START-END#FP.SHA`` (its sha256
chained on the one before), so rows appended to a ``.jsonl`` are ingested by the next run. Any
other change (a rewritten parquet, a jsonl whose ingested bytes changed) is refused with a
message naming the file. A unit yields the source's columns as read, each row with its 1-based
line or row number (``columns.LINE``); what they become in the table is ``columns``' job.
"""

from __future__ import annotations

import glob
import gzip
import hashlib
import json
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import pyarrow as pa
import pyarrow.parquet as pq

from lance_assets.ingest import synthetic_web
from lance_assets.ingest.columns import LINE, SkipCounter, SourceError, no_text_column
from lance_assets.ingest.columns import parse_json_lines as _parse_json_lines
from lance_assets.ingest.synthetic import SyntheticSpec, generate

ENV = "LANCE_ASSETS_SOURCE"  # where a source spec comes from, unless raw_text's run config
FILE_SUFFIXES = (".parquet", ".jsonl", ".jsonl.gz", ".txt")
PART_ROWS = 1024  # rows per part for sources without row groups of their own
JSONL_PART_BYTES = 1 << 20  # a JSON-lines part: the lines that start in one MiB of the file
FINGERPRINT_EDGE_BYTES = 64 << 10

# read(first_part, skipped) -> (part index, batch) in part order, starting at first_part
PartReader = Callable[[int, SkipCounter], Iterator[tuple[int, pa.RecordBatch]]]


@dataclass
class SourceUnit:
    key: str
    read: PartReader
    n_parts: Optional[int] = None  # known up front for parquet, synthetic and txt
    n_bytes: int = 0
    where: str = ""  # how messages name it: the file's path (else the key)
    typed: bool = False  # its columns have one type for the whole unit (parquet)

    def __post_init__(self):
        self.where = self.where or self.key


@dataclass
class ResolvedSource:
    units: list[SourceUnit]
    bad_files: dict[str, str]  # file -> what is wrong and how to fix it
    warning: Optional[str] = None  # e.g. a folder or glob that matches no file


def fingerprint(path: Path, end: int) -> str:
    """A cheap content fingerprint of the first ``end`` bytes of ``path``: the length, the
    first and the last 64 KiB. It changes when a file is replaced, rewritten or truncated."""
    h = hashlib.sha256(str(end).encode())
    with open(path, "rb") as fh:
        h.update(fh.read(min(FINGERPRINT_EDGE_BYTES, end)))
        tail = max(0, end - FINGERPRINT_EDGE_BYTES)
        fh.seek(tail)
        h.update(fh.read(end - tail))
    return h.hexdigest()[:16]


def content_digest(path: Path, start: int = 0, end: int | None = None, prev: str = "") -> str:
    """The sha256 of bytes ``[start, end)`` of ``path``, chained on ``prev`` (a JSON-lines
    file's generations: each digest covers every byte up to its end, reading only its own)."""
    h = hashlib.sha256(prev.encode())
    with open(path, "rb") as fh:
        fh.seek(start)
        left = (path.stat().st_size if end is None else end) - start
        while left > 0:
            block = fh.read(min(left, 1 << 20))
            if not block:
                break
            h.update(block)
            left -= len(block)
    return h.hexdigest()[:32]


def file_key(path: Path, fp: str, digest: str) -> str:
    return f"file:{path}#{fp}.{digest}"


def generation_key(path: Path, start: int, end: int, fp: str, digest: str) -> str:
    return f"file:{path}@{start}-{end}#{fp}.{digest}"


@dataclass(frozen=True)
class StoredKey:
    """A file unit key read back from the table."""

    key: str
    path: str
    fp: Optional[str]  # None for keys written before fingerprints existed
    start: Optional[int] = None  # a JSON-lines generation's byte range
    end: Optional[int] = None
    digest: Optional[str] = None  # the content's sha256 (None: keys written before it)


def parse_file_key(key: str) -> Optional[StoredKey]:
    if not key.startswith("file:"):
        return None
    body, hash_sep, fp = key[len("file:"):].rpartition("#")
    if not hash_sep:
        return StoredKey(key, key[len("file:"):], None)
    fp, _, digest = fp.partition(".")
    path, at, span = body.rpartition("@")
    if at and "-" in span:
        lo, _, hi = span.partition("-")
        if lo.isdigit() and hi.isdigit():
            return StoredKey(key, path, fp, int(lo), int(hi), digest or None)
    return StoredKey(key, body, fp, digest=digest or None)


def stored_keys_by_path(keys) -> dict[str, list[StoredKey]]:
    out: dict[str, list[StoredKey]] = {}
    for key in keys:
        parsed = parse_file_key(key)
        if parsed is not None:
            out.setdefault(parsed.path, []).append(parsed)
    return out


def _synthetic_unit(spec: SyntheticSpec) -> SourceUnit:
    n_parts = (spec.rows + PART_ROWS - 1) // PART_ROWS

    def read(first: int, skipped: SkipCounter) -> Iterator[tuple[int, pa.RecordBatch]]:
        if first >= n_parts:
            return
        table = generate(spec)
        for part in range(first, n_parts):
            for batch in table.slice(part * PART_ROWS, PART_ROWS).to_batches():
                skipped.lines += batch.num_rows
                yield part, batch

    return SourceUnit(key=spec.key, read=read, n_parts=n_parts)


def _synthetic_web_unit(spec: synthetic_web.WebSpec) -> SourceUnit:
    """The FineWeb-shaped corpus, one part per generator block (made on demand, so a resumed
    ingest makes only the blocks after its watermark and nothing holds the whole corpus)."""
    assert synthetic_web.BLOCK_ROWS == PART_ROWS

    def read(first: int, skipped: SkipCounter) -> Iterator[tuple[int, pa.RecordBatch]]:
        for part in range(first, spec.n_blocks):
            for batch in synthetic_web.generate_block(spec, part).to_batches():
                skipped.lines += batch.num_rows
                yield part, batch

    return SourceUnit(key=spec.key, read=read, n_parts=spec.n_blocks)


def _parse_rows(spec: str, default: int, label: str) -> int:
    name, _, rows = spec.partition(":")
    if not rows:
        return default
    try:
        n = int(rows.replace("_", ""))
    except ValueError:
        raise SourceError(
            f"{label}={spec!r}: the row count after '{name}:' must be an integer, "
            f"e.g. {name}:20000."
        ) from None
    if n <= 0:
        raise SourceError(f"{label}={spec!r}: the row count must be positive.")
    return n


def _parse_synthetic(spec: str, label: str = ENV) -> SyntheticSpec:
    return SyntheticSpec(rows=_parse_rows(spec, SyntheticSpec().rows, label))


def _parse_synthetic_web(spec: str, label: str = ENV) -> synthetic_web.WebSpec:
    return synthetic_web.WebSpec(rows=_parse_rows(spec, synthetic_web.WebSpec().rows, label))


def _parquet_unit(path: Path, text_column: str, key: str) -> SourceUnit:
    meta = pq.read_metadata(path)  # raises for a corrupt file: reported by the caller
    names = meta.schema.to_arrow_schema().names
    if text_column not in names:
        raise SourceError(no_text_column(text_column, names))
    starts = [0]
    for rg in range(meta.num_row_groups):
        starts.append(starts[-1] + meta.row_group(rg).num_rows)

    def read(first: int, skipped: SkipCounter) -> Iterator[tuple[int, pa.RecordBatch]]:
        """Row group by row group, each row with its 1-based row number (``LINE``): a group
        that cannot be decoded (a damaged page) is skipped whole and counted under a reason
        naming the file and the group; the groups after it are read (and a rerun skips the
        same group again)."""
        pf = pq.ParquetFile(path)
        for rg in range(first, pf.num_row_groups):
            n = pf.metadata.row_group(rg).num_rows
            skipped.lines += n
            if skipped.first_line is None:
                skipped.first_line = starts[rg] + 1
            try:
                group = pf.read_row_group(rg)
            except (OSError, pa.ArrowException) as exc:
                cause = str(exc).splitlines()[0][:120] if str(exc) else type(exc).__name__
                skipped.bad_rows(f"damaged: {path} row group {rg} ({cause}); re-download or "
                                 "rewrite the file", n, str(path))
                continue
            group = group.append_column(LINE, pa.array(range(starts[rg] + 1, starts[rg] + n + 1),
                                                       pa.int64()))
            for batch in group.to_batches(max_chunksize=PART_ROWS):
                yield rg, batch

    return SourceUnit(key=key, read=read, n_parts=meta.num_row_groups,
                      n_bytes=path.stat().st_size, where=str(path), typed=True)


def _lines_before(path: Path, offset: int) -> int:
    """How many lines start before byte ``offset`` of ``path``."""
    n = 0
    with open(path, "rb") as fh:
        while offset > 0:
            block = fh.read(min(offset, 1 << 20))
            if not block:
                break
            n += block.count(b"\n")
            offset -= len(block)
    return n


def _line_start_at_or_after(fh, pos: int, lo: int, hi: int) -> int:
    """The first offset in [pos, hi] where a line starts (``lo`` always starts one)."""
    if pos <= lo:
        return lo
    if pos >= hi:
        return hi
    fh.seek(pos - 1)
    if fh.read(1) == b"\n":
        return pos
    fh.readline()
    return min(fh.tell(), hi)


def _jsonl_generation_unit(path: Path, text_column: str, start: int, end: int, fp: str,
                           digest: str = "", key: str | None = None) -> SourceUnit:
    """Bytes [start, end) of a JSON-lines file; part i holds the lines that *start* in the
    i-th MiB of the range, so parts are fixed by the bytes alone and a line of any length
    (even longer than a part) is read whole, once."""
    n_parts = max(1, -(-(end - start) // JSONL_PART_BYTES))

    def read(first: int, skipped: SkipCounter) -> Iterator[tuple[int, pa.RecordBatch]]:
        line = None  # the 1-based number of the part's first line, counted once, then carried
        with open(path, "rb") as fh:
            for part in range(first, n_parts):
                lo = _line_start_at_or_after(fh, start + part * JSONL_PART_BYTES, start, end)
                hi = _line_start_at_or_after(fh, start + (part + 1) * JSONL_PART_BYTES, start, end)
                if hi <= lo:
                    continue
                line = _lines_before(path, lo) + 1 if line is None else line
                fh.seek(lo)
                chunk = fh.read(hi - lo)
                for batch in _parse_json_lines(chunk, str(path), text_column, skipped, line):
                    yield part, batch
                line += chunk.count(b"\n")

    return SourceUnit(key=key or generation_key(path, start, end, fp, digest), read=read,
                      n_parts=n_parts, n_bytes=end - start, where=str(path))


def _jsonl_gz_unit(path: Path, text_column: str, key: str) -> SourceUnit:
    """A gzipped JSON-lines file, read as a stream: part i is the i-th run of whole lines of
    about one MiB (uncompressed)."""

    def read(first: int, skipped: SkipCounter) -> Iterator[tuple[int, pa.RecordBatch]]:
        with gzip.open(path, "rb") as fh:
            part, line = 0, 1
            while True:
                chunk = fh.read(JSONL_PART_BYTES)
                if not chunk:
                    return
                if not chunk.endswith(b"\n"):
                    chunk += fh.readline()
                if part >= first:
                    for batch in _parse_json_lines(chunk, str(path), text_column, skipped, line):
                        yield part, batch
                part, line = part + 1, line + chunk.count(b"\n")

    return SourceUnit(key=key, read=read, n_bytes=path.stat().st_size, where=str(path))


def _txt_unit(path: Path, key: str) -> SourceUnit:
    def read(first: int, skipped: SkipCounter) -> Iterator[tuple[int, pa.RecordBatch]]:
        if first > 0:
            return
        skipped.lines += 1
        try:
            text = path.read_bytes().decode("utf-8")
        except UnicodeDecodeError:
            skipped.add("not_utf8", 1)
            skipped.bad += 1
            skipped.first_bad.append(f"{path}: not UTF-8 text")
            return
        yield 0, pa.RecordBatch.from_pydict({"text": pa.array([text]), "doc_id": pa.array([path.name])})

    return SourceUnit(key=key, read=read, n_parts=1, n_bytes=path.stat().st_size, where=str(path))


HF_SPLIT = "train"


def _hf_unit(spec: str, text_column: str, data_files: Optional[list[str]],
             label: str = ENV) -> SourceUnit:
    """``hf:DATASET[:CONFIG]`` streamed with Hugging Face ``datasets`` (needs the network, except
    for local builders such as ``hf:parquet`` with ``data_files``).

    Its watermark is a row offset, which means something only for one exact list of files. So
    the unit key names the dataset, config, split, the revision the hub resolved (a commit
    sha; ``local`` for local files) and a digest of the file list with each file's origin
    (revision, or a local file's modification time), and the stream is read at that revision.
    A hub update or another file list is a new unit, read from its start: no stored offset is
    ever applied to other files (rows it repeats are exact duplicates, flagged by dedup)."""
    _, _, rest = spec.partition(":")
    name, _, config = rest.partition(":")
    if not name:
        raise SourceError(f"{label}={spec!r}: expected hf:DATASET or hf:DATASET:CONFIG")
    try:
        import datasets
    except ImportError as exc:
        raise SourceError(f"{spec}: install Hugging Face datasets (pip install -e '.[hf]')") from exc
    try:
        builder = datasets.load_dataset_builder(name, config or None, data_files=data_files)
    except Exception as exc:  # offline, unknown dataset, bad config: the user's input
        raise SourceError(f"{spec}: cannot resolve the dataset's files ({exc}); check the name "
                          "and config, and that the hub is reachable") from exc
    files = (builder.config.data_files or {}).get(HF_SPLIT)
    if not files:
        raise SourceError(f"{spec}: no {HF_SPLIT!r} split among "
                          f"{sorted(builder.config.data_files or {})}")
    origins = [[str(x) for x in o] for o in getattr(files, "origin_metadata", [()] * len(files))]
    revision = next((o[1] for o in origins if len(o) == 2), None)  # hub files: (repo, sha)
    digest = hashlib.sha256(json.dumps([list(map(str, files)), origins]).encode()).hexdigest()
    key = (f"hf:{name}" + (f":{config}" if config else "")
           + f"/{HF_SPLIT}@{revision or 'local'}#{digest[:16]}")

    def read(first: int, skipped: SkipCounter) -> Iterator[tuple[int, pa.RecordBatch]]:
        ds = datasets.load_dataset(name, config or None, split=HF_SPLIT, streaming=True,
                                   data_files=data_files, revision=revision)
        ds = ds.skip(first * PART_ROWS)
        for offset, rows in enumerate(ds.iter(batch_size=PART_ROWS)):
            batch = pa.RecordBatch.from_pydict(rows)
            skipped.lines += batch.num_rows
            yield first + offset, batch.append_column(LINE, pa.array(
                range((first + offset) * PART_ROWS + 1, (first + offset) * PART_ROWS
                      + batch.num_rows + 1), pa.int64()))

    return SourceUnit(key=key, read=read, typed=True)


def expand_paths(spec: str, label: str = ENV) -> list[Path]:
    """The ingestible files a local spec names (a file, a folder searched recursively, or a
    glob), sorted; a path that does not exist is an error, a folder or glob with none is not."""
    if any(ch in spec for ch in "*?["):
        matches = [Path(p) for p in glob.glob(os.path.expanduser(spec), recursive=True)]
    else:
        p = Path(spec).expanduser()
        if not p.exists():
            raise SourceError(
                f"{label}={spec!r}: no such file or folder. Point it at a .parquet, "
                ".jsonl, .jsonl.gz or .txt file, a folder or glob of them, or use 'synthetic'."
            )
        matches = sorted(p.rglob("*")) if p.is_dir() else [p]
    return sorted(m.resolve() for m in matches if m.is_file() and m.name.endswith(FILE_SUFFIXES))


def _changed(path: Path, stored: list[StoredKey], now: str) -> str:
    return (f"changed since it was ingested (content fingerprint {now}, stored "
            f"{', '.join(sorted({k.fp or '?' for k in stored}))}); the rows already ingested from "
            "it stay in the table. Files are read once: put new documents in a new file (a "
            ".jsonl may also grow by appending lines), or move this file out of the source")


def _same_content(path: Path, by_path: dict[str, list[StoredKey]],
                  by_fp: dict[str, list[StoredKey]]) -> list[StoredKey]:
    """The keys a file of the same content was stored under at another path (moved, renamed or
    copied): its size and edges, then its whole content's digest where the key has one (a
    JSON-lines file that grew since: its ingested bytes, if its old path is gone)."""
    size = path.stat().st_size
    for k in by_fp.get(fingerprint(path, size), []):
        if _same_bytes(path, by_path[k.path], k):
            return by_path[k.path]
    if not path.name.endswith(".jsonl"):
        return []
    for old, group in by_path.items():
        gens = sorted((k for k in group if k.end is not None), key=lambda k: k.end)
        if gens and gens[-1].end < size and not Path(old).exists() and \
                fingerprint(path, gens[-1].end) == gens[-1].fp and _same_bytes(path, group,
                                                                               gens[-1]):
            return group
    return []


def _same_bytes(path: Path, group: list[StoredKey], key: StoredKey) -> bool:
    """``path`` holds the bytes ``key`` records a digest of: the whole file, or a JSON-lines
    file's generations up to ``key``'s end (each digest chained on the one before). Keys
    without a digest (an earlier release's) are trusted on their size and edges."""
    if key.end is None:
        return key.digest is None or key.digest == content_digest(path)
    prev = ""
    for g in sorted((k for k in group if k.end is not None and k.end <= key.end),
                    key=lambda k: k.end):
        got = content_digest(path, g.start, g.end, prev)
        if g.digest is not None and g.digest != got:
            return False
        prev = g.digest or ""
    return True


def _file_units(path: Path, text_column: str, stored: list[StoredKey]) -> list[SourceUnit]:
    """The units to read for ``path``, given the keys the table already holds for it (or for
    a file of the same content elsewhere)."""
    size = path.stat().st_size
    if path.name.endswith(".jsonl"):
        return _jsonl_units(path, text_column, size, stored)
    legacy = [k for k in stored if k.fp is None]
    fp = fingerprint(path, size)
    same = next((k for k in stored if k.fp == fp), None)
    key = same.key if same else legacy[0].key if legacy else \
        file_key(path, fp, content_digest(path))
    if stored and not legacy and same is None:
        raise SourceError(_changed(path, stored, fp))
    if path.name.endswith(".parquet"):
        return [_parquet_unit(path, text_column, key)]
    if path.name.endswith(".jsonl.gz"):
        return [_jsonl_gz_unit(path, text_column, key)]
    return [_txt_unit(path, key)]


def _jsonl_units(path: Path, text_column: str, size: int,
                 stored: list[StoredKey]) -> list[SourceUnit]:
    gens = sorted((k for k in stored if k.end is not None), key=lambda k: k.end)
    if not gens:
        if stored:  # ingested before generations existed: its byte ranges are unknown
            return []
        return [_jsonl_generation_unit(path, text_column, 0, size, fingerprint(path, size),
                                       content_digest(path, 0, size))] if size else []
    last = gens[-1]
    if size < last.end or fingerprint(path, last.end) != last.fp:
        raise SourceError(_changed(path, gens, fingerprint(path, size)))
    # earlier generations first (a killed run may have left one unfinished), then the new bytes
    units = [_jsonl_generation_unit(path, text_column, g.start, g.end, g.fp, key=g.key)
             for g in gens]
    if size > last.end:
        with open(path, "rb") as fh:
            fh.seek(last.end - 1)
            ends_line = fh.read(1) == b"\n"
        if not ends_line:
            raise SourceError(
                "grew since it was ingested, but its last ingested line had no newline, so the "
                "new bytes continue a stored document. End every line with a newline; to ingest "
                "the new lines, move them to a new file")
        units.append(_jsonl_generation_unit(  # its digest chained on the one before
            path, text_column, last.end, size, fingerprint(path, size),
            content_digest(path, last.end, size, last.digest or "")))
    return units


def resolve(spec: str, text_column: str = "text", *, hf_data_files: Optional[list[str]] = None,
            stored_keys=(), label: str = ENV) -> ResolvedSource:
    """Turn a source spec into units, given the unit keys the table already holds; ``label``
    names where the spec came from in messages (the variable, or raw_text's run config).

    Files that cannot be read, or that changed in a way that cannot be ingested, are reported
    in ``bad_files`` (not fatal: the others are read).
    """
    spec = spec.strip()
    if not spec:
        raise SourceError(f"{label}='': names no source. Name a file, folder or glob, "
                          "synthetic[:ROWS] or hf:DATASET" + (
                              "" if label == ENV else f", or leave it out to read {ENV}"))
    if spec == "synthetic-web" or spec.startswith("synthetic-web:"):
        return ResolvedSource([_synthetic_web_unit(_parse_synthetic_web(spec, label))], {})
    if spec == "synthetic" or spec.startswith("synthetic:"):
        return ResolvedSource([_synthetic_unit(_parse_synthetic(spec, label))], {})
    if spec.startswith("hf:"):
        return ResolvedSource([_hf_unit(spec, text_column, hf_data_files, label)], {})
    by_path = stored_keys_by_path(stored_keys)
    by_fp: dict[str, list[StoredKey]] = {}
    for keys in by_path.values():
        for k in keys:
            if k.fp:
                by_fp.setdefault(k.fp, []).append(k)
    units, bad = [], {}
    files = expand_paths(spec, label)
    for path in files:
        try:
            known = by_path.get(str(path)) or _same_content(path, by_path, by_fp)
            units.extend(_file_units(path, text_column, known))
        except SourceError as exc:
            bad[str(path)] = str(exc)
        except (OSError, pa.ArrowException) as exc:
            bad[str(path)] = f"not a readable {path.suffix} file ({exc}); replace or remove it"
    warning = None
    if not files:
        warning = (f"{label}={spec!r} matches no .parquet, .jsonl, .jsonl.gz or .txt "
                   "file: nothing to ingest. Check the path or glob for a typo.")
    return ResolvedSource(units, bad, warning)
