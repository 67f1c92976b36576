"""The band keys already seen by the ``near_dup`` columns: :class:`BandIndex`.

Invariant: each key maps to the first document (smallest ``id``) that had it, and a key once in
never changes owner, however the documents were split into batches. Why: documents are matched
in id order against every document before them and their cluster values never change once
written, so a new document must find the earliest document sharing a band: the one its cluster
is named after. Adding a batch costs the batch, not the index, so a run is linear in the corpus.
Pure numpy: no table access (``near_dup.load_index`` fills it from the table).
"""

from __future__ import annotations

import numpy as np

from lance_assets.curation.minhash import MIX

EMPTY = np.int32(-1)
MAX_LOAD = 0.6


class BandIndex:
    """Every band key seen so far -> the first document (smallest id) that had it.

    An open-addressing hash table in numpy arrays (linear probing, vectorised over a batch of
    keys), so adding a batch costs the batch, not the index: linear in the corpus overall. A
    key maps to a *slot* in the per-document arrays ``ids`` / ``clusters``. Memory: 12 bytes per
    table entry at most ``MAX_LOAD`` full, plus 16 bytes per document: ~300 bytes per document
    with 14 bands. ``expected_docs`` sizes the table up front; past it, it doubles."""

    def __init__(self, expected_docs: int = 0, bands: int = 14) -> None:
        self.bands = bands
        self.capacity = 0
        self.entries = 0
        self._resize(max(1024, int(expected_docs * bands / MAX_LOAD) + 1))
        self.n_docs = 0
        self._ids = np.empty(max(expected_docs, 1024), dtype=np.int64)
        self._clusters = np.empty(max(expected_docs, 1024), dtype=np.int64)

    @property
    def ids(self) -> np.ndarray:
        return self._ids[:self.n_docs]

    @property
    def clusters(self) -> np.ndarray:
        return self._clusters[:self.n_docs]

    def _home(self, keys: np.ndarray) -> np.ndarray:
        # multiply-high onto [0, capacity): keys are hashes already; mixing once more keeps
        # the slots uniform whatever their low bits do
        mixed = (keys.view(np.uint64) * MIX) >> np.uint64(32)
        return ((mixed * np.uint64(self.capacity)) >> np.uint64(32)).astype(np.int64)

    def _resize(self, capacity: int) -> None:
        old_keys = getattr(self, "_keys", None)
        old_slots = getattr(self, "_slots", None)
        self.capacity = int(capacity)
        self._keys = np.zeros(self.capacity, dtype=np.int64)
        self._slots = np.full(self.capacity, EMPTY, dtype=np.int32)
        self.entries = 0
        if old_keys is not None:
            used = old_slots != EMPTY
            self._insert(old_keys[used], old_slots[used])

    def _find(self, keys: np.ndarray) -> np.ndarray:
        """The slot each key maps to, or -1."""
        out = np.full(len(keys), EMPTY, dtype=np.int32)
        at = self._home(keys)
        pending = np.arange(len(keys))
        while len(pending):
            pos = at[pending]
            slot = self._slots[pos]
            empty = slot == EMPTY
            hit = ~empty & (self._keys[pos] == keys[pending])
            out[pending[hit]] = slot[hit]
            go_on = ~(empty | hit)
            pending = pending[go_on]
            at[pending] = (pos[go_on] + 1) % self.capacity
        return out

    def _insert(self, keys: np.ndarray, slots: np.ndarray) -> None:
        """Insert keys that are absent and distinct."""
        if self.entries + len(keys) > MAX_LOAD * self.capacity:
            self._resize(max(2 * self.capacity, int((self.entries + len(keys)) / MAX_LOAD) + 1))
        at = self._home(keys)
        pending = np.arange(len(keys))
        while len(pending):
            pos = at[pending]
            free = self._slots[pos] == EMPTY
            # several keys may reach the same free position: the first of them takes it
            taken, first = np.unique(pos[free], return_index=True)
            winners = pending[np.flatnonzero(free)[first]]
            self._keys[taken] = keys[winners]
            self._slots[taken] = slots[winners]
            placed = np.zeros(len(keys), dtype=bool)
            placed[winners] = True
            pending = pending[~placed[pending]]
            at[pending] = (at[pending] + 1) % self.capacity
        self.entries += len(keys)

    def add(self, ids: np.ndarray, clusters: np.ndarray, keys: np.ndarray) -> None:
        """Add documents (ids ascending, all larger than those already in) and their keys
        ``[docs, bands]``; a key already known keeps its first document."""
        n = len(ids)
        if self.n_docs + n > len(self._ids):
            grow = max(2 * len(self._ids), self.n_docs + n)
            self._ids = np.resize(self._ids, grow)
            self._clusters = np.resize(self._clusters, grow)
        slots = np.arange(self.n_docs, self.n_docs + n, dtype=np.int32)
        self._ids[self.n_docs:self.n_docs + n] = ids
        self._clusters[self.n_docs:self.n_docs + n] = clusters
        self.n_docs += n
        flat = keys.reshape(-1)
        new = self._find(flat) == EMPTY
        # the first occurrence of each new key (row-major: the smallest id comes first)
        uniq, first = np.unique(flat[new], return_index=True)
        owner = np.repeat(slots, keys.shape[1])[np.flatnonzero(new)[first]]
        self._insert(uniq, owner)

    def lookup(self, keys: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """For each key: found?, the first id that had it, that id's cluster."""
        slot = self._find(keys.reshape(-1)).reshape(keys.shape)
        found = slot != EMPTY
        safe = np.where(found, slot, 0)
        if self.n_docs == 0:
            none = np.zeros(keys.shape, dtype=np.int64)
            return found, none, none
        return found, self.ids[safe], self.clusters[safe]
