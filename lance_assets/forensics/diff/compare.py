"""Two sides' rows compared by ``id``: documents added and removed, what each rule moved, per
source and per domain, every compared column's changed values.

A side's rows arrive as an Arrow table (``Frame``): ``id``, ``source``, ``n_tokens``, each of
its rules' verdicts and each domain's (evaluated by Lance, the engine training filters with: NULL
does not pass), and the columns compared by value. They are the rows that changed, or every
row; a row left out holds the same values on both sides and adds nothing to any count, so every
figure is the same either way. A rule present on one side only keeps every document on the
other. Moves are counted over the documents in both versions; the added and removed ones apart,
by id (never by text).
"""

from __future__ import annotations

from dataclasses import asdict

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from lance_assets import keys
from lance_assets.curation.predicate import Predicate
from lance_assets.forensics.diff.refs import Side
from lance_assets.forensics.diff.report import (
    EXAMPLES,
    ColumnChange,
    DataDiff,
    GroupChange,
    RuleChange,
)
from lance_assets.forensics.diff.rows import member

RULE, DOMAIN = "__diff_rule_", "__diff_domain_"
NO_SOURCE = "(no source column)"


def projections(names: set[str], rules: dict[str, Predicate], domains: dict[str, Predicate],
                columns: list[str]) -> dict[str, str]:
    """What to read of a side whose columns are ``names`` (alias -> Lance SQL): ``id``,
    ``source``, ``n_tokens``, each rule's and domain's verdict (checked predicates), and
    ``columns``."""
    out = {"id": "`id`"}
    for col in ("source", keys.N_TOKENS):
        if col in names:
            out[col] = f"`{col}`"
    for i, p in enumerate(rules.values()):
        out[f"{RULE}{i}"] = f"({p.lance})"
    for i, p in enumerate(domains.values()):
        out[f"{DOMAIN}{i}"] = f"({p.lance})"
    for col in columns:
        out.setdefault(col, f"`{col}`")
    return out


class Frame:
    """One side's rows (read with ``projections``) as numpy arrays: ids, tokens, sources,
    each rule's verdict, the rules' joint verdict (``kept``), each domain's."""

    def __init__(self, t: pa.Table, rules: dict[str, Predicate], domains: dict[str, Predicate],
                 all_domains: list[str]):
        self.t = t
        self.ids = t.column("id").to_numpy(zero_copy_only=False).astype(np.int64)
        n = len(self.ids)
        self.tokens = (t.column(keys.N_TOKENS).fill_null(0).to_numpy(zero_copy_only=False)
                       .astype(np.int64) if keys.N_TOKENS in t.column_names
                       else np.zeros(n, np.int64))
        self.sources = (np.asarray(t.column("source").fill_null("(null)").to_pylist(), object)
                        if "source" in t.column_names else np.full(n, NO_SOURCE, object))
        self.verdict = {name: self._bool(f"{RULE}{i}") for i, name in enumerate(rules)}
        self.kept = np.ones(n, bool)
        for v in self.verdict.values():
            self.kept &= v
        index = {name: i for i, name in enumerate(domains)}
        self.domain = {d: self._bool(f"{DOMAIN}{index[d]}") if d in index else np.zeros(n, bool)
                       for d in all_domains}

    def _bool(self, col: str) -> np.ndarray:
        return self.t.column(col).fill_null(False).to_numpy(zero_copy_only=False).astype(bool)


def _id_runs(ids: np.ndarray) -> list[list[int]]:
    """Sorted ids as [first, last] runs of consecutive ids."""
    if not len(ids):
        return []
    ids = np.sort(ids)
    breaks = np.flatnonzero(np.diff(ids) != 1)
    starts = np.concatenate([[0], breaks + 1])
    ends = np.concatenate([breaks, [len(ids) - 1]])
    return [[int(ids[s]), int(ids[e])] for s, e in zip(starts, ends)]


def _tokens(mask: np.ndarray, tokens: np.ndarray) -> int:
    return int(tokens[mask].sum())


def compare(sa: Side, sb: Side, fa: Frame, fb: Frame, problems: tuple[dict, dict],
            compared: list[str], domains: list[str]) -> DataDiff:
    """The diff of two sides' rows (``problems``: each side's rules it cannot evaluate, by
    name, with the reason)."""
    order_a, order_b = np.argsort(fa.ids, kind="stable"), np.argsort(fb.ids, kind="stable")
    sorted_a, sorted_b = fa.ids[order_a], fb.ids[order_b]
    in_b = member(fa.ids, sorted_b)  # A's rows that B has
    only_a, only_b = ~in_b, ~member(fb.ids, sorted_a)
    xa = np.flatnonzero(in_b)
    xa = xa[np.argsort(fa.ids[xa], kind="stable")]  # rows in both, by id
    both = fa.ids[xa]
    xb = order_b[np.searchsorted(sorted_b, both)]
    rows_a, rows_b = sa.dataset.count_rows(), sb.dataset.count_rows()
    documents = {"a": rows_a, "b": rows_b, "added": int(only_b.sum()),
                 "added_ids": _id_runs(fb.ids[only_b]), "removed": int(only_a.sum()),
                 "removed_ids": _id_runs(fa.ids[only_a]), "in_both": rows_b - int(only_b.sum())}
    # documents forget redacted from A's snapshot (ids from its journal) that B lacks too
    gone = np.setdiff1d(sa.forgotten if sa.forgotten is not None else np.zeros(0, np.int64),
                        sb.forgotten if sb.forgotten is not None else np.zeros(0, np.int64))
    gone = gone[~member(gone.astype(sorted_b.dtype), sorted_b)] if len(gone) else gone
    documents.update(forgotten=int(len(gone)), forgotten_ids=_id_runs(np.sort(gone)))
    ka, kb = fa.kept[xa], fb.kept[xb]
    out_m, in_m = ka & ~kb, ~ka & kb
    kept_a_removed = fa.kept & only_a
    kept_b_added = fb.kept & only_b
    training = {
        "out_docs": int(out_m.sum()), "out_tokens": _tokens(out_m, fa.tokens[xa]),
        "in_docs": int(in_m.sum()), "in_tokens": _tokens(in_m, fb.tokens[xb]),
        "added_kept_docs": int(kept_b_added.sum()),
        "added_kept_tokens": _tokens(kept_b_added, fb.tokens),
        "removed_kept_docs": int(kept_a_removed.sum()),
        "removed_kept_tokens": _tokens(kept_a_removed, fa.tokens),
        "net_docs": int(fb.kept.sum()) - int(fa.kept.sum()),
        "net_tokens": _tokens(fb.kept, fb.tokens) - _tokens(fa.kept, fa.tokens)}
    rules = []
    text_a, text_b = sa.rules, sb.rules
    for name in list(text_a) + [n for n in text_b if n not in text_a]:
        va = fa.verdict[name][xa] if name in fa.verdict else np.ones(len(both), bool)
        vb = fb.verdict[name][xb] if name in fb.verdict else np.ones(len(both), bool)
        ta, tb = text_a.get(name), text_b.get(name)
        status = ("added" if ta is None else "removed" if tb is None else
                  "same" if ta == tb else "changed")
        problem = "; ".join(f"cannot be evaluated at {s} ({p[name]}): keeps every document there"
                            for s, p in zip("AB", problems) if name in p)
        o, i = va & ~vb, ~va & vb
        rules.append(RuleChange(name, status, ta, tb, int(o.sum()), _tokens(o, fa.tokens[xa]),
                                int(i.sum()), _tokens(i, fb.tokens[xb]), problem))
    # per source and domain: A's rows counted where A puts them, B's where B does
    out_a = np.zeros(len(fa.ids), bool)
    out_a[xa] = out_m
    into_b = np.zeros(len(fb.ids), bool)
    into_b[xb] = in_m
    sources = _sources(fa, fb, only_a, only_b, out_a, into_b)
    doms = [g for g in (_group(d, fa.domain[d], fb.domain[d], fa, fb, only_a, only_b, out_a,
                               into_b) for d in domains) if _moved(g)]
    columns = [_column(c, fa.t.column(c).take(pa.array(xa)), fb.t.column(c).take(pa.array(xb)),
                       both) for c in compared]
    same_tok = None
    if sa.tokenizer or sb.tokenizer:
        same_tok = bool(sa.tokenizer and sb.tokenizer
                        and sa.tokenizer.get("sha256") == sb.tokenizer.get("sha256"))
    read = None
    if sa.read is not None and sb.read is not None:
        inter = np.intersect1d(sa.read, sb.read)
        read = {"a": int(len(sa.read)), "b": int(len(sb.read)), "both": int(len(inter)),
                "only_a": int(len(sa.read) - len(inter)), "only_b": int(len(sb.read) - len(inter))}
    return DataDiff(a=sa.to_dict(), b=sb.to_dict(), documents=documents, training=training,
                    rules=rules, sources=sources, domains=doms, columns=columns,
                    columns_only_a=[], columns_only_b=[], columns_not_compared=[],
                    tokenizer={"a": sa.tokenizer, "b": sb.tokenizer, "same": same_tok},
                    read=read, cost={})


def _group(name: str, ga: np.ndarray, gb: np.ndarray, fa: Frame, fb: Frame,
           only_a: np.ndarray, only_b: np.ndarray, out_a: np.ndarray, in_b: np.ndarray
           ) -> GroupChange:
    """One group's sums: ``ga`` / ``gb`` mark the rows of each side in it."""
    return GroupChange(
        str(name),
        added_docs=int((gb & only_b).sum()), added_tokens=_tokens(gb & only_b, fb.tokens),
        removed_docs=int((ga & only_a).sum()), removed_tokens=_tokens(ga & only_a, fa.tokens),
        in_docs=int((gb & in_b).sum()), in_tokens=_tokens(gb & in_b, fb.tokens),
        out_docs=int((ga & out_a).sum()), out_tokens=_tokens(ga & out_a, fa.tokens),
        kept_docs_net=int((gb & fb.kept).sum()) - int((ga & fa.kept).sum()),
        kept_tokens_net=_tokens(gb & fb.kept, fb.tokens) - _tokens(ga & fa.kept, fa.tokens))


def _moved(g: GroupChange) -> bool:
    return any(v for k, v in asdict(g).items() if k != "group")


def _sources(fa: Frame, fb: Frame, only_a: np.ndarray, only_b: np.ndarray,
             out_a: np.ndarray, in_b: np.ndarray) -> list[GroupChange]:
    """Sums per source value, in one pass over the rows (bincount by source); sources where
    nothing changed are left out."""
    names, inverse = np.unique(np.concatenate([fa.sources, fb.sources]).astype(str),
                               return_inverse=True)
    ia, ib = inverse[:len(fa.sources)], inverse[len(fa.sources):]

    def count(index, mask, weights=None):
        return np.bincount(index[mask], None if weights is None else weights[mask],
                           minlength=len(names)).astype(np.int64)

    sums = {
        "added_docs": count(ib, only_b), "added_tokens": count(ib, only_b, fb.tokens),
        "removed_docs": count(ia, only_a), "removed_tokens": count(ia, only_a, fa.tokens),
        "in_docs": count(ib, in_b), "in_tokens": count(ib, in_b, fb.tokens),
        "out_docs": count(ia, out_a), "out_tokens": count(ia, out_a, fa.tokens),
        "kept_docs_net": count(ib, fb.kept) - count(ia, fa.kept),
        "kept_tokens_net": count(ib, fb.kept, fb.tokens) - count(ia, fa.kept, fa.tokens)}
    groups = [GroupChange(str(n), **{k: int(v[i]) for k, v in sums.items()})
              for i, n in enumerate(names)]
    return [g for g in groups if _moved(g)]


def _column(name: str, va: pa.ChunkedArray, vb: pa.ChunkedArray, ids: np.ndarray) -> ColumnChange:
    if pa.types.is_dictionary(va.type):
        va = va.cast(va.type.value_type)
    if pa.types.is_dictionary(vb.type):
        vb = vb.cast(vb.type.value_type)
    if va.type != vb.type:
        try:
            vb = vb.cast(va.type)
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
            return ColumnChange(name, f"{va.type} → {vb.type}")
    valid_a = va.is_valid().to_numpy(zero_copy_only=False)
    valid_b = vb.is_valid().to_numpy(zero_copy_only=False)
    equal = pc.equal(va, vb).fill_null(False).to_numpy(zero_copy_only=False)
    if pa.types.is_floating(va.type):
        equal |= (pc.is_nan(va).fill_null(False).to_numpy(zero_copy_only=False)
                  & pc.is_nan(vb).fill_null(False).to_numpy(zero_copy_only=False))
    changed = valid_a & valid_b & ~equal
    filled, cleared = ~valid_a & valid_b, valid_a & ~valid_b
    out = ColumnChange(name, str(va.type), int(changed.sum()), filled=int(filled.sum()),
                       cleared=int(cleared.sum()))
    if pa.types.is_boolean(va.type):
        now = vb.fill_null(False).to_numpy(zero_copy_only=False).astype(bool)
        out.to_true, out.to_false = int((changed & now).sum()), int((changed & ~now).sum())
    out.examples = [int(i) for i in np.sort(ids[changed | filled | cleared])[:EXAMPLES]]
    return out


