"""A mixture's domains and weights, and the schedule that draws blocks from them.

A **domain** is a named SQL predicate over the table's columns (``{"web": "url LIKE '%.org/%'",
"code": "source = 'code'"}``), parsed and checked like a curation rule, never pasted; or the
name of a column, one domain per distinct value. Every training document must be in exactly one
domain: rows in none or in two are counted and refused, naming a few of them.

A **weight** is a domain's share of the training *tokens*. Blocks are fixed-length, so shares of
blocks are shares of tokens: global block ``g`` (split ``g % num_splits``, that split's
``g // num_splits``-th block) comes from domain ``schedule[g % PERIOD]``. The schedule is a
smooth weighted round-robin over ``PERIOD`` positions (each domain's quota rounded to whole
positions, then at every position the domain furthest behind its quota goes next; the seed
only orders ties), so over any window of positions each domain's count stays within two blocks
of its share. It depends on the weights and the seed only, never on the world size.

Torch-free: the mixture search plans with it as the trainer trains with it.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass

import lance
import numpy as np
import pyarrow.compute as pc
from sqlglot import exp

from lance_assets.table.predicate import Predicate, PredicateError, lance_problem, safe_predicate
from lance_assets.train.config import ConfigError

PERIOD = 10_000
"""Schedule positions before it repeats: weights are honoured to 1/PERIOD."""
MAX_DOMAINS = 64
NAME_RE = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,63}$")
EXAMPLES = 5  # ids quoted in a coverage refusal


class DomainError(ConfigError):
    """Domains or weights that cannot be used; the message names the flag and the fix."""


def json_object(text: str, flag: str, shape: str):
    """``text`` parsed as JSON, a key given twice in one object refused naming it (``json.loads``
    alone keeps the last one silently); ``shape`` is the form to give, for the message."""
    def once(pairs):
        seen = set()
        for key, _ in pairs:
            if key in seen:
                raise DomainError(f"{flag}: {key!r} is given twice; name each domain once "
                                  f"(as {shape})")
            seen.add(key)
        return dict(pairs)

    try:
        return json.loads(text, object_pairs_hook=once)
    except DomainError:
        raise
    except ValueError as e:
        raise DomainError(f"{flag}: not a JSON object ({e}); give {shape}") from None


def _bad_name(name) -> bool:
    return not isinstance(name, str) or not NAME_RE.match(name)


def _column_domains(ds: lance.LanceDataset, column: str, scope: Predicate | None) -> dict[str, str]:
    """One predicate per distinct value of ``column`` (within ``scope``), as SQL built from a
    parsed tree: the value is a literal, never text pasted into SQL."""
    field = ds.schema.field(column)
    import pyarrow as pa

    if not (pa.types.is_string(field.type) or pa.types.is_large_string(field.type)
            or pa.types.is_integer(field.type)):
        raise DomainError(f"--domains {column}: column {column!r} is {field.type}; a domain "
                          "column holds strings or integers (or give {name: predicate})")
    values = pc.unique(ds.to_table(columns=[column], filter=scope.lance if scope else None)
                       .column(0)).drop_null().to_pylist()
    if len(values) > MAX_DOMAINS:
        raise DomainError(f"--domains {column}: {len(values)} distinct values, more than "
                          f"{MAX_DOMAINS} domains; group them with {{name: predicate}}")
    out = {}
    for value in sorted(values, key=str):
        name = str(value)
        if _bad_name(name):
            raise DomainError(f"--domains {column}: value {name!r} cannot name a domain "
                              "(letters, digits, '_', '.', '-', at most 64); give the domains as "
                              "{name: predicate} instead")
        literal = exp.Literal.string(value) if isinstance(value, str) else exp.Literal.number(value)
        out[name] = exp.EQ(this=exp.column(column), expression=literal).sql(dialect="duckdb")
    return out


def parse_domains(spec: str, ds: lance.LanceDataset, scope: Predicate | None = None,
                  flag: str = "--domains") -> dict[str, Predicate]:
    """``spec`` (a JSON object {name: predicate}, or a column name) as checked predicates over
    ``ds``'s columns; a ``DomainError`` naming every broken domain otherwise."""
    columns = ds.schema.names
    text = spec.strip()
    if re.match(r"^[A-Za-z_][A-Za-z0-9_]*$", text):
        if text not in columns:
            raise DomainError(f"{flag} {text}: the table has no column {text!r}; give a column "
                              "whose values name the domains, or a JSON object "
                              "{name: SQL predicate}")
        raw = _column_domains(ds, text, scope)
    else:
        raw = json_object(text, flag, '{"name": "SQL predicate", ...} or a column name')
    if not isinstance(raw, dict) or not raw:
        raise DomainError(f"{flag}: give at least one domain, as {{name: SQL predicate}} or a "
                          "column name")
    if len(raw) > MAX_DOMAINS:
        raise DomainError(f"{flag}: {len(raw)} domains, more than {MAX_DOMAINS}")
    out, problems = {}, []
    for name, predicate in raw.items():
        if _bad_name(name):
            problems.append(f"{name!r}: a domain name is letters, digits, '_', '.', '-' "
                            "(at most 64)")
            continue
        try:
            parsed = safe_predicate(predicate, columns)
        except PredicateError as e:
            problems.append(f"{name}: {e}")
            continue
        problem = lance_problem(ds, parsed)
        if problem:
            problems.append(f"{name}: {problem}")
            continue
        out[name] = parsed
    if problems:
        raise DomainError(f"{flag}: {len(problems)} domain(s) cannot be used: "
                          + "; ".join(problems))
    return out


def parse_weights(spec: str, names: list[str], flag: str = "--weights") -> dict[str, float]:
    """``spec`` (a JSON object {domain: share}) normalised to sum 1, for exactly ``names``."""
    raw = json_object(spec, flag, '{"domain": share, ...}') if spec.strip() else None
    if not isinstance(raw, dict):
        raise DomainError(f"{flag}: give each domain's share of the training tokens, as "
                          f"{{domain: share}} for {', '.join(names)}")
    missing, extra = set(names) - set(raw), set(raw) - set(names)
    if missing or extra:
        raise DomainError(f"{flag}: name every domain once: "
                          + (f"missing {', '.join(sorted(missing))}" if missing else "")
                          + ("; " if missing and extra else "")
                          + (f"no domain named {', '.join(sorted(map(str, extra)))}" if extra
                             else ""))
    bad = [k for k, v in raw.items() if isinstance(v, bool) or not isinstance(v, (int, float))
           or not np.isfinite(v) or v < 0]
    if bad:
        raise DomainError(f"{flag}: the share of {', '.join(bad)} is not a number >= 0")
    total = float(sum(raw.values()))
    if total <= 0:
        raise DomainError(f"{flag}: the shares add up to 0; give at least one domain a share")
    return {name: float(raw[name]) / total for name in names}


@dataclass(frozen=True)
class Coverage:
    """How the domains cover ``scope``'s documents."""

    docs: int
    in_none: int
    in_several: int
    none_ids: list[int]
    several_ids: list[int]
    at_least: bool = False  # in_several is a lower bound (too many domains to count exactly)

    @property
    def ok(self) -> bool:
        return not self.in_none and not self.in_several

    def problem(self, flag: str = "--domains") -> str:
        parts = []
        if self.in_none:
            parts.append(f"{self.in_none:,} are in no domain (ids {self.none_ids})")
        if self.in_several:
            parts.append(f"{'at least ' if self.at_least else ''}{self.in_several:,} are in "
                         f"two or more (ids {self.several_ids})")
        return (f"{flag}: of the {self.docs:,} documents the mixture trains on, "
                + " and ".join(parts) + ". Make the domains cover every document exactly once "
                "(add a domain for the rest, or narrow one so they do not overlap), or narrow "
                "the training filter")


def _either(predicates: list[Predicate], columns) -> Predicate:
    """TRUE where any of ``predicates`` is TRUE, FALSE elsewhere (a NULL counts as not)."""
    text = " OR ".join(f"({p.duckdb})" for p in predicates)
    return safe_predicate(f"COALESCE({text}, FALSE)", columns, max_chars=1 << 20)


def _ids(ds: lance.LanceDataset, where: Predicate) -> list[int]:
    return ds.to_table(columns=["id"], filter=where.lance, limit=EXAMPLES).column(0).to_pylist()


def coverage(ds: lance.LanceDataset, domains: dict[str, Predicate], scope: Predicate) -> Coverage:
    """Which of ``scope``'s documents fall in no domain and which in several (a predicate that
    is NULL for a row does not take it): counts, and a few ids of each; nothing per document
    is held in memory."""
    columns, preds = ds.schema.names, list(domains.values())
    docs = ds.count_rows(filter=scope.lance)
    anywhere = scope.and_(_either(preds, columns))
    in_any = ds.count_rows(filter=anywhere.lance)
    memberships = sum(ds.count_rows(filter=scope.and_(p).lance) for p in preds)
    pairs = [a.and_(b) for i, a in enumerate(preds) for b in preds[i + 1:]]
    several, at_least, several_ids = memberships - in_any, True, []
    if several:
        try:
            both = scope.and_(_either(pairs, columns))
            several, at_least = ds.count_rows(filter=both.lance), False
            several_ids = _ids(ds, both)
        except PredicateError:  # too many domains for one predicate: the excess, a bound
            for pair in pairs:
                several_ids += _ids(ds, scope.and_(pair))
                if len(several_ids) >= EXAMPLES:
                    break
    none = scope.and_(_either(preds, columns).negated())
    return Coverage(docs, docs - in_any, several, _ids(ds, none) if docs > in_any else [],
                    several_ids[:EXAMPLES], at_least and several > 0)


def check_coverage(ds: lance.LanceDataset, domains: dict[str, Predicate], scope: Predicate,
                   flag: str = "--domains") -> Coverage:
    found = coverage(ds, domains, scope)
    if not found.ok:
        raise DomainError(found.problem(flag))
    return found


# ---- the schedule


def quotas(weights: list[float], period: int = PERIOD) -> np.ndarray:
    """Whole positions per period for each weight (largest remainders), summing to ``period``."""
    w = np.asarray(weights, dtype=np.float64)
    exact = w / w.sum() * period
    out = np.floor(exact).astype(np.int64)
    short = period - int(out.sum())
    order = np.lexsort((np.arange(len(w)), -(exact - out)))
    out[order[:short]] += 1
    return out


def schedule(weights: list[float], seed: int, period: int = PERIOD) -> np.ndarray:
    """The domain index of each of ``period`` block positions: smooth weighted round-robin
    (each position goes to the domain with the largest credit, which then pays ``period``; every
    domain earns its quota per position), ties ordered by ``seed``."""
    q = quotas(weights, period)
    tie = np.random.default_rng(seed).permutation(len(q)).tolist()
    credit = [0] * len(q)
    out = np.empty(period, dtype=np.int16)
    rank = list(range(len(q)))
    for g in range(period):
        for d in rank:
            credit[d] += int(q[d])
        best = max(rank, key=lambda d: (credit[d], -tie[d]))
        credit[best] -= period
        out[g] = best
    return out


def draws(sched: np.ndarray, num_splits: int, blocks_per_split: int,
          domains: int, chunk: int = 1 << 22) -> np.ndarray:
    """(domains, num_splits): blocks each split takes from each domain over its first
    ``blocks_per_split`` blocks (global positions ``n * num_splits + split``)."""
    out = np.zeros((domains, num_splits), dtype=np.int64)
    period = len(sched)
    for split in range(num_splits):
        for start in range(0, blocks_per_split, chunk):
            n = np.arange(start, min(blocks_per_split, start + chunk), dtype=np.int64)
            out[:, split] += np.bincount(sched[(n * num_splits + split) % period],
                                         minlength=domains)[:domains]
    return out


# ---- the one check of a mixture, and its plan


@dataclass(frozen=True)
class DomainSize:
    """What a domain holds of the documents a run trains on."""

    name: str
    predicate: str  # as given
    docs: int
    tokens: int  # sum of n_tokens
    blocks: int  # packed blocks of an epoch, one EOS per document, a multiple of num_splits

    def said(self, version: int) -> str:
        return (f"domain {self.name!r} (predicate `{self.predicate}`) holds {self.docs:,} rows / "
                f"{self.tokens:,} tokens at version {version}")


def domain_sizes(ds: lance.LanceDataset, predicates: dict[str, Predicate], scope: Predicate,
                 block_len: int, num_splits: int) -> list[DomainSize]:
    """Each domain's documents, tokens and packed blocks within ``scope``."""
    out = []
    for name, pred in predicates.items():
        docs = tokens = 0
        for batch in ds.to_batches(columns=["n_tokens"], filter=scope.and_(pred).lance):
            col = batch.column(0).to_numpy(zero_copy_only=False)
            docs, tokens = docs + len(col), tokens + int(col.sum())
        blocks = (tokens + docs) // block_len  # one EOS per document (data.count_blocks)
        out.append(DomainSize(name, pred.source, docs, tokens, blocks - blocks % num_splits))
    return out


def check_domains(ds: lance.LanceDataset, spec: str, scope: Predicate, *, block_len: int,
                  num_splits: int, weights: str | None = None,
                  coverage_scope: Predicate | None = None, flag: str = "--domains",
                  weights_flag: str = "--weights",
                  ) -> tuple[dict[str, Predicate], dict[str, float] | None, list[DomainSize]]:
    """The one check of a mixture's domains, made by the trainer and by every asset before it
    tags a version, writes a plan or starts a process: ``spec`` parsed, ``weights`` (when given)
    naming each domain once, every document of ``coverage_scope`` (default ``scope``) in exactly
    one domain, and every domain that trains (weight > 0; all of them without ``weights``)
    packing into at least ``num_splits`` blocks of ``scope`` (the documents it trains on). A
    ``DomainError`` naming each bad domain with its rows and tokens at ``ds``'s version
    otherwise."""
    covered = coverage_scope or scope
    predicates = parse_domains(spec, ds, scope=covered, flag=flag)
    shares = parse_weights(weights, list(predicates), flag=weights_flag) if weights is not None \
        else None
    check_coverage(ds, predicates, covered, flag=flag)
    sizes = domain_sizes(ds, predicates, scope, block_len, num_splits)
    empty = [d for d in sizes if d.blocks == 0 and (shares is None or shares[d.name] > 0)]
    if empty:
        raise DomainError(
            f"{flag}: " + "; ".join(
                d.said(ds.version) + (f", weight {shares[d.name]:.3f}" if shares else "")
                + f": fewer than {num_splits} blocks of {block_len} tokens to train on"
                for d in empty)
            + ". " + ("Give it weight 0, or w" if shares is not None else "W") + "iden its "
            "predicate, drop it (merging its documents into another domain) or add documents")
    return predicates, shares, sizes


@dataclass(frozen=True)
class Domain:
    name: str
    predicate: str  # the domain's own predicate (Lance SQL)
    filter: str  # what its stream reads: the training split AND the domain (Lance SQL)
    weight: float
    tokens: int  # n_tokens of its training documents
    blocks_per_epoch: int  # packed blocks an epoch of it makes (a multiple of num_splits)


@dataclass(frozen=True)
class Mixture:
    """The domains of a run, their weights and the schedule (the same on every rank)."""

    domains: list[Domain]
    schedule: np.ndarray
    seed: int
    epochs_needed: dict[str, float]  # passes over each domain the whole run takes

    @property
    def names(self) -> list[str]:
        return [d.name for d in self.domains]

    @property
    def key(self) -> dict:
        """What a checkpoint's loader state must have been made with."""
        return {"filters": {d.name: d.filter for d in self.domains},
                "weights": {d.name: round(d.weight, 9) for d in self.domains}, "seed": self.seed}


def plan_mixture(ds: lance.LanceDataset, *, domains: str, weights: str, train: Predicate,
                 block_len: int, num_splits: int, steps: int, global_batch: int, seed: int,
                 max_repeats: float) -> Mixture:
    """The run's mixture on ``ds`` (one pinned version), ``train`` its training split:
    ``check_domains``, then each domain's blocks per epoch and the passes the run takes over
    each; a ``DomainError`` naming the flag and the fix otherwise. Torch-free, so
    ``pretrained_model`` runs it before it tags a version or launches the trainer."""
    predicates, shares, sizes = check_domains(ds, domains, train, block_len=block_len,
                                              num_splits=num_splits, weights=weights)
    out = [Domain(d.name, predicates[d.name].lance, train.and_(predicates[d.name]).lance,
                  shares[d.name], d.tokens, d.blocks) for d in sizes]
    sched = schedule([d.weight for d in out], seed)
    per_split = steps * global_batch // num_splits
    taken = draws(sched, num_splits, per_split, len(out))
    epochs, problems = {}, []
    for i, d in enumerate(out):
        need = int(taken[i].sum())
        epochs[d.name] = need / d.blocks_per_epoch if d.blocks_per_epoch else 0.0
        worst = (taken[i].max() / (d.blocks_per_epoch // num_splits) if d.blocks_per_epoch
                 else 0.0)
        if worst > max_repeats:
            problems.append(f"domain {d.name!r} at weight {d.weight:.3f} takes {need:,} blocks "
                            f"over {steps:,} steps of {global_batch} and packs into "
                            f"{d.blocks_per_epoch:,} per epoch: {worst:.2f} epochs")
    if problems:
        raise DomainError("--weights: " + "; ".join(problems) + f": more than --max-repeats "
                          f"{max_repeats:g}. "
                          "Lower its weight, raise --max-repeats, train fewer steps or add "
                          "documents")
    return Mixture(out, sched, seed, epochs)
