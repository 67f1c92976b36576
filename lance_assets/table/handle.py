"""One handle on the corpus table: the only code that opens the Lance dataset.

A :class:`Table` knows where the table is (resolved once, from an argument or
``LANCE_ASSETS_DATA``) and owns everything that touches it by path:

- **opening**: the newest version, a version, a tag (``open``), or the lancedb handle the
  loader, the full-text and the vector indexes use (``lancedb_table``);
- **choosing**: which version a reader reads, from the newest, a version number, a tag or a
  run's recorded (tag, version), under the retention rules (``choose``); no code outside
  ``table/`` reads tags or checks out versions itself;
- **pinning**: a stage reads one version and builds its plan, its table-wide state and its
  writes on it (``pinned``); a version that a cleanup removed underneath (zero retention) means
  planning again on the newest, never a failed run;
- **commits**: ``commit`` retries an attempt on the newest version when a concurrent writer won
  the race; ``commit_operation`` and ``write_fragments`` take the table's storage options;
- **ids**: Lance's row-id counter (``next_row_id``), which only grows;
- **config**: the table's key/value config (``get_config``, ``set_config``);
- **snapshots**: tags with an owner and a retention (``snapshots``, ``table.snapshots``).

The library takes a ``Table``. A string (a data root, or the dataset's ``.lance`` URI) becomes
one in ``Table.of``, once, at the edges: the command lines, the Dagster resource
(``LanceStore.table``) and the trainer's entry point.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Optional, TypeVar, Union

import lance
import pyarrow as pa

from lance_assets import paths, storage
from lance_assets.table import core, lance_manifest

if TYPE_CHECKING:
    import lancedb.table

    from lance_assets.table.choice import Chosen
    from lance_assets.table.snapshots import Snapshots

T = TypeVar("T")

# How often one stage plans again because its pinned version was removed underneath it.
MAX_REPLANS = 20


def is_version_gone(exc: BaseException) -> bool:
    """A read of a pinned version failed because a cleanup removed its files or its manifest
    (``keep_versions_hours: 0`` next to a running stage): plan again on the newest."""
    # Lance raises OSError/ValueError; through DuckDB it is DuckDB's own error; lancedb's
    # checkout of a removed version says "Version N no longer exists"
    text = str(exc)
    return isinstance(exc, Exception) and (
        "Not found" in text or "not found" in text or "No such file" in text
        or "no longer exists" in text)


def point_at(handle: Any, version: int | str) -> None:
    """Check out ``version`` on a lancedb table handle that another library opened (a DataLoader
    worker of ``StreamingDataset`` reopens the table at its newest version): the version was
    chosen through ``Table.choose`` by whoever pinned the run (a tag: a redacted copy's)."""
    if isinstance(version, str) or handle.version != version:
        handle.checkout(version)


class VersionGone(RuntimeError):
    """Raised by a stage whose pinned version lost files; ``Table.pinned`` plans again."""


@dataclass(frozen=True)
class Table:
    """Where the corpus table is, and every way of opening and committing to it."""

    root: str
    name: str = paths.TABLE_NAME

    # -- where
    @classmethod
    def of(cls, where: Union[Table, str, os.PathLike, None] = None,
           name: str = paths.TABLE_NAME) -> Table:
        """The table under the data root ``where`` (default ``LANCE_ASSETS_DATA``), or ``where``
        itself when it is a ``Table`` already."""
        if isinstance(where, Table):
            return where
        if where is not None and str(where).rstrip("/").endswith(".lance"):
            # the dataset's own URI (<root>/lance/<name>.lance), as Lance and messages show it
            loc = storage.location(str(where).rstrip("/"))
            if loc.parent.name != "lance":
                raise ValueError(f"{where}: not a table of a data root (<root>/lance/<name>."
                                 "lance); pass the data root instead")
            return cls(storage.uri_of(paths.data_dir(loc.parent.parent)), loc.name[:-len(".lance")])
        return cls(storage.uri_of(paths.data_dir(where)), name)

    @property
    def uri(self) -> str:
        """The Lance dataset's URI (for messages and for Ray tasks that open it by version)."""
        return paths.table_uri(self.root, self.name)

    @property
    def db_dir(self) -> str:
        """The embedded LanceDB database folder that holds the table."""
        return storage.uri_of(paths.db_dir(self.root))

    @property
    def storage_options(self) -> dict[str, str]:
        return storage.storage_options_for(self.uri)

    def __str__(self) -> str:
        return self.uri

    # -- opening
    def exists(self) -> bool:
        return core.has_committed_version(self.uri)

    def newest(self) -> lance.LanceDataset:
        """The newest version, or a clear error if ingest has not run yet."""
        if not self.exists():
            raise core.TableMissingError(
                f"No Lance table at {self.uri}. Materialize `raw_text` first "
                "(dagster asset materialize -m lance_assets.definitions --select raw_text).")
        return lance.dataset(self.uri, storage_options=self.storage_options)

    def open(self, ref: int | str | None = None) -> lance.LanceDataset:
        """The newest version (``None``), a version number, or the version a tag names."""
        if ref is None:
            return self.newest()
        return lance.dataset(self.uri, version=ref, storage_options=self.storage_options)

    def version_of(self, ref: int | str | None = None) -> int:
        return self.open(ref).version

    def choose(self, ref: int | str | None = None, *, version: int | None = None,
               or_newest: bool = False) -> Chosen:
        """The one version a reader reads (``Chosen``: its number, the tag it was chosen through,
        the tag's snapshot record, how it was chosen in words, and the version opened):

        - ``None``: the newest version;
        - a version number: that version, while a cleanup has not removed it (a string of
          digits too, from a command line or a run config, unless a tag has that name);
        - a tag (a snapshot's name): the version it names; with ``or_newest``, the newest when
          there is no such tag yet (a run's first start: the caller holds the tag there next);
        - a tag with ``version=`` (what a run recorded): the version through the tag while the
          tag still names it, else that version by number while a cleanup has not removed it.

        Anything else raises ``VersionChoiceError`` naming the input, why (never made, released,
        cleaned up: ``table.choice``) and what to give instead."""
        from lance_assets.table.choice import choose

        return choose(self, ref, version=version, or_newest=or_newest)

    def lancedb_table(self, version: int | str | None = None) -> lancedb.table.Table:
        """The lancedb handle (full-text search, vector search, ``StreamingDataset``), checked
        out at ``version`` when given."""
        import lancedb

        table = lancedb.connect(self.db_dir, storage_options=self.storage_options
                                ).open_table(self.name)
        if version is not None:
            table.checkout(version)
        return table

    def pinned(self, work: Callable[[lance.LanceDataset], T], *, what: str = "stage",
               log: Optional[Callable[[str], None]] = None) -> T:
        """Run ``work`` on one pinned version (the newest when it starts). If a cleanup removes
        that version's files while ``work`` reads them, ``work`` starts again on the newest:
        what it builds (a plan, table-wide state, writes) always belongs to one version."""
        for n in range(1, MAX_REPLANS + 1):
            ds = self.newest()
            try:
                return work(ds)
            except Exception as exc:  # noqa: BLE001 - re-raised unless the version went away
                if not (isinstance(exc, VersionGone) or is_version_gone(exc)) \
                        or n == MAX_REPLANS or self._still_there(ds):
                    raise
                if log is not None:
                    log(f"{what}: version {ds.version} was removed by a cleanup while it was read "
                        f"({str(exc).splitlines()[0][:160]}); planning again on the newest")
        raise AssertionError("unreachable")

    def _still_there(self, ds: lance.LanceDataset) -> bool:
        """True when ``ds``'s manifest and every data file still exist: a 'not found' then is
        the user's (a missing column, a bad path), not a cleanup's. The manifest is checked
        first: a cleanup removes an old version's manifest even where a newer version keeps all
        of its data files, and a task that opens the pinned version by number then fails."""
        if storage.is_object_store(self.uri):
            return False
        try:
            lance.dataset(self.uri, version=ds.version, storage_options=self.storage_options)
        except Exception:  # noqa: BLE001 - the manifest is gone (or unreadable): plan again
            return False
        try:
            base = storage.location(self.uri) / "data"
            return all((base / f.path).exists() for frag in ds.get_fragments()
                       for f in frag.metadata.data_files())
        except Exception:  # noqa: BLE001 - cannot tell: treat it as gone and plan again
            return False

    # -- writing
    def create(self, schema: pa.Schema) -> bool:
        """Create the table, empty, unless a version is committed; True when this call did.
        Of two creators racing, one creates it and the other goes on."""
        if self.exists():
            return False
        try:
            lance.write_dataset(schema.empty_table(), self.uri, mode="create",
                                enable_stable_row_ids=True, storage_options=self.storage_options)
            return True
        except (OSError, ValueError):
            if not self.exists():
                raise
            return False

    def write_fragments(self, data: Any, schema: pa.Schema, **kwargs) -> list:
        """New, uncommitted fragments (``lance.fragment.write_fragments``)."""
        from lance.fragment import write_fragments

        return write_fragments(data, self.uri, schema=schema,
                               storage_options=self.storage_options, **kwargs)

    def commit_operation(self, operation, read_version: int) -> lance.LanceDataset:
        return lance.LanceDataset.commit(self.uri, operation, read_version=read_version,
                                         storage_options=self.storage_options)

    def commit(self, what: str, attempt: Callable[[lance.LanceDataset], T], *,
               log: Optional[Callable[[str], None]] = None,
               max_attempts: int = core.MAX_COMMIT_ATTEMPTS) -> T:
        """``attempt(newest version)`` until no concurrent writer preempts it (``commit_retrying``)."""
        return core.commit_retrying(what, lambda: attempt(self.newest()), log=log,
                                    max_attempts=max_attempts)

    def remove_files(self, data_files: list[str]) -> int:
        """Delete data files (paths relative to the table's ``data/`` folder) that this process
        wrote and will never commit: a stale plan, a rewrite that lost. Never a committed file:
        callers pass only files of their own failed attempts. Returns how many were removed."""
        base = storage.location(self.uri) / "data"
        n = 0
        for rel in data_files:
            path = base / rel
            try:
                if storage.is_object_store(path):
                    path.fs.rm_file(path.path)
                else:
                    path.unlink()
                n += 1
            except FileNotFoundError:
                pass
        return n

    # -- ids and config
    def next_row_id(self, ds: lance.LanceDataset | None = None) -> int:
        """Lance's row-id counter: how many rows were ever appended (deleted ones included)."""
        return lance_manifest.row_id_high_water(ds if ds is not None else self.newest())

    def get_config(self, key: str, ds: lance.LanceDataset | None = None) -> dict | None:
        return core.get_json_config(ds if ds is not None else self.newest(), key)

    def set_config(self, key: str, value: dict, log: Optional[Callable[[str], None]] = None) -> None:
        import json

        text = json.dumps(value, sort_keys=True)
        self.commit(f"config {key}", lambda ds: ds.update_config({key: text}), log=log)

    # -- snapshots
    @property
    def snapshots(self) -> Snapshots:
        from lance_assets.table.snapshots import Snapshots

        return Snapshots(self)

