"""``mixture_search``: in what proportions to mix the domains, and is the answer real?

RegMix's method on one tagged table version: a swarm of proxy models (``proxies`` per domain,
one seed) trains on Dirichlet-sampled weights, each the trainer's ``--domains``/``--weights``
with the same token budget and the same held-out split; a regression of the target's held-out
bits/byte on the weights (``ablation.regression``: its model, its leave-one-out error) picks the
predicted best mixture within each domain's tokens (``max_repeats``); then the chosen, the
natural (each domain's share of the stored tokens) and the uniform mixture train with paired
seeds, and the curation ablation's statistics (``ablation.stats``) say the chosen one's lead
over the natural one, the smallest lead this budget can detect, and whether the lead is real.

The target is a predicate choosing the held-out documents the mixture should be good at
(default: every document of the mixture), drawn by the ablation's id hash (``eval_pct``); no
run trains on them. Domains are the trainer's (``train.domains.check_domains``): parsed, never
pasted, every document the mixture is made of in exactly one, each holding enough to train on,
and the swarm drawable within their caps, or the search is refused before it tags or writes.

State is the run folders: a proxy or an arm whose ``summary.json`` says it trained every step
is reused, an interrupted one resumes from its checkpoint; the swarm's weights, the regression
and the chosen weights are recomputed from the pinned version and those files on every run, so
a search killed anywhere finishes on rerun. ``plan.json`` and ``results.json`` are reports.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import lance
import numpy as np

from lance_assets import paths, storage
from lance_assets.ablation import plan as ablation
from lance_assets.ablation import regression, runner
from lance_assets.ablation.settings import MixtureSettings
from lance_assets.ablation.stats import Lead, detectable_lead, paired_lead
from lance_assets.curation import rules
from lance_assets.progress import phase, progress
from lance_assets.storage import Location
from lance_assets.table import Table, snapshots
from lance_assets.table.predicate import PredicateError, safe_predicate
from lance_assets.train.domains import DomainError, check_domains
from lance_assets.train.spec import RunSpec

TAG_PREFIX = runner.ABLATION_TAG_PREFIX + "mixture-"  # forget and retention treat it as an ablation
OWNER = "mixture_search"
ARMS = ("chosen", "natural", "uniform")
BASE_FILTER = "n_tokens > 0"


@dataclass
class DomainPlan:
    name: str
    predicate: str  # as the trainer gets it (--domains)
    docs: int  # training documents (held-out split excluded)
    tokens: int
    blocks_per_epoch: int
    natural: float  # its share of the training tokens
    cap: float  # the largest weight its tokens allow under max_repeats


@dataclass
class SearchPlan:
    version: int
    filter: str  # Lance SQL: the documents the mixture is made of
    held_out: str  # Lance SQL: the target's held-out split
    held_out_docs: int
    held_out_tokens: int
    steps: int
    blocks_per_run: int  # steps x global batch
    budget_tokens: int
    domains: list[DomainPlan] = field(default_factory=list)

    @property
    def names(self) -> list[str]:
        return [d.name for d in self.domains]

    @property
    def spec(self) -> str:
        """--domains for the trainer."""
        return json.dumps({d.name: d.predicate for d in self.domains})

    def vector(self, attr: str) -> np.ndarray:
        return np.array([getattr(d, attr) for d in self.domains], dtype=np.float64)

    def epochs(self, weights: np.ndarray) -> float:
        """Passes over its most repeated domain a run with ``weights`` takes."""
        return max((w * self.blocks_per_run / d.blocks_per_epoch if d.blocks_per_epoch
                    else (math.inf if w > 0 else 0.0)) for w, d in zip(weights, self.domains))


def _sum_tokens(ds: lance.LanceDataset, where: str) -> tuple[int, int]:
    docs = tokens = 0
    for batch in ds.to_batches(columns=["n_tokens"], filter=where):
        col = batch.column(0).to_numpy(zero_copy_only=False)
        docs, tokens = docs + len(col), tokens + int(col.sum())
    return docs, tokens


def plan_search(ds: lance.LanceDataset, config: MixtureSettings, base_filter: str) -> SearchPlan:
    """The search on ``ds`` (one pinned version): the domains checked and covering every
    tokenized document of ``base_filter`` exactly once, the target's held-out split, each
    domain's tokens and natural share, and the largest weight each can take."""
    if "n_tokens" not in ds.schema.names:
        raise ablation.AblationError(f"{ds.uri} has no n_tokens column; materialize `token_ids` "
                                     "first")
    columns = ds.schema.names
    try:
        base = safe_predicate(base_filter, columns).and_(safe_predicate(BASE_FILTER, columns))
    except PredicateError as e:
        raise ablation.AblationError(f"filter: {e}. Fix mixture_search's config and materialize "
                                     "it again") from None
    held = ablation.held_out_predicate(config.target or base.source, config.eval_pct, columns)
    held = held.and_(base)
    held_docs, held_tokens = _sum_tokens(ds, held.lance)
    if held_docs == 0:
        raise ablation.AblationError(f"target {config.target or base.source!r} with eval_pct "
                                     f"{config.eval_pct} holds out no tokenized document; "
                                     "loosen target or raise eval_pct")
    pool = base.and_(held.negated())  # what every run trains on
    block_len, global_batch = config.seq_len + 1, config.batch_size * config.nproc_per_node
    try:
        spec = json.dumps(config.domains) if config.domains else config.domain_column
        if not spec:
            raise DomainError("domains: give them as {name: SQL predicate}, or a domain_column "
                              "whose values name them")
        # every domain trains in the swarm: each must hold documents outside the held-out split
        _, _, sizes = check_domains(ds, spec, pool, block_len=block_len,
                                    num_splits=runner.NUM_SPLITS, coverage_scope=base,
                                    flag="domains")
    except (DomainError, PredicateError) as e:
        raise ablation.AblationError(f"{e}. Fix mixture_search's config and materialize it "
                                     "again") from None
    steps = max(1, math.ceil(config.token_budget / (global_batch * config.seq_len)))
    per_split = steps * global_batch / runner.NUM_SPLITS
    plan = SearchPlan(ds.version, base.lance, held.lance, held_docs, held_tokens, steps,
                      steps * global_batch, steps * global_batch * config.seq_len)
    found = []
    for d in sizes:
        # the trainer refuses a split drawn past max_repeats epochs; the schedule keeps every
        # split within 2 blocks of its share
        cap = (config.max_repeats * d.blocks / runner.NUM_SPLITS - 2) / per_split
        found.append((d.name, d.predicate, d.docs, d.tokens, d.blocks, min(1.0, max(0.0, cap))))
    total = sum(f[3] for f in found)
    plan.domains = [DomainPlan(n, p, d, t, b, t / total if total else 0.0, c)
                    for n, p, d, t, b, c in found]
    if plan.vector("cap").sum() < 1:
        raise ablation.AblationError(
            f"the domains hold too few tokens for {plan.budget_tokens:,} tokens per run at "
            f"max_repeats {config.max_repeats:g} (largest shares: "
            + ", ".join(f"{d.name} {d.cap:.3f}" for d in plan.domains)
            + "); lower token_budget or raise max_repeats")
    return plan


def swarm_weights(plan: SearchPlan, config: MixtureSettings, n: int) -> np.ndarray:
    """The swarm's ``n`` Dirichlet-sampled weights within each domain's cap (seeded by the first
    seed); an ``AblationError`` naming the domains too small for the budget when they cannot be
    drawn (checked before anything is tagged)."""
    try:
        return regression.swarm(plan.vector("cap"), n, config.seeds[0])
    except ValueError:
        small = sorted(plan.domains, key=lambda d: d.cap)[:3]
        raise ablation.AblationError(
            "the swarm cannot draw mixtures that keep every domain within the share its tokens "
            f"allow for {plan.budget_tokens:,} tokens per run at max_repeats "
            f"{config.max_repeats:g}: "
            + "; ".join(f"domain {d.name!r} (predicate `{d.predicate}`) holds {d.docs:,} rows / "
                        f"{d.tokens:,} tokens at version {plan.version}, at most share "
                        f"{d.cap:.4f}" for d in small)
            + ". Widen or drop the small domains, lower token_budget or raise max_repeats") from None


def weights_json(names: list[str], weights: np.ndarray) -> str:
    return json.dumps({n: round(float(w), 6) for n, w in zip(names, weights)})


def rounded(weights: np.ndarray, caps: np.ndarray) -> np.ndarray:
    """``weights`` to 4 decimals, summing to 1, no domain above its cap."""
    w = np.minimum(np.round(np.asarray(weights, dtype=np.float64), 4), caps)
    rest = 1.0 - w.sum()
    w[int(np.argmax(caps - w)) if rest > 0 else int(np.argmax(w))] += rest
    return np.round(w, 6)


def make_run(table: Table, config: MixtureSettings, plan: SearchPlan, weights: np.ndarray,
             seed: int, out: Location, snapshot: tuple[str, int] | None) -> RunSpec:
    """One run of the search (a proxy or a verified mixture), as ``curation_ablation`` runs
    them: the mixture as --domains/--weights, the target's held-out split as --eval-filter."""
    arm = ablation.ArmPlan("mixture", {}, plan.filter, plan.filter, 0, 0, 1.0, 0, 0.0, True)
    return runner.run_spec(table, config, plan, arm, seed, out, snapshot, domains=plan.spec,
                           weights=weights_json(plan.names, weights),
                           max_repeats=config.max_repeats)


@dataclass
class Member:
    """One proxy of the swarm."""

    name: str
    weights: np.ndarray
    out: Path
    measured: float | None = None
    predicted: float | None = None  # leave-one-out


@dataclass
class SearchReport:
    name: str
    tag: str
    version: int
    plan: SearchPlan
    base: Path
    members: list[Member]
    fit: regression.Fit
    chosen: np.ndarray
    predicted: float
    arms: dict[str, np.ndarray]  # chosen, natural, uniform weights
    outcome: ablation.Outcome
    leads: dict[str, Lead]  # chosen's paired lead over natural and over uniform
    detectable: float | None
    trained: int
    reused: int
    filter_given: str = ""  # the config's filter ('' : the curation rules in force)
    duration_s: float = 0.0

    def arm_bpb(self) -> dict[str, tuple[float | None, float | None]]:
        return {r.name: r.mean_sd() for r in self.outcome.results}

    @property
    def lead_is_real(self) -> bool | None:
        lead = self.leads.get("natural")
        return lead.real if lead is not None else None

    def pretrained_model_config(self) -> dict:
        """The one line of run config that trains ``pretrained_model`` on the chosen weights."""
        config = {"domains": self.plan.spec, "weights": weights_json(self.plan.names, self.chosen)}
        if self.filter_given:
            config["filter"] = self.filter_given
        return {"ops": {"pretrained_model": {"config": config}}}

    def plot(self) -> bytes:
        """A PNG: each proxy's measured held-out bits/byte against the regression's prediction
        without it (and the verified mixtures' against the prediction), and the weights of the
        chosen, natural and uniform mixtures."""
        import matplotlib

        matplotlib.use("Agg")
        import io

        import matplotlib.pyplot as plt

        fig, (left, right) = plt.subplots(1, 2, figsize=(10, 3.8), dpi=100)
        measured = [m.measured for m in self.members]
        left.scatter([m.predicted for m in self.members], measured, s=18, color="C0",
                     label="proxy (leave-one-out)")
        for i, (arm, weights) in enumerate(self.arms.items()):
            mean, _ = self.arm_bpb().get(arm, (None, None))
            if mean is not None:
                left.scatter([float(self.fit.predict(weights)[0])], [mean], marker="*", s=120,
                             color=f"C{i + 1}", label=f"{arm} (mean of seeds)")
        lo = min(measured + [float(m.predicted) for m in self.members])
        hi = max(measured + [float(m.predicted) for m in self.members])
        left.plot([lo, hi], [lo, hi], "k--", linewidth=0.8)
        left.set_xlabel("predicted held-out bits/byte")
        left.set_ylabel("measured held-out bits/byte")
        left.legend(fontsize=7)
        left.grid(alpha=0.3)
        x = np.arange(len(self.plan.names))
        for i, (arm, weights) in enumerate(self.arms.items()):
            right.bar(x + (i - 1) * 0.27, weights, width=0.27, color=f"C{i + 1}", label=arm)
        right.set_xticks(x, self.plan.names)
        right.set_ylabel("share of training tokens")
        right.legend(fontsize=7)
        right.grid(alpha=0.3, axis="y")
        buf = io.BytesIO()
        fig.tight_layout()
        fig.savefig(buf, format="png")
        plt.close(fig)
        return buf.getvalue()

    def results_json(self) -> dict:
        def lead(x: Lead | None) -> dict | None:
            return x.as_dict() if x is not None else None

        return {
            "tag": self.tag, "version": self.version, "model": regression.MODEL,
            "weights": dict(zip(self.plan.names, self.chosen.tolist())),
            "predicted_bpb": self.predicted, "loo_rmse": self.fit.loo_rmse,
            "loo_r2": self.fit.loo_r2, "ridge_alpha": self.fit.alpha,
            "arms": {k: dict(zip(self.plan.names, v.tolist())) for k, v in self.arms.items()},
            "arm_bpb": {k: {"mean": m, "sd": s} for k, (m, s) in self.arm_bpb().items()},
            "lead_over_natural": lead(self.leads.get("natural")),
            "lead_over_uniform": lead(self.leads.get("uniform")),
            "smallest_detectable_lead": self.detectable, "lead_is_real": self.lead_is_real,
            "pretrained_model_config": self.pretrained_model_config(),
            "swarm": [{"proxy": m.name, "weights": dict(zip(self.plan.names, m.weights.tolist())),
                       "measured_bpb": m.measured, "loo_predicted_bpb": m.predicted}
                      for m in self.members],
        }


def _arm(name: str, plan: SearchPlan, weights: np.ndarray) -> ablation.ArmPlan:
    epochs = plan.epochs(weights)
    feasible = bool((weights <= plan.vector("cap") + 1e-9).all())
    note = "" if feasible else ("a share above what a domain's tokens allow under max_repeats: "
                                "not trained")
    return ablation.ArmPlan(name, {}, plan.filter, plan.filter, sum(d.docs for d in plan.domains),
                            sum(d.tokens for d in plan.domains), 1.0,
                            sum(d.blocks_per_epoch for d in plan.domains), epochs, feasible, note)


def mixture_filter(ds: lance.LanceDataset, config: MixtureSettings) -> str:
    """The documents the mixture is made of: ``config.filter``, else the curation rules in
    force on ``ds`` (what ``pretrained_model`` trains on)."""
    if config.filter:
        return config.filter
    try:
        return rules.validate(ds, rules.curation_in_force(ds).rules)
    except rules.RuleError as e:
        raise ablation.AblationError(f"{e}\nOr give mixture_search a filter") from None


class Search:
    """The search ``config`` describes on ``table``: planned, its swarm drawn and its version
    tagged when made (an ``AblationError`` before anything is tagged when it cannot run).
    ``runs`` yields the runs still to train; ``report`` is set once they are exhausted."""

    def __init__(self, table: Table, config: MixtureSettings, *,
                 log: Callable[[str], None] = print, warn: Callable[[str], None] | None = None):
        self.start = time.perf_counter()
        self.table, self.config, self.log, self.warn = table, config, log, warn or log
        self.name = name = config.name or runner.unnamed(table)
        self.tag = tag = TAG_PREFIX + name
        self.version = version = table.choose(tag, or_newest=True).version
        branch = table.snapshots.branch_of(tag, version)  # a copy forget redacted: by its tag
        ds = table.open(tag if branch else version)
        with phase(f"mixture {name}: planning (domains, tokens, held-out split)", log,
                   announce=False):
            self.plan = plan = plan_search(ds, config, mixture_filter(ds, config))
        n = config.proxies * len(plan.domains)
        if n < 3:
            raise ablation.AblationError(f"proxies {config.proxies} x {len(plan.domains)} "
                                         f"domains = {n} proxies: the regression needs at least "
                                         "3; raise proxies")
        self.drawn = swarm_weights(plan, config, n)
        table.snapshots.hold(tag, version, owner=OWNER, kind=snapshots.ABLATION,
                             named=bool(config.name), branch=branch)
        self.base = base = paths.ablation_dir(table.root, "mixture-" + name)
        log(f"mixture {name}: table version {version} (tag {tag}), {len(plan.domains)} domains ("
            + ", ".join(f"{d.name}: {d.tokens:,} tokens, natural {d.natural:.3f}, at most "
                        f"{d.cap:.3f}" for d in plan.domains)
            + f"); {n} proxies, then 3 mixtures x {len(config.seeds)} seeds, {plan.steps} steps "
            f"({plan.budget_tokens:,} tokens) per run; held out: {plan.held_out_docs:,} "
            "documents")
        storage.write_atomic(base / "plan.json", json.dumps(
            {"tag": tag, **{k: v for k, v in vars(plan).items() if k != "domains"},
             "domains": [vars(d) for d in plan.domains]}, indent=2, default=str).encode())
        self.report: SearchReport | None = None

    def spec(self, weights: np.ndarray, seed: int, out: Path) -> RunSpec:
        return make_run(self.table, self.config, self.plan, weights, seed, out,
                        (self.tag, self.version))

    def folder(self, prefix: str, weights: np.ndarray) -> str:
        return f"{prefix}-{runner.result_key(self.spec(weights, 0, Path('x')), self.plan)}"

    def runs(self, together: bool = False) -> Iterator[list[RunSpec]]:
        """The runs still to train: one at a time, or with ``together`` (Ray tasks) the
        swarm's and then the verification's all at once. Launch each list before asking for
        the next. Then ``report``."""
        config, plan, name, log, base = self.config, self.plan, self.name, self.log, self.base
        n, caps = len(self.drawn), plan.vector("cap")
        # ---- the swarm: one seed, Dirichlet weights within the caps
        seed = config.seeds[0]
        members = [Member(f"proxy-{i:02d}", w, base / "swarm" / self.folder(f"proxy-{i:02d}", w))
                   for i, w in enumerate(self.drawn)]
        trained = reused = 0
        with self.table.snapshots.using(self.tag):
            todo = [m for m in members if ablation.finished_summary(m.out, plan.steps) is None]
            reused += len(members) - len(todo)
            if together and todo:
                yield [self.spec(m.weights, seed, m.out) for m in todo]
            with progress(total=n, desc=f"mixture {name}: swarm", unit="run", log=log) as bar:
                for m in members:
                    if m in todo and not together:
                        log(f"proxy {m.name} ({weights_json(plan.names, m.weights)}): training "
                            f"in {m.out}")
                        yield [self.spec(m.weights, seed, m.out)]
                    summary = ablation.finished_summary(m.out, plan.steps)
                    if summary is None:
                        raise ablation.AblationError(
                            f"proxy {m.name}: the trainer stopped before step {plan.steps}; see "
                            f"{m.out}/metrics.jsonl")
                    result = ablation.ArmResult(m.name, _arm(m.name, plan, m.weights))
                    result.add(seed, summary, m.out)
                    m.measured = result.runs()[seed][0]
                    trained += m in todo
                    bar.update(1)
            # ---- the regression and its optimum within the caps
            fit = regression.fit(np.array([m.weights for m in members]),
                                 np.array([m.measured for m in members]))
            for m, p in zip(members, fit.loo_pred):
                m.predicted = float(p)
            chosen, _ = regression.best_mixture(fit, caps, seed)
            chosen = rounded(chosen, caps)
            predicted = float(fit.predict(chosen)[0])
            log(f"mixture {name}: regression ({regression.MODEL}): leave-one-out error "
                f"{fit.loo_rmse:.4f} bits/byte"
                + (f", R² {fit.loo_r2:.3f}" if fit.loo_r2 is not None else "")
                + f"; chosen {weights_json(plan.names, chosen)}, predicted {predicted:.4f}")
            # ---- verification: chosen, natural, uniform with paired seeds
            arms = {"chosen": chosen,
                    "natural": rounded(plan.vector("natural"), np.ones(len(caps))),
                    "uniform": np.full(len(caps), 1.0 / len(caps))}
            verify = ablation.AblationPlan(plan.version, plan.held_out, plan.held_out_docs,
                                           plan.held_out_tokens,
                                           sum(d.docs for d in plan.domains),
                                           sum(d.tokens for d in plan.domains), plan.steps,
                                           plan.budget_tokens, True,
                                           [_arm(a, plan, w) for a, w in arms.items()])
            arm_folder = {a: self.folder(a, w) for a, w in arms.items()}
            verify_dir = base / "verify"
            if together:
                specs = [self.spec(arms[a.name], s, verify_dir / arm_folder[a.name] / f"seed-{s}")
                         for s in config.seeds for a in verify.arms if a.trained
                         and ablation.finished_summary(verify_dir / arm_folder[a.name]
                                                       / f"seed-{s}", plan.steps) is None]
                if specs:
                    yield specs
            outcome = yield from runner.specs_of(
                ablation.run_arms(verify, config.seeds, verify_dir, lambda a: arm_folder[a.name],
                                  log=log, warn=self.warn),
                lambda a, s, out: [self.spec(arms[a.name], s, out)])
        by_name = {r.name: r for r in outcome.results}
        leads = {}
        for other in ("natural", "uniform"):
            if by_name[other].runs() and by_name["chosen"].runs():
                lead = paired_lead("chosen", by_name["chosen"].runs(), other,
                                   by_name[other].runs())
                if lead is not None:
                    leads[other] = lead
        natural = leads.get("natural")
        detectable = detectable_lead(natural, len(config.seeds)) if natural is not None else None
        report = SearchReport(name, self.tag, self.version, plan, base, members, fit, chosen,
                              predicted, arms, outcome, leads,
                              round(detectable, 4) if detectable else None,
                              trained + outcome.trained, reused + outcome.reused, config.filter)
        if natural is not None:
            log(f"mixture {name}: " + natural.text("val_bpb"))
        storage.write_atomic(base / "results.json",
                             json.dumps(report.results_json(), indent=2).encode())
        report.duration_s = round(time.perf_counter() - self.start, 2)
        self.report = report
