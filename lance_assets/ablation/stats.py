"""Is an arm's lead real? Paired seeds, the held-out error, and the smallest lead a plan can see.

Every arm of an ablation trains once per seed, and seed *s* gives every arm the same initial
weights; every run is evaluated on the same held-out documents. So "does arm A beat arm B" is
asked of the per-seed differences ``d_s = bpb_B(s) - bpb_A(s)``, not of two unpaired spreads:
what the two runs of a seed share (the initialisation, the held-out text) cancels out.

The lead is the mean of the ``d_s``; its standard error has two parts:

- **seeds**: ``sd(d_s) / sqrt(n)`` over the n seeds both arms finished (training noise: data
  order, the initialisation's luck);
- **held-out text**: the held-out set is one sample of the text the arms are judged on. The
  seed-averaged difference is taken per held-out document, and its standard error over documents
  (documents, not blocks: the blocks of one document are not independent samples) is added.

``se = sqrt(seeds² + held_out²)``, with Welch-Satterthwaite degrees of freedom (n - 1 for the
seed part, documents - 1 for the held-out part). **The rule.** A lead is *real* when its
two-sided 95 % confidence interval excludes zero: ``lead > t(0.975, df) x se``. With one seed
there is no seed part to estimate and no verdict.

**Power.** With n seeds the smallest lead detected with probability 0.8 under that rule is
``(t(0.975, df) + t(0.8, df)) x se(n)``, ``se(n)`` projected from the per-seed spread seen so
far (at least two seeds); from one seed only the held-out part is known, which bounds it from
below whatever the number of seeds.
"""

from __future__ import annotations

import json
import math
import statistics
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

LEVEL = 0.95  # two-sided confidence of "real"
POWER = 0.8  # the chance of calling a lead of the detectable size real


@dataclass(frozen=True)
class HeldOut:
    """One run's last validation pass per held-out document (the trainer's ``held_out.json``)."""

    doc_loss: np.ndarray  # summed nats per document
    doc_tokens: np.ndarray  # target tokens per document
    tokens_per_byte: float | None

    @property
    def scale(self) -> float:
        """nats/token -> bits/byte (nats/token when the table has no byte counts)."""
        return self.tokens_per_byte / math.log(2) if self.tokens_per_byte else 1.0

    @property
    def value(self) -> float:
        return float(self.doc_loss.sum() / self.doc_tokens.sum()) * self.scale

    @classmethod
    def load(cls, path: Path) -> HeldOut | None:
        """The run's held-out losses, None when the file is missing or not a held-out record
        (a run trained before the trainer wrote them)."""
        try:
            raw = json.loads(Path(path).read_text())
            loss = np.asarray(raw["doc_loss"], dtype=np.float64)
            tokens = np.asarray(raw["doc_tokens"], dtype=np.float64)
        except (OSError, ValueError, KeyError, TypeError):
            return None
        if loss.ndim != 1 or loss.shape != tokens.shape or not len(loss) or tokens.sum() <= 0:
            return None
        tpb = raw.get("tokens_per_byte")
        return cls(loss, tokens, float(tpb) if tpb else None)


def ratio_se(num: np.ndarray, den: np.ndarray) -> float | None:
    """Standard error of ``sum(num) / sum(den)`` over clusters (one per element): the ratio
    estimator's linearised variance. None with fewer than two clusters."""
    k = len(den)
    if k < 2 or den.sum() <= 0:
        return None
    ratio = num.sum() / den.sum()
    residual = num - ratio * den
    return float(math.sqrt(k / (k - 1) * float((residual ** 2).sum())) / den.sum())


def satterthwaite(parts: list[tuple[float, float]]) -> float:
    """Degrees of freedom of ``sqrt(sum of se²)`` from (se, df) parts (Welch-Satterthwaite)."""
    total = sum(se ** 2 for se, _ in parts)
    denom = sum(se ** 4 / df for se, df in parts if df > 0 and se > 0)
    if total == 0 or denom == 0:
        return math.inf
    return total ** 2 / denom


def t_quantile(q: float, df: float) -> float:
    from scipy import stats  # imported here: ~1 s that the Dagster definitions need not pay

    return float(stats.norm.ppf(q)) if math.isinf(df) else float(stats.t.ppf(q, df))


@dataclass
class Lead:
    """The paired lead of ``better`` over ``worse`` (positive: ``better`` has the lower metric)."""

    better: str
    worse: str
    seeds: list[int]
    diffs: list[float]  # per seed: worse - better
    lead: float
    seed_se: float | None  # sd(diffs) / sqrt(n); None with one seed
    held_out_se: float | None  # the seed-averaged per-document difference, over documents
    held_out_docs: int
    se: float | None
    df: float | None
    real: bool | None  # None: not decidable (one seed)

    def as_dict(self) -> dict:
        """JSON-ready (an infinite df, a held-out part with all the weight, as None)."""
        return {k: (None if isinstance(v, float) and not math.isfinite(v) else v)
                for k, v in {**vars(self), "ci95": self.half_width}.items()}

    @property
    def half_width(self) -> float | None:
        """Half the 95 % confidence interval of the lead."""
        if self.se is None or self.df is None:
            return None
        return t_quantile(0.5 + LEVEL / 2, self.df) * self.se

    def text(self, metric: str) -> str:
        if self.real is None:
            return (f"{self.better} leads {self.worse} by {self.lead:.4f} {metric} on "
                    f"{len(self.seeds)} seed: no verdict from one seed (give at least two)")
        ci = self.half_width
        return (f"{self.better} leads {self.worse} by {self.lead:.4f} ± {ci:.4f} {metric} (95 % "
                f"interval of the paired lead over {len(self.seeds)} seeds, se {self.se:.4f}): "
                + ("real (the interval excludes zero)" if self.real else
                   "not shown to be real (the interval includes zero: add seeds or tokens)"))


def paired_lead(better: str, better_runs: dict, worse: str, worse_runs: dict) -> Lead | None:
    """The lead of ``better`` over ``worse`` on the seeds both finished. ``*_runs`` map a seed to
    (metric value, ``HeldOut`` or None). None when the arms share no seed."""
    seeds = sorted(set(better_runs) & set(worse_runs))
    if not seeds:
        return None
    diffs = [worse_runs[s][0] - better_runs[s][0] for s in seeds]
    n = len(diffs)
    lead = statistics.fmean(diffs)
    seed_se = statistics.stdev(diffs) / math.sqrt(n) if n > 1 else None
    held_out_se, docs = held_out_difference_se([better_runs[s][1] for s in seeds],
                                               [worse_runs[s][1] for s in seeds])
    if seed_se is None:
        return Lead(better, worse, seeds, diffs, lead, None, held_out_se, docs, None, None, None)
    parts = [(seed_se, n - 1)] + ([(held_out_se, docs - 1)] if held_out_se is not None else [])
    se = math.sqrt(sum(p ** 2 for p, _ in parts))
    df = satterthwaite(parts)
    real = lead > t_quantile(0.5 + LEVEL / 2, df) * se if se > 0 else lead > 0
    return Lead(better, worse, seeds, diffs, lead, seed_se, held_out_se, docs, se, df, real)


def held_out_difference_se(better: list, worse: list) -> tuple[float | None, int]:
    """Standard error over held-out documents of the seed-averaged difference worse - better,
    and the number of documents; (None, 0) unless every run has the same documents."""
    runs = better + worse
    if not runs or any(r is None for r in runs):
        return None, 0
    tokens = runs[0].doc_tokens
    if any(r.doc_tokens.shape != tokens.shape or not np.array_equal(r.doc_tokens, tokens)
           for r in runs):
        return None, 0
    diff = (np.mean([r.doc_loss for r in worse], axis=0)
            - np.mean([r.doc_loss for r in better], axis=0))
    se = ratio_se(diff, tokens)
    return (se * runs[0].scale if se is not None else None), len(tokens)


def detectable_lead(lead: Lead, seeds: int) -> float | None:
    """The smallest lead that ``seeds`` seeds detect with probability ``POWER`` under the rule,
    projected from ``lead``'s per-seed spread and held-out error; from one seed, the bound the
    held-out error alone sets (no number of seeds gets below it). None when nothing is known."""
    from scipy import stats

    z = stats.norm.ppf(0.5 + LEVEL / 2) + stats.norm.ppf(POWER)
    if lead.seed_se is None:
        return float(z * lead.held_out_se) if lead.held_out_se is not None else None
    sd = lead.seed_se * math.sqrt(len(lead.seeds))
    parts = [(sd / math.sqrt(seeds), seeds - 1)]
    if lead.held_out_se is not None:
        parts.append((lead.held_out_se, lead.held_out_docs - 1))
    se = math.sqrt(sum(p ** 2 for p, _ in parts))
    if seeds < 2:
        return None
    df = satterthwaite(parts)
    return (t_quantile(0.5 + LEVEL / 2, df) + t_quantile(POWER, df)) * se


@dataclass
class Power:
    """What the seeds trained so far say about the whole plan."""

    seeds_done: int
    seeds_planned: int
    lead: Lead
    detectable: float | None  # with every planned seed
    wanted: float | None = None  # the lead the user asked to be able to detect
    notes: list[str] = field(default_factory=list)

    @property
    def can_detect_wanted(self) -> bool | None:
        if self.wanted is None or self.detectable is None:
            return None
        return self.detectable <= self.wanted

    def text(self, metric: str) -> str:
        pair = f"{self.lead.better} vs {self.lead.worse}"
        if self.detectable is None:
            return f"after {self.seeds_done} seed(s): {pair}: no error estimate yet"
        if self.lead.seed_se is None:
            head = (f"after 1 seed: {pair}: the held-out set alone hides leads below "
                    f"{self.detectable:.4f} {metric}, whatever the number of seeds")
        else:
            head = (f"after {self.seeds_done} seeds: {pair}: lead {self.lead.lead:.4f}; with "
                    f"{self.seeds_planned} seeds the smallest lead detectable (95 % level, "
                    f"power {POWER:.0%}) is {self.detectable:.4f} {metric}")
        if self.can_detect_wanted is False:
            head += (f". It cannot detect the lead asked about ({self.wanted:.4f}): raise "
                     "token_budget or add seeds")
        elif self.can_detect_wanted:
            head += f", within the lead asked about ({self.wanted:.4f})"
        return head
