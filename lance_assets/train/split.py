"""The training and validation predicates a run reads (``--filter``, ``--val-mod``,
``--eval-filter``), and the check of a run's data before it starts.

With no ``--filter`` the run keeps the curation rules in force at the version it pins
(``run_filter``): read from that version's config, so a resume, a redacted copy opened through
its tag and the check before a launch all read the same rules as the rows.

Torch-free: ``check_run_data`` is what the trainer refuses about its data, and the Dagster
assets call it before they tag a version or launch a process.
"""

from __future__ import annotations

from dataclasses import dataclass

import lance

from lance_assets.curation.predicate import Predicate, PredicateError, safe_predicate
from lance_assets.curation.rules import rules_in_force_at
from lance_assets.train.domains import plan_mixture


@dataclass(frozen=True)
class Splits:
    train: Predicate
    val: Predicate


def splits(user_filter: str, val_mod: int, columns, eval_filter: str = "") -> Splits:
    """The training and validation predicates: the user's filter (checked against ``columns``;
    ``PredicateError`` names --filter otherwise) AND the trainer's own split.

    With ``eval_filter`` (checked the same way) the validation split is those documents alone,
    whatever the user's filter, and training keeps the user's filter AND NOT ``eval_filter``:
    runs with different filters then evaluate on the same held-out documents, none of which
    any of them trains on."""
    if not isinstance(val_mod, int) or val_mod < 2:
        raise ValueError(f"val_mod must be an integer >= 2, got {val_mod!r}")
    columns = list(columns)
    try:
        user = safe_predicate(user_filter, columns) if user_filter.strip() else None
    except PredicateError as e:
        raise PredicateError(f"--filter: {e}") from None
    has_tokens = safe_predicate("n_tokens > 0", columns)
    if eval_filter.strip():
        try:
            held_out = safe_predicate(eval_filter, columns)
        except PredicateError as e:
            raise PredicateError(f"--eval-filter: {e}") from None
        train = has_tokens.and_(held_out.negated())
        return Splits(train if user is None else user.and_(train), has_tokens.and_(held_out))
    train = safe_predicate(f"n_tokens > 0 AND id % {val_mod} != 0", columns)
    val = safe_predicate(f"n_tokens > 0 AND id % {val_mod} = 0", columns)
    if user is None:
        return Splits(train, val)
    return Splits(user.and_(train), user.and_(val))


@dataclass(frozen=True)
class RunFilter:
    """The filter a run keeps, and where it came from."""

    text: str  # the predicate's source text
    source: str  # "--filter", or "curation rules at version N"


def run_filter(ds: lance.LanceDataset, user_filter: str) -> RunFilter:
    """``user_filter`` when given, else the curation rules in force at ``ds`` (one pinned
    version, or a redacted copy opened through its tag), combined and rendered (a ``RuleError``
    names every broken rule)."""
    if user_filter.strip():
        return RunFilter(user_filter, "--filter")
    return RunFilter(rules_in_force_at(ds).lance, f"curation rules at version {ds.version}")


def check_run_data(cfg, ds: lance.LanceDataset, *, steps: int, global_batch: int
                   ) -> tuple[RunFilter, Splits]:
    """What a run of ``cfg`` (the trainer's settings) refuses about the data at ``ds``: its
    filter (``run_filter``) and the splits parsed against ``ds``'s columns, and its mixture
    (``--domains``, ``--weights``: ``train.domains.plan_mixture`` over ``steps`` steps of
    ``global_batch`` blocks). Raises ``PredicateError``, ``RuleError`` or ``ConfigError``
    naming the setting and the fix."""
    chosen = run_filter(ds, cfg.filter)
    split = splits(chosen.text, cfg.val_mod, ds.schema.names, cfg.eval_filter)
    if cfg.domains.strip():
        plan_mixture(ds, domains=cfg.domains, weights=cfg.weights, train=split.train,
                     block_len=cfg.seq_len + 1, num_splits=cfg.num_splits, steps=steps,
                     global_batch=global_batch, seed=cfg.seed, max_repeats=cfg.max_repeats)
    return chosen, split
