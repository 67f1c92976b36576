"""The training and validation predicates a run reads (``--filter``, ``--val-mod``,
``--eval-filter``).

Torch-free: the Dagster assets check a run's domains on the split the trainer will read before
they tag a version or launch it, with this same function.
"""

from __future__ import annotations

from dataclasses import dataclass

from lance_assets.curation.predicate import Predicate, PredicateError, safe_predicate


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
