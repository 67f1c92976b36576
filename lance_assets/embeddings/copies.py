"""No model work on copies: rows flagged ``is_dup`` take their kept member's vectors.

``dedup_flag`` flags every row whose normalised text (``text_hash``: MD5 of the text with its
whitespace runs made single spaces) an earlier row already holds; the kept member is the
unflagged row of that hash. Whitespace is all the two texts can differ in, and the model's
tokenizer splits on whitespace, so both read the same word pieces: the kept member's vector is
the copy's. ``embeddings`` and ``chunk_embeddings`` therefore copy it instead of running the
model, from the same fragment or, read by ``text_hash``, from the table. The rows written are
the pinned version's; a kept member's vector is read from the newest version, because the run
itself writes the kept members of earlier fragments before it reaches their copies, and a
vector once written never changes (any version that holds it holds the same value).

A copy whose kept member has no vector yet (its fragment is written later, or it was deleted
and the cluster has no kept member until ``dedup_flag`` elects one) is embedded like any row,
as are rows whose ``is_dup`` is not written yet. Copying is an optimisation with the same
result: a column written with it equals one written without it (tested).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa

from lance_assets.keys import IS_DUP, TEXT_HASH
from lance_assets.table import Table

LOOKUP_CHUNK = 1000


@dataclass
class Plan:
    """Where each row of a fragment gets its value: the model (``embed``), another row of the
    fragment (``from_row``: copy -> kept row), or the pinned table (``from_table``: copy -> the
    kept member's stored value)."""

    embed: list[int]
    from_row: dict[int, int] = field(default_factory=dict)
    from_table: dict[int, object] = field(default_factory=dict)

    @property
    def copied(self) -> int:
        return len(self.from_row) + len(self.from_table)

    def to_embed(self, start: int, end: int) -> list[int]:
        """The rows of ``[start, end)`` the model computes: those of ``embed``, and the copies
        whose kept row comes after ``end`` (not computed yet when this range is written)."""
        embed = set(self.embed)
        return [r for r in range(start, end)
                if r in embed or (r in self.from_row and self.from_row[r] >= end)]

    def fill(self, start: int, end: int, values: list, out: dict) -> int:
        """Give every copy of ``[start, end)`` not in ``out`` its kept member's value: from the
        table, from an earlier range (``values``) or from this one (``out``). Returns how many."""
        copied = 0
        for r in range(start, end):
            if r in out:
                continue
            if r in self.from_table:
                out[r] = self.from_table[r]
            else:
                src = self.from_row[r]
                out[r] = values[src] if src < start else out[src]
            copied += 1
        return copied


@dataclass
class KeptVectors:
    """Finds the kept member's value of ``column`` for the copies of a fragment. Picklable (a
    Ray task opens the table itself); ``table`` None: copying is off."""

    table: Table | None
    column: str

    @classmethod
    def off(cls, column: str) -> KeptVectors:
        return cls(None, column)

    def columns(self, names: list[str]) -> list[str]:
        """The extra columns a fragment read needs ([] when the table has no ``is_dup``)."""
        if self.table is None or IS_DUP not in names or TEXT_HASH not in names:
            return []
        return ["id", IS_DUP, TEXT_HASH]

    def plan(self, tbl: pa.Table) -> Plan:
        n = tbl.num_rows
        if self.table is None or IS_DUP not in tbl.column_names:
            return Plan(list(range(n)))
        dup = tbl.column(IS_DUP).to_pylist()
        hashes = tbl.column(TEXT_HASH).to_pylist()
        ids = tbl.column("id").to_pylist()
        kept_here: dict[bytes, int] = {}
        for row in sorted(range(n), key=ids.__getitem__):
            if dup[row] is False and hashes[row] is not None:
                kept_here.setdefault(hashes[row], row)
        plan = Plan([])
        elsewhere: dict[bytes, list[int]] = {}
        for row in range(n):
            h = hashes[row]
            if dup[row] is not True or h is None:
                plan.embed.append(row)
            elif h in kept_here:
                plan.from_row[row] = kept_here[h]
            else:
                elsewhere.setdefault(h, []).append(row)
        if elsewhere:
            found = self._stored(list(elsewhere))
            for h, rows in elsewhere.items():
                if h in found:
                    plan.from_table.update({row: found[h] for row in rows})
                else:
                    plan.embed.extend(rows)
        plan.embed.sort()
        return plan

    def _stored(self, hashes: list[bytes]) -> dict[bytes, object]:
        """text_hash -> the kept member's stored value, for the hashes whose kept member has
        one written (in the newest version: see the module's docstring)."""
        ds = self.table.newest()
        if self.column not in ds.schema.names:
            return {}
        out: dict[bytes, tuple[int, object]] = {}
        for lo in range(0, len(hashes), LOOKUP_CHUNK):
            # the hashes are bytes the table holds, written as hex: nothing user-typed is pasted
            literals = ", ".join(f"X'{h.hex()}'" for h in hashes[lo:lo + LOOKUP_CHUNK])
            rows = ds.to_table(columns=["id", TEXT_HASH, self.column],
                               filter=f"{IS_DUP} = false AND {self.column} IS NOT NULL AND "
                                      f"{TEXT_HASH} IN ({literals})")
            col = rows.column(self.column)
            for i, (rid, h) in enumerate(zip(rows.column("id").to_pylist(),
                                             rows.column(TEXT_HASH).to_pylist())):
                if h not in out or rid < out[h][0]:
                    out[h] = (rid, col[i])
        return {h: _value(v) for h, (_, v) in out.items()}


def _value(scalar: pa.Scalar):
    """A stored vector (fixed_size_list) -> (dim,) float32; chunks (list of them) -> (k, dim)."""
    value = scalar.values
    if pa.types.is_fixed_size_list(value.type):  # a list of vectors: (k, dim)
        dim = value.type.list_size
        return value.flatten().to_numpy(zero_copy_only=False).astype(np.float32).reshape(-1, dim)
    return value.to_numpy(zero_copy_only=False).astype(np.float32)
