"""``diff(table, A, B)``: what changed in the data between two snapshots, and
``against_previous``: the diff from an earlier result (a run, an ablation) to this one.

Both sides are resolved (``refs``); each side's rules in force and the domains are parsed by the
predicate parser (user text, never pasted into SQL) and checked by Lance at that side's version;
the rows to read are chosen from Lance's row versions (``rows``: what changed, the rows a
changed rule moves; else every row), read at each side's version, and compared by ``id``
(``compare``). A cleanup that removes an untagged side while it is read is reported as such.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import lance
import numpy as np
import pyarrow as pa

from lance_assets import keys
from lance_assets.curation.predicate import COLUMN_NAME_RE, Predicate, PredicateError, safe_predicate
from lance_assets.curation.rules import NAME_RE, rule_predicates
from lance_assets.forensics.diff import rows as rowplan
from lance_assets.forensics.diff.compare import Frame, compare, projections
from lance_assets.forensics.diff.refs import DiffError, Side, resolve
from lance_assets.forensics.diff.report import DataDiff
from lance_assets.progress import phase
from lance_assets.table import RAW_SCHEMA, Table, is_version_gone
from lance_assets.table.forget_log import removed_by_forget

RAW = frozenset(RAW_SCHEMA.names)  # never rewritten: not compared


def _quiet(_msg: str) -> None:
    pass


@dataclass
class _Prepared:
    """A side with its rules and domains checked against its version."""

    side: Side
    rules: dict[str, Predicate]  # the ones Lance can evaluate there
    problems: dict[str, str]  # rule -> why it cannot be evaluated there
    domains: dict[str, Predicate]

    @property
    def ds(self) -> lance.LanceDataset:
        return self.side.dataset


def _prepare(side: Side, domains: Mapping[str, str]) -> tuple[_Prepared, dict[str, str]]:
    usable, problems = rule_predicates(side.dataset, side.rules) if side.rules else ({}, [])
    doms, dproblems = {}, {}
    for name, text in domains.items():
        try:
            doms[name] = safe_predicate(text, side.dataset.schema.names)
        except PredicateError as err:
            dproblems[name] = err.reason
    return _Prepared(side, usable, {p.rule: p.problem for p in problems}, doms), dproblems


def _columns(a: lance.LanceDataset, b: lance.LanceDataset
             ) -> tuple[list[str], list[str], list[str], list[str]]:
    """(columns compared by value, only in A, only in B, in both but not compared)."""
    def scalar(t: pa.DataType) -> bool:
        t = t.value_type if pa.types.is_dictionary(t) else t
        return (pa.types.is_boolean(t) or pa.types.is_integer(t) or pa.types.is_floating(t)
                or pa.types.is_string(t) or pa.types.is_large_string(t))

    def ours(name: str) -> bool:
        return name not in RAW and not name.startswith("_")

    sa = {f.name: f.type for f in a.schema if ours(f.name)}
    sb = {f.name: f.type for f in b.schema if ours(f.name)}
    both = [n for n in sa if n in sb]
    compared = [n for n in both if scalar(sa[n]) and scalar(sb[n]) and COLUMN_NAME_RE.match(n)]
    return (compared, [n for n in sa if n not in sb], [n for n in sb if n not in sa],
            [n for n in both if n not in compared])


def _flipped(a: _Prepared, b: _Prepared, untouched: np.ndarray) -> np.ndarray | str:
    """The rows of ``untouched`` (same values on both sides) whose verdict under a rule that
    differs between the sides differs (each side's rule evaluated at its own version, reading
    only its columns); a reason when the versions' rows do not line up."""
    names = [n for n in {**a.rules, **b.rules} if (n in a.rules) != (n in b.rules)
             or (n in a.rules and a.rules[n].lance != b.rules[n].lance)]
    if not names or not len(untouched):
        return np.empty(0, np.uint64)
    votes = []
    for p in (a, b):
        vote = np.ones((len(untouched), len(names)), bool)  # no rule: keeps every row
        mine = [n for n in names if n in p.rules]
        if mine:
            t = rowplan.verdicts(p.ds, [p.rules[n].lance for n in mine])
            rid = t.column(rowplan.ROWID).to_numpy()
            keep = rowplan.member(rid, untouched)
            order = np.argsort(rid[keep])
            if not np.array_equal(rid[keep][order], untouched):
                return f"the rows of version {p.ds.version} do not match the row versions"
            for i, n in enumerate(mine):
                vote[:, names.index(n)] = t.column(f"v{i}").fill_null(False).to_numpy(
                    zero_copy_only=False)[keep][order]
        votes.append(vote)
    return untouched[(votes[0] != votes[1]).any(axis=1)]


def _plan(a: _Prepared, b: _Prepared, read: set[str], full: bool, log) -> rowplan.Plan:
    every_row = {"a": None, "b": None}
    if full:
        return rowplan.Plan(rowplan.FULL_SCAN, "asked for", every_row)
    # a redacted copy stands where forget found it on the main line: its rows keep their
    # row versions, and the documents it lost are counted apart (``compare``: forgotten)
    (lo_line, lo), (_, hi) = sorted(((p.side.line_version, p.ds) for p in (a, b)),
                                    key=lambda x: x[0])
    got = rowplan.tracked_changes(lo, hi, read, lo_line)
    if not isinstance(got, str):
        changed, removed, every = got
        flipped = _flipped(a, b, every[~rowplan.member(every, changed)])
        got = flipped if isinstance(flipped, str) else (changed, removed, flipped)
    if isinstance(got, str):
        log(f"diff: {got}; reading every row of both versions")
        return rowplan.Plan(rowplan.FULL_SCAN, got, every_row)
    changed, removed, flipped = got
    # removed rows and rows only a rule moves are read light (their values are compared with
    # nothing): verdicts, domains, source and tokens
    whole = changed.astype(np.uint64)
    light = np.unique(np.concatenate([removed, flipped])).astype(np.uint64)
    light = light[~rowplan.member(light, whole)]
    return rowplan.Plan(rowplan.ROW_VERSIONS, "only the rows that changed, and the rows a "
                        "changed rule moves", {"a": whole, "b": whole}, len(changed),
                        len(removed), len(flipped), {"a": light, "b": light})


def diff(table: Table, a: str | int, b: str | int, *,
         domains: Mapping[str, str] | None = None, full: bool = False,
         log: Callable[[str], None] | None = None) -> DataDiff:
    """What changed between snapshots ``a`` and ``b`` (tags, version numbers, training runs,
    ablations or ablation arms: ``refs.resolve``). ``domains``: name -> predicate over the
    table's columns (parsed, never pasted), counted like the sources. ``full``: read every row
    of both versions even where the row versions say what changed."""
    log = log or _quiet
    start = time.perf_counter()
    domains = dict(domains or {})
    for name in domains:
        if not isinstance(name, str) or not NAME_RE.match(name):
            raise DiffError(f"domain {name!r}: a domain name must be an identifier (letters, "
                            "digits, underscores)")
    (pa_, dprob_a), (pb_, dprob_b) = (_prepare(resolve(table, s), domains) for s in (a, b))
    both_bad = sorted(set(dprob_a) & set(dprob_b))
    if both_bad:
        raise DiffError(f"domain {both_bad[0]} ({domains[both_bad[0]]!r}): {dprob_b[both_bad[0]]}")
    notes = [f"domain {d} cannot be evaluated at {side}: {why}"
             for side, probs in (("A", dprob_a), ("B", dprob_b)) for d, why in probs.items()]
    try:
        out = _read_and_compare(pa_, pb_, list(domains), log, full)
    except Exception as exc:  # noqa: BLE001 - re-raised unless a cleanup removed a side
        if not is_version_gone(exc):
            raise
        why = next(filter(None, (removed_by_forget(table, p.side.version) for p in (pa_, pb_))),
                   "table_maintenance removes the versions no tag names once they are older "
                   "than keep_versions_hours")
        raise DiffError(
            f"a cleanup removed files of {pa_.side.label()} or {pb_.side.label()} while the diff "
            f"read them ({str(exc).splitlines()[0][:160]}): {why}. Compare tagged snapshots "
            "(python -m lance_assets diff --list), or hold a tag on a version to keep it"
            ) from None
    out.notes = notes
    out.cost["seconds"] = round(time.perf_counter() - start, 3)
    return out


def _read_and_compare(a: _Prepared, b: _Prepared, domains: list[str], log, full: bool
                      ) -> DataDiff:
    compared, only_a, only_b, not_compared = _columns(a.ds, b.ds)
    rowplan.read_bytes(a.ds), rowplan.read_bytes(b.ds)  # count from here
    with phase(f"diff: planning {a.side.label()} → {b.side.label()}", log, announce=False):
        read = {"id", "source", keys.N_TOKENS, *compared}
        for p in (*a.rules.values(), *b.rules.values(), *a.domains.values(),
                  *b.domains.values()):
            read |= set(p.columns)
        plan = _plan(a, b, read, full, log)
    costs, frames = {}, {}
    for key, p in (("a", a), ("b", b)):
        names, cost = set(p.ds.schema.names), rowplan.Cost()
        t = rowplan.read_rows(p.ds, plan.rows[key], projections(names, p.rules, p.domains,
                                                                 compared), cost, log)
        if plan.moved.get(key) is not None and len(plan.moved[key]):
            # rows one side lacks, and rows only a changed rule moves (the same values on both
            # sides): their rules, domains, source and tokens, not the columns compared by value
            more = rowplan.read_rows(p.ds, plan.moved[key],
                                     projections(names, p.rules, p.domains, []), cost, log)
            t = pa.concat_tables([t, more], promote_options="default")
        cost.bytes_read = rowplan.read_bytes(p.ds)
        costs[key], frames[key] = cost, Frame(t, p.rules, p.domains, domains)
    out = compare(a.side, b.side, frames["a"], frames["b"], (a.problems, b.problems), compared,
                  domains)
    out.columns_only_a, out.columns_only_b, out.columns_not_compared = only_a, only_b, not_compared
    out.cost = {"mode": plan.mode, "why": plan.why, "changed_rows": plan.changed,
                "removed_rows": plan.removed, "flipped_rows": plan.flipped,
                "a": costs["a"].to_dict(), "b": costs["b"].to_dict()}
    return out


def against_previous(table: Table, previous: list[str | int | None], current: str | int,
                     *, log: Callable[[str], None] | None = None) -> DataDiff:
    """The diff from an earlier result to ``current``: the first of ``previous`` (say a run's
    folder, then its tag, then its version) that names a side; when none does, the error the
    most specific one raised (a snapshot gone: who held it and what released it)."""
    first: DiffError | None = None
    for ref in previous:
        if ref is None or str(ref).strip() == "":
            continue
        try:
            resolve(table, ref)
        except DiffError as err:
            first = first or err
            continue
        return diff(table, ref, current, log=log)
    raise first or DiffError("no earlier result to compare with")
