"""From a swarm of proxies to a mixture: a regression of held-out loss on the weights, its
leave-one-out error, and the predicted best mixture within each domain's tokens.

**The model.** A ridge regression of the target's held-out bits/byte on each domain's weight
``w`` and its logarithm ``log(w + 0.01)``: ``bpb ~ b0 + sum_d (a_d w_d + c_d log(w_d + 0.01))``.
A proxy's loss on a domain falls roughly as a power of the tokens it saw of that domain and of
related ones, so a log term per weight carries the diminishing return of adding more of a
domain (Data Mixing Laws and RegMix both find the loss smooth and monotone in each weight), and
the linear term lets a domain that hurts (junk) pull the loss up in proportion to its share.
RegMix fits LightGBM on 512 proxies; with a swarm of ~15 a tree ensemble would memorise it, so
the model has 2 x domains + 1 coefficients, shrunk by a ridge penalty chosen by leave-one-out
error (exact for a linear smoother: ``e_i / (1 - H_ii)``).

**Its fit.** The leave-one-out predictions are the held-out check: each proxy predicted by the
model fitted without it. Their root mean square error is the regression's held-out error, and
``loo_r2`` compares it with predicting every proxy by the mean of the others (0: the weights
explain nothing the swarm could check; 1: every proxy predicted exactly). The proxies share a
seed, so their data-order luck is smooth in the weights too: a good fit is not a real lead.

**The optimum.** Candidate mixtures (Dirichlet samples, flat and sparse, and every corner and
edge midpoint) that give no domain more than its cap (the share its tokens allow under
``max_repeats``) are scored by the model; the chosen weights are the mean of the best
``TOP`` (RegMix averages its top 100: one sample's luck matters less), which still respects
every cap since the caps are a convex set.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import numpy as np

EPS = 0.01
ALPHAS = (1e-4, 1e-3, 1e-2, 1e-1, 1.0, 10.0)
CANDIDATES = 20_000
TOP = 32
MODEL = ("ridge on w and log(w + 0.01) per domain (2 x domains + 1 coefficients), penalty by "
         "leave-one-out error")


def features(weights: np.ndarray) -> np.ndarray:
    w = np.atleast_2d(np.asarray(weights, dtype=np.float64))
    return np.hstack([w, np.log(w + EPS)])


@dataclass
class Fit:
    """The fitted regression and its leave-one-out check."""

    mean: np.ndarray  # feature means (centring)
    scale: np.ndarray  # feature scales
    coef: np.ndarray  # on the standardised features
    intercept: float
    alpha: float
    loo_pred: np.ndarray  # each swarm member predicted without it
    loo_rmse: float
    loo_r2: float | None  # 1 - SSE(loo) / SSE(mean of the others); None with < 3 members

    def predict(self, weights: np.ndarray) -> np.ndarray:
        x = (features(weights) - self.mean) / self.scale
        return x @ self.coef + self.intercept


def _ridge(x: np.ndarray, y: np.ndarray, alpha: float) -> tuple[np.ndarray, float, np.ndarray]:
    """Coefficients, intercept and hat-matrix diagonal of a ridge on centred ``x`` (intercept not
    penalised)."""
    xm, ym = x.mean(axis=0), y.mean()
    xc = x - xm
    gram = xc.T @ xc + alpha * np.eye(x.shape[1])
    coef = np.linalg.solve(gram, xc.T @ (y - ym))
    hat = np.einsum("ij,jk,ik->i", xc, np.linalg.inv(gram), xc) + 1.0 / len(y)
    return coef, float(ym - xm @ coef), hat


def fit(weights: np.ndarray, losses: np.ndarray) -> Fit:
    """The regression of ``losses`` on ``weights`` (one row per swarm member), its penalty the
    one with the smallest leave-one-out error."""
    w = np.asarray(weights, dtype=np.float64)
    y = np.asarray(losses, dtype=np.float64)
    if len(y) < 3:
        raise ValueError(f"a regression needs at least 3 swarm members, got {len(y)}")
    raw = features(w)
    mean, scale = raw.mean(axis=0), raw.std(axis=0)
    scale[scale == 0] = 1.0
    x = (raw - mean) / scale
    best = None
    for alpha in ALPHAS:
        coef, intercept, hat = _ridge(x, y, alpha)
        resid = y - (x @ coef + intercept)
        loo = y - resid / np.clip(1.0 - hat, 1e-9, None)
        err = float(np.mean((loo - y) ** 2))
        if best is None or err < best[0]:
            best = (err, alpha, coef, intercept, loo)
    err, alpha, coef, intercept, loo = best
    others = (y.sum() - y) / (len(y) - 1)  # each member predicted by the mean of the others
    base = float(np.sum((others - y) ** 2))
    r2 = 1.0 - float(np.sum((loo - y) ** 2)) / base if base > 0 else None
    return Fit(mean, scale, coef, intercept, alpha, loo, float(np.sqrt(err)), r2)


def candidates(caps: np.ndarray, seed: int, n: int = CANDIDATES) -> np.ndarray:
    """Mixtures within ``caps`` (each domain's largest share): Dirichlet samples (flat and
    sparse), the corners and the edge midpoints, those that respect every cap."""
    d = len(caps)
    rng = np.random.default_rng(seed)
    parts = [rng.dirichlet(np.ones(d), n // 2), rng.dirichlet(np.full(d, 0.2), n // 2),
             np.eye(d)]
    parts += [np.array([(np.eye(d)[i] + np.eye(d)[j]) / 2
                        for i, j in itertools.combinations(range(d), 2)])] if d > 1 else []
    w = np.vstack(parts)
    return w[(w <= caps + 1e-12).all(axis=1)]


def best_mixture(model: Fit, caps: np.ndarray, seed: int, top: int = TOP) -> tuple[np.ndarray, float]:
    """The predicted best weights within ``caps`` (the mean of the ``top`` best candidates) and
    the model's prediction for them."""
    caps = np.asarray(caps, dtype=np.float64)
    pool = candidates(caps, seed)
    if not len(pool):
        raise ValueError(f"no mixture within the caps {caps.round(4).tolist()}: the domains hold "
                         "too few tokens for this budget (raise max_repeats or lower "
                         "token_budget)")
    scores = model.predict(pool)
    chosen = pool[np.argsort(scores, kind="stable")[:top]].mean(axis=0)
    chosen = np.minimum(chosen, caps)
    chosen /= chosen.sum()
    return chosen, float(model.predict(chosen)[0])


def swarm(caps: np.ndarray, n: int, seed: int, tries: int = 10_000) -> np.ndarray:
    """``n`` proxy mixtures within ``caps``: Dirichlet samples, flat (concentration 1) and sparse
    (0.3) in turn, each redrawn until it respects every cap (RegMix samples its swarm from
    Dirichlet distributions of several concentrations)."""
    caps = np.asarray(caps, dtype=np.float64)
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        concentration = 1.0 if i % 2 == 0 else 0.3
        for _ in range(tries):
            w = rng.dirichlet(np.full(len(caps), concentration))
            if (w <= caps).all():
                break
        else:
            raise ValueError(f"no Dirichlet sample within the caps {caps.round(4).tolist()} in "
                             f"{tries} tries: the domains hold too few tokens for this budget")
        out.append(w)
    return np.array(out)
