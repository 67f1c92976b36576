"""``StreamingDataset`` over a shuffle permutation built once per run and stored, instead of one
built in every rank: the one place that reaches inside ``lancedb.streaming``.

``StreamingDataset`` (lancedb 0.40) has no public parameter for an outside permutation: its
``__init__`` always builds one in memory, in every rank, from the whole filtered table. This
module runs lancedb's own code unchanged with two of ``lancedb.streaming``'s module names
rebound, for ``SharedPermutationDataset`` only; everything else (splits per rank and worker,
packing, state dicts, elastic merges) stays lancedb's. It relies on exactly this, checked by
``streaming_internals_problems`` before every use (a ``SharedPermutationDataset`` refuses to
start when it fails) and pinned by ``lance_assets_tests/test_shared_permutation.py``:

1. ``StreamingDataset.__init__`` builds its permutation through the module name
   ``permutation_builder(table).filter(f).split_random(fixed=, seed=, clump_size=).execute()``
   with ``seed = shuffle_seed + epoch * EPOCH_SEED_STRIDE``, and keeps the result as
   ``self._perm_table``.
2. ``StreamingDataset._iter_owned`` and ``StreamingDataset._estimate_blocks_per_epoch`` (and
   no other function of the module) read splits through the module name
   ``Permutation.from_tables(self._table, self._perm_table, split=)`` and then only
   ``select_columns``, ``with_transform(Transforms.arrow2arrow)``, ``with_skip``, ``num_rows``
   and ``__getitems__``.
3. ``StreamingDataset.__getstate__`` pickles ``self._perm_table`` as its ``name`` and
   ``to_arrow()``; ``__setstate__`` rebuilds it from those.

Reads of the base table use only public API (``Table.take_row_ids``).
"""

from __future__ import annotations

import types

import lancedb
import numpy as np
import pyarrow as pa
from lancedb.permutation import Transforms
from lancedb.streaming import StreamingDataset

from lance_assets.table.handle import point_at

EPOCH_SEED_STRIDE = 100003
"""``StreamingDataset`` shuffles epoch ``e`` of seed ``s`` with seed ``s + e * EPOCH_SEED_STRIDE``."""

READERS = ("_iter_owned", "_estimate_blocks_per_epoch")
"""The ``StreamingDataset`` methods that read splits through ``Permutation``."""

_RELIED_ON = {
    "__init__": {"permutation_builder", "_perm_table"},
    "_iter_owned": {"Permutation", "_perm_table"},
    "_estimate_blocks_per_epoch": {"Permutation", "_perm_table"},
    "__getstate__": {"_perm_table"},
    "__setstate__": {"_perm_table"},
}
"""Which ``StreamingDataset`` functions use the names this module rebinds or replaces: no
more, no fewer (a new reader of the permutation would bypass the stored one)."""


class PermutationError(RuntimeError):
    """A stored permutation that must not be used (damaged, or built for another run)."""


def permutation_seed(seed: int, epoch: int) -> int:
    """The seed ``StreamingDataset`` shuffles epoch ``epoch`` of run seed ``seed`` with."""
    return seed + epoch * EPOCH_SEED_STRIDE


def _names(code: types.CodeType) -> set[str]:
    names = set(code.co_names)
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            names |= _names(const)
    return names


def streaming_internals_problems() -> list[str]:
    """How the installed ``lancedb.streaming`` differs from what this module relies on (points
    1-3 of the module docstring, as far as code can tell without running it); empty when it
    does not."""
    import lancedb.streaming as streaming

    watched = {"Permutation", "permutation_builder", "_perm_table"}
    problems = []
    for name in ("Permutation", "permutation_builder"):
        if not hasattr(streaming, name):
            problems.append(f"lancedb.streaming has no module name {name!r}")
    found = {}
    for attr, value in vars(StreamingDataset).items():
        fn = value.fget if isinstance(value, property) else getattr(value, "__func__", value)
        if isinstance(fn, types.FunctionType):
            used = _names(fn.__code__) & watched
            if used:
                found[attr] = used
    for fn in vars(streaming).values():
        if isinstance(fn, types.FunctionType) and _names(fn.__code__) & watched:
            found[fn.__name__] = _names(fn.__code__) & watched
    if found != _RELIED_ON:
        problems.append(f"StreamingDataset's functions use {found}, this adapter expects "
                        f"{_RELIED_ON}")
    return problems


def _with_globals(fn, **names):
    """``fn`` with some of its module's global names bound to other objects."""
    g = dict(fn.__globals__, **names)
    new = types.FunctionType(fn.__code__, g, fn.__name__, fn.__defaults__, fn.__closure__)
    new.__kwdefaults__, new.__qualname__, new.__doc__ = fn.__kwdefaults__, fn.__qualname__, fn.__doc__
    return new


class _StoredSplit:
    """One split of a stored permutation (``data.StoredPermutation``: ``key``, ``uri``,
    ``split_sizes``, ``row_ids(split, positions)``), with the few methods of
    ``lancedb.permutation.Permutation`` that ``StreamingDataset`` calls (point 2)."""

    def __init__(self, base, stored, split: int, columns=None, skip: int = 0):
        self.base, self.stored, self.split, self.columns, self.skip = base, stored, split, columns, skip

    @classmethod
    def from_tables(cls, base_table, permutation_table=None, split=None) -> _StoredSplit:
        if not hasattr(permutation_table, "row_ids") or not isinstance(split, int):
            raise TypeError("SharedPermutationDataset reads only its stored permutation's splits")
        # a DataLoader worker reopens the table at its newest version: read the pinned one.
        # Here, before any read thread starts, never during reads.
        point_at(base_table, getattr(permutation_table, "table_ref", None)
                 or permutation_table.key.table_version)
        return cls(base_table, permutation_table, split)

    def _copy(self, **changes) -> _StoredSplit:
        kw = dict(columns=self.columns, skip=self.skip) | changes
        return _StoredSplit(self.base, self.stored, self.split, **kw)

    def select_columns(self, columns: list[str]) -> _StoredSplit:
        return self._copy(columns=list(columns))

    def with_transform(self, transform) -> _StoredSplit:
        if transform is not Transforms.arrow2arrow:
            raise NotImplementedError("a stored permutation split hands out Arrow batches only")
        return self

    def with_skip(self, skip: int) -> _StoredSplit:
        return self._copy(skip=self.skip + skip)

    @property
    def num_rows(self) -> int:
        return self.stored.split_sizes[self.split] - self.skip

    def __getitems__(self, indices: list[int]) -> pa.RecordBatch:
        if any(i < 0 or i >= self.num_rows for i in indices):
            raise IndexError(f"split {self.split}: positions {indices[0]}..{indices[-1]} outside "
                             f"its {self.num_rows} rows")
        wanted = self.stored.row_ids(self.split, [self.skip + i for i in indices]).to_numpy()
        query = self.base.take_row_ids(wanted.tolist()).with_row_id()
        if self.columns is not None:
            query = query.select(self.columns)
        table = query.to_arrow()  # in no promised order: put it in the permutation's
        got = table.column("_rowid").to_numpy()
        if len(got) != len(wanted):
            raise PermutationError(f"{self.stored.uri}: split {self.split} names {len(wanted)} rows, "
                                   f"table version {self.stored.key.table_version} holds {len(got)}")
        by_id = np.argsort(got, kind="stable")
        order = by_id[np.searchsorted(got, wanted, sorter=by_id)]
        table = table.drop_columns(["_rowid"]).take(pa.array(order))
        return table.combine_chunks().to_batches(max_chunksize=len(indices))[0]


class _ReplayBuilder:
    """Stands in for ``permutation_builder(table)`` in ``StreamingDataset.__init__`` (point 1):
    records what the dataset asks for and, instead of building, hands back the stored
    permutation after checking that it is exactly that permutation."""

    def __init__(self, stored):
        self.stored, self.asked = stored, {}

    def __call__(self, table) -> _ReplayBuilder:
        return self

    def filter(self, filter: str) -> _ReplayBuilder:
        self.asked["filter"] = filter
        return self

    def split_random(self, *, fixed=None, seed=None, clump_size=None, **other) -> _ReplayBuilder:
        self.asked.update(fixed=fixed, seed=seed, clump_size=clump_size, **other)
        return self

    def split_sequential(self, **kw) -> _ReplayBuilder:
        raise PermutationError("a stored permutation is a shuffle; build unshuffled datasets "
                               "with StreamingDataset itself")

    def execute(self):
        key = self.stored.key
        wanted = dict(filter=key.filter, fixed=key.num_splits, clump_size=None,
                      seed=permutation_seed(key.seed, key.epoch))
        if self.asked != wanted:
            raise PermutationError(f"{self.stored.uri}: built for {wanted}, the dataset asks for "
                                   f"{self.asked}")
        return self.stored


class _NoRows:
    """What ``StreamingDataset.__getstate__`` pickles in place of the permutation (point 3)."""

    name = "permutation"

    @staticmethod
    def to_arrow() -> pa.Table:
        return pa.table({"row_id": pa.array([], pa.uint64()), "split_id": pa.array([], pa.uint64())})


class SharedPermutationDataset(StreamingDataset):
    """``StreamingDataset`` over ``permutation`` (a ``data.StoredPermutation``) instead of one it
    builds itself; pickles the permutation as its location, never its rows.
    ``test_shared_permutation.py`` pins that the blocks are the same as a StreamingDataset that
    builds its own permutation."""

    _iter_owned = _with_globals(StreamingDataset._iter_owned, Permutation=_StoredSplit)
    _estimate_blocks_per_epoch = _with_globals(StreamingDataset._estimate_blocks_per_epoch,
                                               Permutation=_StoredSplit)

    def __init__(self, table, *, permutation, **kw):
        problems = streaming_internals_problems()
        if problems:
            raise RuntimeError(
                f"lancedb {lancedb.__version__} changed what lance_assets.train.streaming_adapter "
                f"relies on ({'; '.join(problems)}); install the lancedb version in uv.lock, or "
                "train without a shared permutation (each rank builds its own)")
        init = _with_globals(StreamingDataset.__init__, permutation_builder=_ReplayBuilder(permutation))
        init(self, table, **kw)
        if self._perm_table is not permutation:
            raise RuntimeError("StreamingDataset.__init__ did not take the stored permutation; "
                               "lance_assets.train.streaming_adapter needs updating for lancedb "
                               f"{lancedb.__version__}")

    def __getstate__(self):
        stored = self._perm_table
        self._perm_table = _NoRows
        try:
            state = super().__getstate__()
        finally:
            self._perm_table = stored
        state["_stored_permutation"] = stored
        return state

    def __setstate__(self, state):
        stored = state.pop("_stored_permutation")
        super().__setstate__(state)
        self._perm_table = stored
