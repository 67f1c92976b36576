"""Curation ablations: which rule set trains the better model?

The DCLM method on one table: every arm (a named rule set) trains a small proxy model on the
documents its rules keep, all arms on the same pinned table version, at the same token budget,
and every arm is evaluated on the same held-out documents, which no arm trains on.

- **One held-out split for every arm**: documents passing a neutral filter (``NOT is_dup`` by
  default) whose id falls in the ``eval_pct`` per cent chosen by a fixed hash of the id. The
  hash is arithmetic over ``id`` inside an ordinary predicate, so the same rows are chosen by
  Lance and DuckDB, on every run, whatever the arms' rules; the trainer gets it as
  ``--eval-filter`` and trains each arm on its rules AND NOT the held-out split.
- **Rule sets are user text**: each arm is checked rule by rule with the curation rules' own
  parser and Lance check (``corpus.rules``); a broken rule set is refused whole before anything
  trains, naming the arm, the rule and the fix.
- **Equal tokens, no silent repetition**: every arm trains the same number of steps of the same
  global batch; an arm whose kept documents hold fewer blocks than that is reported with the
  epochs it would need, and is trained only when the caller allows repeated data.
- **Paired seeds**: seed *s* gives every arm the same initial weights and every run is judged on
  the same held-out documents, so the best arm's (lowest mean held-out bits/byte) lead over
  another is the mean of the per-seed differences, with a standard error over seeds and held-out
  documents; it is *real* when its 95 % interval excludes zero (``ablation_stats`` states the
  rule and projects the smallest lead a number of seeds can detect).
"""

from __future__ import annotations

import json
import math
import re
import statistics
from collections.abc import Callable, Generator
from dataclasses import dataclass, field
from pathlib import Path

import lance

from lance_assets import paths
from lance_assets.ablation.stats import HeldOut, Lead, Power, detectable_lead, paired_lead
from lance_assets.curation.predicate import Predicate, PredicateError, safe_predicate
from lance_assets.curation.rules import (
    NAME_RE,
    RuleProblem,
    combined_predicate,
    lance_problem,
    rule_predicates,
)

HASH_MODULUS = 1_000_003  # a prime: (id % p) * m % p is a permutation of the residues
HASH_MULTIPLIER = 7_919  # products stay far below 2**63 for any id


class AblationError(ValueError):
    """An ablation that cannot run as configured; the message names the input and the fix."""


def id_hash_bucket_sql(buckets: int = 100) -> str:
    """A stable pseudo-random bucket in [0, buckets) of a document's id, as SQL arithmetic."""
    return f"(((id % {HASH_MODULUS}) * {HASH_MULTIPLIER}) % {HASH_MODULUS}) % {buckets}"


def id_hash_bucket(doc_id: int, buckets: int = 100) -> int:
    """``id_hash_bucket_sql`` in Python (for tests and reports)."""
    return ((doc_id % HASH_MODULUS) * HASH_MULTIPLIER) % HASH_MODULUS % buckets


def held_out_predicate(eval_filter: str, eval_pct: int, columns) -> Predicate:
    """The common evaluation split: ``eval_filter`` AND the id's hash bucket < ``eval_pct``."""
    if not isinstance(eval_pct, int) or isinstance(eval_pct, bool) or not 1 <= eval_pct <= 50:
        raise AblationError(f"eval_pct {eval_pct!r}: give a whole per cent of the documents "
                            "between 1 and 50 to hold out for evaluation")
    columns = list(columns)
    try:
        neutral = safe_predicate(eval_filter, columns)
    except PredicateError as e:
        raise AblationError(f"eval_filter: {e}") from None
    return neutral.and_(safe_predicate(f"{id_hash_bucket_sql()} < {eval_pct}", columns))


@dataclass
class ArmPlan:
    """What one arm keeps of the pinned version (the held-out split excluded)."""

    name: str
    rules: dict[str, str]
    filter: str  # the arm's rules combined, as Lance SQL ("" for an arm without rules)
    train_filter: str  # what the trainer reads: filter AND has tokens AND NOT held out
    docs: int
    tokens: int  # sum of n_tokens
    share: float  # of the tokens outside the held-out split
    blocks_per_epoch: int  # packed blocks the kept documents make, as the trainer counts them
    epochs_needed: float  # passes over the kept documents the token budget takes
    trained: bool
    note: str = ""


@dataclass
class AblationPlan:
    version: int
    held_out: str  # Lance SQL
    held_out_docs: int
    held_out_tokens: int
    pool_docs: int  # documents with tokens outside the held-out split
    pool_tokens: int
    steps: int
    budget_tokens: int  # target tokens every arm trains on: steps x global batch x seq_len
    allow_repeats: bool
    arms: list[ArmPlan] = field(default_factory=list)

    def arm(self, name: str) -> ArmPlan:
        return next(a for a in self.arms if a.name == name)


def _arm_problems(ds: lance.LanceDataset, arm: str, rules) -> tuple[Predicate | None, list[str]]:
    if not isinstance(arm, str) or not NAME_RE.match(arm):
        return None, [f"arm {arm!r}: an arm name must be an identifier (letters, digits, "
                      "underscores, starting with a letter or underscore)"]
    if not isinstance(rules, dict):
        return None, [f"arm {arm!r}: give its rules as a mapping of rule name to SQL predicate "
                      "(an empty mapping keeps every document)"]
    if not rules:
        return None, []
    usable, problems = rule_predicates(ds, rules)
    if problems:
        return None, [f"arm {arm!r}: {p}" for p in problems]
    combined = combined_predicate(usable)
    problem = lance_problem(ds, combined)
    if problem:
        return None, [f"arm {arm!r}: {RuleProblem('(all rules together)', combined.source, problem)}"]
    return combined, []


def checked_rule_sets(ds: lance.LanceDataset, rule_sets) -> dict[str, Predicate | None]:
    """Each arm's combined predicate (None: no rules, every document), checked with the curation
    rules' parser and Lance; an ``AblationError`` naming every broken arm and rule otherwise."""
    if not isinstance(rule_sets, dict) or not rule_sets:
        raise AblationError("rule_sets: give at least one arm, as {arm name: {rule name: SQL "
                            "predicate}} (an arm with {} keeps every document)")
    checked, problems = {}, []
    for arm, rules in rule_sets.items():
        predicate, found = _arm_problems(ds, arm, rules)
        problems += found
        checked[arm] = predicate
    if problems:
        raise AblationError(f"{len(problems)} problem(s) in the ablation's rule sets on {ds.uri}:\n"
                            + "\n".join(f"  - {p}" for p in problems)
                            + "\nFix them in curation_ablation's config (rule_sets: {arm: {rule: "
                            "predicate}}) and materialize it again.")
    return checked


def _docs_and_tokens(ds: lance.LanceDataset, predicate: Predicate) -> tuple[int, int]:
    docs = tokens = 0
    for batch in ds.to_batches(columns=["n_tokens"], filter=predicate.lance):
        col = batch.column(0).to_numpy(zero_copy_only=False)
        docs += len(col)
        tokens += int(col.sum())
    return docs, tokens


def plan_ablation(ds: lance.LanceDataset, rule_sets: dict[str, dict[str, str]], *,
                  token_budget: int, seq_len: int, global_batch: int, num_splits: int,
                  eval_filter: str = "NOT is_dup", eval_pct: int = 10,
                  allow_repeats: bool = False) -> AblationPlan:
    """Every arm's kept documents and tokens on ``ds`` (one pinned version), the held-out split,
    and the steps that train ``token_budget`` target tokens per arm."""
    if "n_tokens" not in ds.schema.names:
        raise AblationError(f"{ds.uri} has no n_tokens column; materialize `token_ids` first")
    if token_budget < 1:
        raise AblationError(f"token_budget {token_budget}: give the tokens each arm trains on (>= 1)")
    columns = ds.schema.names
    checked = checked_rule_sets(ds, rule_sets)
    held = held_out_predicate(eval_filter, eval_pct, columns)
    has_tokens = safe_predicate("n_tokens > 0", columns)
    pool = has_tokens.and_(held.negated())
    held_docs, held_tokens = _docs_and_tokens(ds, has_tokens.and_(held))
    if held_docs == 0:
        raise AblationError(f"eval_filter {eval_filter!r} with eval_pct {eval_pct} holds out no "
                            "tokenized document; loosen eval_filter or raise eval_pct")
    pool_docs, pool_tokens = _docs_and_tokens(ds, pool)
    block_len = seq_len + 1
    steps = max(1, math.ceil(token_budget / (global_batch * seq_len)))
    needed_blocks = steps * global_batch
    plan = AblationPlan(version=ds.version, held_out=held.lance, held_out_docs=held_docs,
                        held_out_tokens=held_tokens, pool_docs=pool_docs, pool_tokens=pool_tokens,
                        steps=steps, budget_tokens=steps * global_batch * seq_len,
                        allow_repeats=allow_repeats)
    for arm, predicate in checked.items():
        train = pool if predicate is None else predicate.and_(pool)
        docs, tokens = _docs_and_tokens(ds, train)
        blocks = (tokens + docs) // block_len  # one EOS per document, as the trainer packs
        blocks -= blocks % num_splits
        epochs = needed_blocks / blocks if blocks else math.inf
        note, trained = "", True
        if blocks == 0:
            trained, note = False, (f"keeps fewer than {num_splits} blocks of {block_len} tokens: "
                                    "nothing to train on")
        elif epochs > 1:
            trained = allow_repeats
            note = (f"keeps {blocks * seq_len:,} trainable tokens for a budget of "
                    f"{plan.budget_tokens:,}: needs {epochs:.2f} epochs; "
                    + ("trained with repeated data (allow_repeats)" if allow_repeats else
                       "not trained (set allow_repeats to train it on repeated data, or lower "
                       "token_budget)"))
        plan.arms.append(ArmPlan(
            name=arm, rules=dict(rule_sets[arm]), filter=predicate.lance if predicate else "",
            train_filter=train.lance, docs=docs, tokens=tokens,
            share=tokens / pool_tokens if pool_tokens else 0.0, blocks_per_epoch=blocks,
            epochs_needed=epochs, trained=trained, note=note))
    return plan


def check_trainable(plan: AblationPlan) -> None:
    """Refuse, before anything is tagged or written, a plan with an arm whose rules keep nothing
    to train on, or with no arm that can train: an ``AblationError`` naming each such arm with
    its rows and tokens."""
    def said(a: ArmPlan) -> str:
        return (f"arm {a.name!r} (rules {a.rules or '{}'}) keeps {a.docs:,} rows / {a.tokens:,} "
                f"tokens outside the held-out split at version {plan.version}; {a.note}")

    empty = [a for a in plan.arms if a.blocks_per_epoch == 0]
    if empty:
        raise AblationError("rule_sets: " + "; ".join(map(said, empty)) + ". Loosen its rules "
                            "or drop the arm, and materialize curation_ablation again")
    if not any(a.trained for a in plan.arms):
        raise AblationError("no arm can train on the budget: " + "; ".join(map(said, plan.arms))
                            + ". Lower token_budget or set allow_repeats")


# ---- results


def finished_summary(out: Path, steps: int) -> dict | None:
    """The run's summary when it trained all ``steps`` (not interrupted), else None: a run
    with a summary short of its steps, or none at all, is resumed, never counted."""
    path = out / "summary.json"
    if not path.is_file():
        return None
    summary = json.loads(path.read_text())
    if summary.get("interrupted") or int(summary.get("step", 0)) < steps:
        return None
    return summary


def val_curve(out: Path) -> list[tuple[int, float]]:
    """(step, held-out bits/byte, else loss) of every validation pass, once per step."""
    path = out / "metrics.jsonl"
    if not path.is_file():
        return []
    by_step = {}
    for line in path.read_text().splitlines():
        if not line.strip():
            continue
        row = json.loads(line)
        if "val_loss" in row:
            value = row.get("val_bpb")
            by_step[int(row["step"])] = float(value if value is not None else row["val_loss"])
    return sorted(by_step.items())


@dataclass
class ArmResult:
    name: str
    plan: ArmPlan
    summaries: dict[int, dict] = field(default_factory=dict)  # seed -> trainer summary
    held_out: dict[int, HeldOut | None] = field(default_factory=dict)  # seed -> per document

    def add(self, seed: int, summary: dict, run_dir: Path) -> None:
        """A finished run: its summary and its per-document held-out losses."""
        self.summaries[seed] = summary
        self.held_out[seed] = HeldOut.load(run_dir / paths.HELD_OUT_FILE)

    def values(self, key: str) -> list[float]:
        return [float(s[key]) for s in self.summaries.values() if s.get(key) is not None]

    @property
    def metric(self) -> str:
        """val_bpb when every seed reported it (tokenizer-independent), else val_loss."""
        bpb = self.values("val_bpb")
        return "val_bpb" if bpb and len(bpb) == len(self.summaries) else "val_loss"

    def runs(self) -> dict[int, tuple[float, HeldOut | None]]:
        """seed -> (held-out metric, per-document losses): the metric from the per-document
        losses when the run wrote them (unrounded), else from its summary."""
        out = {}
        for seed, summary in self.summaries.items():
            held = self.held_out.get(seed)
            if held is not None and (held.tokens_per_byte is not None) == (self.metric == "val_bpb"):
                out[seed] = (held.value, held)
            elif summary.get(self.metric) is not None:
                out[seed] = (float(summary[self.metric]), None)
        return out

    def mean_sd(self, key: str | None = None) -> tuple[float | None, float | None]:
        values = ([v for v, _ in self.runs().values()] if key is None else self.values(key))
        if not values:
            return None, None
        return statistics.fmean(values), statistics.stdev(values) if len(values) > 1 else None

    def held_out_se(self) -> float | None:
        """The held-out error of one run's metric (its standard error over held-out documents),
        mean over seeds."""
        values = self.values(f"{self.metric}_se")
        return statistics.fmean(values) if values else None


@dataclass
class Verdict:
    best: str | None
    runner_up: str | None
    lead: Lead | None  # the best arm's paired lead over the runner-up
    leads: dict[str, Lead]  # the best arm's paired lead over every other trained arm
    real: bool | None  # None: not decidable (fewer than two arms or two seeds)
    metric: str
    text: str


def verdict(results: list[ArmResult]) -> Verdict:
    """The arm with the lowest mean held-out metric, and whether its paired lead over the
    runner-up is real (``ablation_stats``: its 95 % interval, over seeds and held-out documents,
    excludes zero)."""
    scored = sorted(((r.mean_sd()[0], r) for r in results if r.runs()), key=lambda x: x[0])
    if not scored:
        return Verdict(None, None, None, {}, None, "val_bpb", "no arm was trained")
    best_mean, best = scored[0]
    metric = best.metric
    if len(scored) == 1:
        return Verdict(best.name, None, None, {}, None, metric,
                       f"{best.name} (the only arm trained: nothing to compare with)")
    leads = {}
    for _, other in scored[1:]:
        lead = paired_lead(best.name, best.runs(), other.name, other.runs())
        if lead is not None:
            leads[other.name] = lead
    second_mean, second = scored[1]
    lead = leads.get(second.name)
    if lead is None:
        return Verdict(best.name, second.name, None, leads, None, metric,
                       f"{best.name}: {metric} {best_mean:.4f} vs {second_mean:.4f} for "
                       f"{second.name}; they share no seed, so there is no paired verdict")
    return Verdict(best.name, second.name, lead, leads, lead.real, metric,
                   f"{best.name} is best ({metric} {best_mean:.4f} vs {second_mean:.4f}); "
                   + lead.text(metric))


def power(results: list[ArmResult], seeds_planned: int, wanted: float | None = None) -> Power | None:
    """What the runs so far say about the plan: the smallest lead ``seeds_planned`` seeds can
    detect between the current best arm and the runner-up (``ablation_stats.detectable_lead``)."""
    v = verdict(results)
    if v.lead is None:
        return None
    done = len(v.lead.seeds)
    return Power(done, seeds_planned, v.lead, detectable_lead(v.lead, seeds_planned), wanted)


def summary_rows(results: list[ArmResult], v: Verdict | None = None) -> list[dict]:
    """One row per arm: kept documents and tokens, share, held-out metric mean ± sd over seeds
    (unpaired) and one run's held-out error, the best arm's paired lead over it, tokens/s."""
    v = v or verdict(results)

    def r4(x):
        return round(x, 4) if x is not None and math.isfinite(x) else None

    rows = []
    for r in results:
        mean, sd = r.mean_sd()
        rate = r.values("tokens_per_s")
        lead = v.leads.get(r.name)
        rows.append({
            "arm": r.name, "docs_kept": r.plan.docs, "tokens_kept": r.plan.tokens,
            "share": round(r.plan.share, 4), "epochs_needed": round(r.plan.epochs_needed, 3)
            if math.isfinite(r.plan.epochs_needed) else None,
            "seeds": len(r.summaries), "metric": r.metric if r.summaries else "",
            "val_mean": r4(mean), "val_sd": r4(sd), "val_se": r4(r.held_out_se()),
            "best_leads_by": r4(lead.lead) if lead else None,
            "lead_se": r4(lead.se) if lead else None,
            "lead_ci95": r4(lead.half_width) if lead else None,
            "lead_real": lead.real if lead else None,
            "tokens_per_s": round(statistics.fmean(rate), 1) if rate else None,
            "note": r.plan.note,
        })
    return rows


@dataclass
class Outcome:
    """What ``run_arms`` trained, reused and concluded."""

    results: list[ArmResult]
    curves: dict[str, dict[int, list[tuple[int, float]]]]  # arm -> seed -> validation curve
    trained: int = 0
    reused: int = 0
    power: list[Power] = field(default_factory=list)  # after each round of seeds
    stopped_early: str = ""  # why the remaining seeds were not trained

    @property
    def verdict(self) -> Verdict:
        return verdict(self.results)


def run_arms(plan: AblationPlan, seeds: list[int], base: Path, folder: Callable[[ArmPlan], str],
             *, log: Callable[[str], None] = print,
             warn: Callable[[str], None] | None = None, wanted_lead: float | None = None,
             stop_when_underpowered: bool = False
             ) -> Generator[tuple[ArmPlan, int, Path], None, Outcome]:
    """Every trained arm once per seed, seed by seed (a round of seeds gives every arm the same
    seed before the next one starts, so the paired comparison and the power estimate grow
    together); runs found finished in ``base/<folder(arm)>/seed-<seed>`` are reused, others are
    yielded as ``(arm, seed, run_dir)``: the caller trains it (resuming an interrupted one)
    before it asks for the next. Returns the ``Outcome``.

    After each round the smallest lead the whole plan can detect is logged; when it exceeds
    ``wanted_lead`` the log says so before the rest of the budget is spent, and with
    ``stop_when_underpowered`` the remaining seeds are not trained."""
    warn = warn or log
    outcome = Outcome([ArmResult(a.name, a) for a in plan.arms], {})
    for arm in plan.arms:
        if not arm.trained:
            warn(f"arm {arm.name} not trained: {arm.note}")
    for i, seed in enumerate(seeds):
        for arm, result in zip(plan.arms, outcome.results):
            if not arm.trained:
                continue
            out = base / folder(arm) / f"seed-{seed}"
            summary = finished_summary(out, plan.steps)
            if summary is not None:
                outcome.reused += 1
                log(f"arm {arm.name} seed {seed}: finished earlier in {out}, reused")
            else:
                log(f"arm {arm.name} seed {seed}: training in {out}")
                yield arm, seed, out
                summary = finished_summary(out, plan.steps)
                if summary is None:
                    raise AblationError(f"arm {arm.name} seed {seed}: the trainer stopped before "
                                        f"step {plan.steps}; see {out}/metrics.jsonl")
                outcome.trained += 1
            result.add(seed, summary, out)
            outcome.curves.setdefault(arm.name, {})[seed] = val_curve(out)
        estimate = power(outcome.results, len(seeds), wanted_lead)
        if estimate is None:
            continue
        outcome.power.append(estimate)
        metric = outcome.verdict.metric
        (warn if estimate.can_detect_wanted is False else log)(estimate.text(metric))
        if stop_when_underpowered and estimate.can_detect_wanted is False and i + 1 < len(seeds):
            outcome.stopped_early = (f"stopped after {i + 1} of {len(seeds)} seeds: "
                                     + estimate.text(metric))
            warn(outcome.stopped_early)
            break
    return outcome


SAFE_NAME_RE = re.compile(r"[^A-Za-z0-9_.-]")


def arm_folder(arm: ArmPlan, key: str) -> str:
    """The arm's run folder name: its name and ``key``, the digest of what decides its result
    (its training filter, the held-out split, the trainer settings: ``runner.result_key``), so
    a changed arm trains anew and an unchanged one is found again."""
    return f"{SAFE_NAME_RE.sub('_', arm.name)}-{key}"
