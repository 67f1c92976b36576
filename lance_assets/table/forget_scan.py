"""Where the table still holds documents: in every version on disk, of the main line and of every
branch (``redact``'s copies), tagged or not, counting what a version reads and what its data
files keep behind deletion files.

A delete hides rows behind a deletion file; the data files still hold them (every column's file
of the fragment, at the deleted offsets) until a compaction rewrites the fragment. So a version
holds a document when it reads its row, or when one of its fragments with a deletion file has
the row physically: its ``id`` data file, read with Lance's file reader (deleted rows
included), lists it. Files are read once however many versions share them.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import TypeVar

import lance
import numpy as np
from lance.file import LanceFileReader

from lance_assets.table import Table, is_version_gone, leaf_field_ids
from lance_assets.table.predicate import PredicateError, lance_problem, safe_predicate
from lance_assets.table.redact import data_path, versions_of

ID_CHUNK = 2000
T = TypeVar("T")


def id_filters(ids: np.ndarray) -> list[str]:
    """``id IN (...)`` filters over chunks of ``ids`` (integers only: nothing user-typed)."""
    return [f"id IN ({','.join(str(int(i)) for i in ids[lo:lo + ID_CHUNK])})"
            for lo in range(0, len(ids), ID_CHUNK)]


def count(ds: lance.LanceDataset, filters: list[str], extra: str | None = None) -> int:
    return sum(ds.count_rows(filter=f if extra is None else f"({f}) AND ({extra})")
               for f in filters)


def versions_on_disk(table: Table) -> Iterator[lance.LanceDataset]:
    """Every version whose manifest is on disk, the main line's oldest first, then every
    branch's (``redact``; one a cleanup removes while this runs is skipped)."""
    for _, ds in branch_versions(table):
        yield ds


def branch_versions(table: Table) -> Iterator[tuple[str | None, lance.LanceDataset]]:
    """(branch, version) of every version on disk: the main line's (branch None), then every
    branch's."""
    newest = table.newest()
    for branch, version in versions_of(table):
        try:
            yield branch, (table.open(version) if branch is None
                           else newest.checkout_version((branch, version)))
        except (OSError, ValueError):
            continue


def each_version(table: Table, work: Callable[[lance.LanceDataset], T]) -> Iterator[T]:
    """``work`` on every version on disk; a version whose files a concurrent cleanup removes
    while ``work`` reads it holds nothing any more, and is skipped."""
    for ds in versions_on_disk(table):
        try:
            yield work(ds)
        except Exception as exc:  # noqa: BLE001 - re-raised unless the version went away
            if not is_version_gone(exc):
                raise


def largest_version(table: Table) -> tuple[int, int]:
    """(live rows, version) of the version on disk that holds the most rows (the newest of
    equals): what a share of the table is measured against."""
    best = (0, 0)
    for rows, version in each_version(table, lambda ds: (ds.count_rows(), ds.version)):
        if rows >= best[0]:
            best = (rows, version)
    return best


def matching_ids(table: Table, where: str) -> np.ndarray:
    """The ids ``where`` selects in any version on disk where its columns exist, sorted. A
    fragment is scanned once for all the versions that share its data and deletion files."""
    seen: set[tuple] = set()
    found = [np.zeros(0, np.int64)]

    def scan(ds: lance.LanceDataset) -> None:
        try:
            pred = safe_predicate(where, ds.schema.names)
        except PredicateError:
            return
        if lance_problem(ds, pred):
            return
        fields = {i for c in pred.columns | {"id"} for i in leaf_field_ids(ds, c)}
        for frag in ds.get_fragments():  # the files holding its columns, and what is deleted
            key = _fragment_key(frag, fields) + (pred.lance,)
            if key not in seen:
                found.append(frag.to_table(columns=["id"], filter=pred.lance)
                             .column("id").to_numpy())
                seen.add(key)

    for _ in each_version(table, scan):
        pass
    return np.unique(np.concatenate(found)).astype(np.int64)


def _fragment_key(frag, fields: set[int]) -> tuple:
    """What a scan of ``fields`` in a fragment depends on: the data files holding them and the
    deletion file (a column written since changes neither)."""
    meta = frag.metadata
    deletion = meta.deletion_file
    return (tuple(sorted(f.path for f in meta.data_files() if fields & set(f.fields))),
            None if deletion is None else (deletion.id, deletion.read_version))


@dataclass
class Holding:
    """What versions on disk still hold of some ids."""

    # (branch, version) -> rows it reads; -> fragments keeping one behind a deletion file
    readable: dict[tuple, int] = field(default_factory=dict)
    behind_deletions: dict[tuple, list[int]] = field(default_factory=dict)

    @property
    def versions(self) -> set[tuple]:
        return set(self.readable) | set(self.behind_deletions)

    def __bool__(self) -> bool:
        return bool(self.readable or self.behind_deletions)


class Scanner:
    """Physical ids of data files, read once per file for one forget."""

    def __init__(self, table: Table) -> None:
        self.table = table
        self._ids: dict[str, np.ndarray] = {}

    def file_ids(self, ds: lance.LanceDataset, frag, branch: str | None = None) -> np.ndarray:
        """Every id a fragment's data files hold, deleted rows included (``branch``: the one
        ``ds`` is a version of, where its own files are)."""
        id_field = ds.lance_schema.field("id").id()
        data = next(f for f in frag.metadata.data_files() if id_field in f.fields)
        path = data_path(self.table.uri, ds, data, branch)
        if path not in self._ids:
            reader = LanceFileReader(path, storage_options=self.table.storage_options,
                                     columns=["id"])
            self._ids[path] = reader.read_all().to_table().column("id").to_numpy()
        return self._ids[path]

    def holds(self, ds: lance.LanceDataset, ids: np.ndarray,
              branch: str | None = None) -> tuple[int, list[int]]:
        """(rows of ``ids`` that ``ds`` reads, fragments whose files keep one behind a deletion
        file)."""
        if not len(ids):
            return 0, []
        readable = count(ds, id_filters(ids))
        kept = [frag.fragment_id for frag in ds.get_fragments()
                if frag.metadata.deletion_file is not None
                and np.isin(self.file_ids(ds, frag, branch), ids).any()]
        return readable, kept

    def holding(self, ids: np.ndarray) -> Holding:
        """Every version on disk, of every branch, that reads one of ``ids`` or keeps one in its
        data files."""
        out = Holding()
        for branch, ds in branch_versions(self.table):
            try:
                readable, kept = self.holds(ds, ids, branch)
            except Exception as exc:  # noqa: BLE001 - re-raised unless the version went away
                if not is_version_gone(exc):
                    raise
                continue
            if readable:
                out.readable[(branch, ds.version)] = readable
            if kept:
                out.behind_deletions[(branch, ds.version)] = kept
        return out
