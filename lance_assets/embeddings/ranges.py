"""A kill loses at most about a minute of model work: fragments are embedded in row ranges,
each saved as it finishes.

Lance writes a column for a whole fragment at once (``write_columns``: one data file covering
every row, a ``DataReplacement`` commit), so a fragment is the unit a commit can keep, and one
fragment of 3,653 long documents is ~90 k chunks: an hour of CPU. Inside a fragment the model
therefore works through row ranges sized by the measured rate to take about ``RANGE_SECONDS``
(the first range is ``FIRST_RANGE`` rows). When a fragment needs more than one range, each
finished range's values are saved under the data root
(``partial/<column>/<fragment key>/<start>-<end>.arrow``, Arrow IPC, written atomically); a
rerun after a kill reads the saved ranges back and computes only the rest, then writes and
commits the fragment as before. A fragment finished in one range saves nothing.

The fragment key names the fragment id, its physical and live rows, its deletion file and a
digest of the column's spec (model, backend, window): a fragment that changed (a delete, a
compaction: new ids) or another spec never reads a stale range. The saved ranges are a cache:
each run removes those of fragments that are written or gone, and ``forget`` removes them all
(they are derived from documents' text).

Progress: rows done in the fragment, rows per second and the time left are logged as the model
works through each range (:func:`encode_counted` counts every batch of the model), at least
every ``progress.LOG_EVERY_S`` seconds.
"""

from __future__ import annotations

import hashlib
import io
import json
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa
import pyarrow.ipc as ipc

from lance_assets import paths, storage
from lance_assets.progress import advance, progress
from lance_assets.table import Table

RANGE_SECONDS = 45.0
FIRST_RANGE = 64
MIN_RANGE, MAX_RANGE = 8, 100_000


def fragment_key(frag, spec: dict) -> str:
    """What a saved range is valid for: this fragment as it is now, and this spec."""
    meta = frag.metadata
    deletion = meta.deletion_file
    facts = [frag.fragment_id, frag.physical_rows, frag.count_rows(),
             None if deletion is None else [deletion.id, deletion.num_deleted_rows],
             json.loads(json.dumps(spec, sort_keys=True, default=str))]
    digest = hashlib.sha256(json.dumps(facts).encode()).hexdigest()[:16]
    return f"{frag.fragment_id}-{digest}"


@dataclass
class RangeStore:
    """The saved ranges of one fragment's column (see the module docstring)."""

    root: str
    column: str
    key: str

    @property
    def folder(self):
        return paths.partial_dir(self.root, self.column) / self.key

    def load(self) -> list[tuple[int, int, pa.Array]]:
        folder = self.folder
        try:
            names = sorted(p.name for p in folder.iterdir() if p.name.endswith(".arrow")
                           and not p.name.startswith("."))
        except (FileNotFoundError, NotADirectoryError):
            return []
        out = []
        for name in names:
            start, end = (int(x) for x in name[:-len(".arrow")].split("-"))
            reader = ipc.open_stream(io.BytesIO(storage.read_bytes(folder / name)))
            out.append((start, end, reader.read_all().column(0).combine_chunks()))
        return out

    def save(self, start: int, end: int, values: pa.Array) -> None:
        sink = io.BytesIO()
        batch = pa.record_batch([values], names=[self.column])
        with ipc.new_stream(sink, batch.schema) as writer:
            writer.write_batch(batch)
        storage.write_atomic(self.folder / f"{start:010d}-{end:010d}.arrow", sink.getvalue())


def compute_in_ranges(n: int, compute: Callable[[int, int, list], list],
                      encode: Callable[[list], pa.Array], decode: Callable[[pa.Array], list],
                      store: RangeStore | None, log: Callable[[str], None] | None, what: str,
                      seconds: float = RANGE_SECONDS) -> list:
    """The values of rows ``[0, n)``: saved ranges read back, the rest from ``compute(start,
    end, values)`` (a list of ``end - start`` values; ``values`` holds the rows before
    ``start``) range by range, each saved (``encode``) while rows after it are still to do."""
    values: list = [None] * n
    done = [False] * n
    for start, end, saved in (store.load() if store is not None else []):
        if 0 <= start < end <= n:
            values[start:end] = decode(saved)
            done[start:end] = [True] * (end - start)
    resumed = sum(done)
    if resumed and log:
        log(f"{what}: {resumed:,} of {n:,} rows read back from ranges saved by an earlier run")
    size, pos = FIRST_RANGE, 0
    with progress(n - resumed, what, "row", log) as bar:
        while pos < n:
            if done[pos]:
                pos += 1
                continue
            end = pos
            while end < n and end - pos < size and not done[end]:
                end += 1
            started, counted = time.perf_counter(), bar.n
            values[pos:end] = compute(pos, end, values)
            took = time.perf_counter() - started
            if store is not None and not all(done[end:]):  # the fragment is not finished by it
                store.save(pos, end, encode(values[pos:end]))
            rate = (end - pos) / took if took > 0 else float("inf")
            size = int(min(MAX_RANGE, max(MIN_RANGE, rate * seconds)))
            bar.update(max(0, (end - pos) - (bar.n - counted)))  # rows the compute did not count
            pos = end
    return values


def encode_counted(model, texts: list[str], rows_of: Sequence[int] | None = None) -> np.ndarray:
    """``model.encode(texts)``, its progress counted (:func:`progress.advance`): a text is a
    row, or with ``rows_of`` (the row of each text, in order) a row counts once its last text
    is done. A model that reports its batches (``encode(texts, done=...)``, the real
    ``Embedder``) is counted batch by batch; any other when the call returns."""
    # where each row's texts start (but the first): a row is done once the next one has started
    starts = None if rows_of is None else np.flatnonzero(np.diff(np.asarray(rows_of)) != 0) + 1
    counted = 0

    def done(k: int) -> None:  # the first k texts are done
        nonlocal counted
        finished = k if starts is None else \
            int(np.searchsorted(starts, k, side="right")) + int(k == len(texts) > 0)
        advance(finished - counted)
        counted = finished

    if getattr(model, "reports_batches", False):
        out = model.encode(texts, done=done)
    else:
        out = model.encode(texts)
    done(len(texts))
    return out


def sweep(table: Table, column: str, spec: dict, written: Sequence[int] = ()) -> int:
    """Remove the saved ranges no fragment of the newest version can use (written, gone, or
    changed since). Returns how many fragment folders were removed."""
    base = paths.partial_dir(table.root, column)
    try:
        folders = [p for p in base.iterdir()]
    except (FileNotFoundError, NotADirectoryError):
        return 0
    from lance_assets.table.columns import fragments_missing

    ds = table.newest()
    live = set()
    if column in ds.schema.names:
        live = {fragment_key(f, spec) for f in fragments_missing(ds, [column])}
    else:
        live = {fragment_key(f, spec) for f in ds.get_fragments()}
    removed = 0
    for folder in folders:
        if folder.name not in live:
            storage.remove_tree(folder)
            removed += 1
    if removed == len(folders):
        storage.remove_tree(base)  # nothing saved for this column any more
    return removed


@dataclass
class Ranges:
    """What a compute needs to work in saved ranges; picklable (a Ray task saves its own)."""

    root: str | None = None  # the data root; None: no saving (tests, stand-ins)
    column: str = ""
    spec: dict = field(default_factory=dict)
    seconds: float = RANGE_SECONDS

    def store(self, frag) -> RangeStore | None:
        if self.root is None:
            return None
        return RangeStore(self.root, self.column, fragment_key(frag, self.spec))
