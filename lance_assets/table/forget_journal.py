"""``forget``'s journal: what a forget will erase, recorded before it erases anything, and each
phase it finished, so that a forget killed anywhere is finished by the next one.

The journal is a side Lance dataset next to the table (``<db>/corpus.forget.lance``), written
only by appends (which never conflict: two forgets at once each record their own). A row is an
event of one operation (``op``): ``plan`` carries the ids (ids only: never text, never the
predicate, which is kept as its sha256) and the snapshots that held them; a phase's row says it
finished; ``done`` closes the operation. An operation with a plan and no ``done`` is pending.
A redaction's phases are events ``redact:<tag>:<phase>`` (``table.redact``); its ``held`` event
keeps the ids (and their tokens' count) the snapshot lost, which ``diff``, ``explain`` and a
resumed run read back (``forgotten_ids``, ``gone``).
"""

from __future__ import annotations

import json
import secrets
import time
from dataclasses import dataclass, field

import lance
import numpy as np
import pyarrow as pa
import pyarrow.compute  # noqa: F401 - pa.compute

from lance_assets import storage
from lance_assets.table import Table
from lance_assets.table.redact import redactions
from lance_assets.table.side import append_side, read_side

PLAN, DONE = "plan", "done"
SCHEMA = pa.schema([pa.field("op", pa.string()), pa.field("event", pa.string()),
                    pa.field("ids", pa.list_(pa.int64())), pa.field("detail", pa.string()),
                    pa.field("at", pa.float64())])


@dataclass
class Planned:
    """One forget operation as the journal has it."""

    op: str
    ids: np.ndarray
    detail: dict
    finished: dict[str, dict] = field(default_factory=dict)  # phase -> its detail

    def has(self, phase: str) -> bool:
        return phase in self.finished


class Journal:
    def __init__(self, table: Table) -> None:
        self.table = table
        self.uri = storage.uri_of(storage.location(table.db_dir) / f"{table.name}.forget.lance")

    def _append(self, op: str, event: str, ids=(), detail: dict | None = None) -> None:
        append_side(self.uri, pa.table({
            "op": [op], "event": [event], "ids": [list(map(int, ids))],
            "detail": [json.dumps(detail or {}, sort_keys=True, default=str)],
            "at": [time.time()]}, SCHEMA))

    def plan(self, ids: np.ndarray, detail: dict) -> Planned:
        op = secrets.token_hex(8)
        self._append(op, PLAN, ids, detail)
        return Planned(op, np.asarray(ids, np.int64), detail)

    def finish(self, planned: Planned, phase: str, detail: dict | None = None) -> None:
        self._append(planned.op, phase, (), detail)
        planned.finished[phase] = detail or {}

    def events(self, prefix: str) -> list[dict]:
        """Every event whose name starts with ``prefix``, oldest first: ``{op, event, detail,
        at}`` (``redact``'s phases: what each redaction removed, by id)."""
        table, _ = read_side(self.uri)
        if table is None:
            return []
        rows = table.filter(pa.compute.starts_with(table.column("event"), prefix)).to_pylist()
        return [{"op": r["op"], "event": r["event"], "detail": json.loads(r["detail"]),
                 "at": r["at"]} for r in sorted(rows, key=lambda r: r["at"])]

    def forgotten(self, doc_id: int) -> dict | None:
        """The forget that planned to erase ``doc_id`` (ids only): ``{op, at, ids,
        predicate_sha256, done, at_done}``; None when none did."""
        table, _ = read_side(self.uri)
        if table is None:
            return None
        rows = sorted(table.to_pylist(), key=lambda r: r["at"])
        plan = next((r for r in rows if r["event"] == PLAN and doc_id in r["ids"]), None)
        if plan is None:
            return None
        done = next((r for r in rows if r["op"] == plan["op"] and r["event"] == DONE), None)
        return {"op": plan["op"], "at": plan["at"], "ids": len(plan["ids"]),
                "predicate_sha256": json.loads(plan["detail"]).get("predicate_sha256", ""),
                "done": done is not None, "at_done": done["at"] if done else None}

    def pending(self) -> list[Planned]:
        """Operations planned and not done, oldest first."""
        table, _ = read_side(self.uri)
        if table is None:
            return []
        ops: dict[str, Planned] = {}
        closed = set()
        for row in sorted(table.to_pylist(), key=lambda r: r["at"]):
            if row["event"] == PLAN:
                ops[row["op"]] = Planned(row["op"], np.asarray(row["ids"], np.int64),
                                         json.loads(row["detail"]))
            elif row["event"] == DONE:
                closed.add(row["op"])
            elif row["op"] in ops:
                ops[row["op"]].finished[row["event"]] = json.loads(row["detail"])
        return [p for op, p in ops.items() if op not in closed]


def forgotten_ids(table: Table, ds: lance.LanceDataset) -> np.ndarray:
    """The ids ``forget`` redacted from the snapshot ``ds`` is a version of (ids only, from the
    journal's ``held`` phases of the redactions it records), sorted."""
    done = {(r.get("op"), r.get("tag")) for r in redactions(ds)}
    if not done:
        return np.zeros(0, np.int64)
    got = [e["detail"].get("ids", []) for e in Journal(table).events("redact:")
           if e["event"].endswith(":held") and (e["op"], e["event"].split(":")[1]) in done]
    return np.unique(np.asarray([i for ids in got for i in ids], np.int64))


def gone(table: Table, ds: lance.LanceDataset, since: int | None = None) -> dict:
    """What ``forget`` took from the snapshot ``ds`` is a version of: ``{documents, tokens,
    from_version, forgets}`` (tokens as the table counted them, ``n_tokens``); with ``since``
    (a version the snapshot was read at, e.g. a checkpoint's), only the redactions made of that
    version or a later one."""
    done = [r for r in redactions(ds) if since is None or int(r["version"]) >= since]
    ops = {(r.get("op"), r.get("tag")) for r in done}
    held = [e["detail"] for e in Journal(table).events("redact:")
            if e["event"].endswith(":held") and (e["op"], e["event"].split(":")[1]) in ops]
    return {"documents": len({i for h in held for i in h.get("ids", [])}),
            "tokens": sum(int(h.get("tokens", 0)) for h in held),
            "from_version": done[0]["version"] if done else None, "forgets": len(done)}
