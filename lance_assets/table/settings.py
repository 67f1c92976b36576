"""Settings, defined once: a frozen dataclass of ``setting(default, help, ...)`` fields.

Every settings class of the package is written this way: a column producer's, the trainer's
(``train.config``), a curation ablation's and a mixture search's (``ablation.settings``). A
setting carries its help text and, where it has one, its allowed range (``ge``, ``gt``,
``choices``, ``pattern``). The trainer makes its command-line flags from them; the Dagster layer
makes each asset's run config from them (``defs/config.py``), the help as the field's
description and the same ranges checked before a run starts. A setting declared with
``run_config=False`` is not a field of the run config: for library callers only (a stand-in
model in tests, tokenizer threads), or set by the asset itself (the trainer's table and output
folder). ``InputError`` is what a producer raises when a setting or a user's file is wrong: the
asset fails with the message and without retries, since running again cannot help.
"""

from __future__ import annotations

import functools
import re
from dataclasses import MISSING, Field, dataclass, field, fields, is_dataclass
from typing import Any, Union, get_args, get_origin, get_type_hints

RUN_CONFIG = "run_config"
EVERY_COLUMN_ASSET = ("executor", "fragments_per_commit")  # settings no producer may declare


def setting(default: Any = MISSING, help: str = "", *, default_factory: Any = MISSING,
            run_config: bool = True, run_config_default: Any = MISSING,
            ge: float | None = None, gt: float | None = None, choices: tuple | None = None,
            pattern: re.Pattern | None = None, pattern_words: str = "") -> Any:
    """A setting: a dataclass field with its help text (the flag's help, the run config's
    description) and its allowed range (``ge``/``gt``/``choices``; ``pattern``, which a
    non-empty string must match, says in ``pattern_words`` what it asks for).
    ``run_config=False``: not a field of the asset's run config. ``run_config_default``: the
    run config's default where it differs from the library's."""
    if not help:
        raise ValueError("a setting needs its help text: it is the run config's description")
    return field(default=default, default_factory=default_factory, metadata={
        "help": help, RUN_CONFIG: run_config, "run_config_default": run_config_default,
        "ge": ge, "gt": gt, "choices": choices, "pattern": pattern,
        "pattern_words": pattern_words})


@dataclass(frozen=True)
class NoSettings:
    """A producer without knobs of its own."""


class InputError(ValueError):
    """A setting or a user's file is wrong; the message names it and the fix."""


def run_config_fields(settings: type) -> list[Field]:
    """The settings that are fields of the asset's run config."""
    return [f for f in fields(settings) if f.metadata.get(RUN_CONFIG, True)]


def run_config_default(f: Field) -> Any:
    """The run config's default of setting ``f`` (MISSING: the run config must give it)."""
    if f.metadata.get("run_config_default", MISSING) is not MISSING:
        return f.metadata["run_config_default"]
    if f.default_factory is not MISSING:
        return f.default_factory()
    return f.default


@functools.cache
def _hints(cls: type) -> dict[str, Any]:
    """``cls``'s field types, evaluated once (the annotations are strings)."""
    return get_type_hints(cls)


def value_type(cls: type, name: str) -> Any:
    """The type of setting ``name`` of ``cls`` without Optional (int, float, str, bool...)."""
    hint = _hints(cls)[name]
    if get_origin(hint) is Union:
        hint = next(a for a in get_args(hint) if a is not type(None))
    return hint


def value_problem(cls: type, name: str, value: Any) -> str | None:
    """What keeps ``value`` out of the range of setting ``name`` of ``cls`` (``must be >= 1``),
    or None when it is allowed (None always is: a setting without a value)."""
    meta = next(f.metadata for f in fields(cls) if f.name == name)
    if value is None:
        return None
    kind = value_type(cls, name)
    if kind in (int, float) and (isinstance(value, bool) or not isinstance(value, (int, float))
                                 or (kind is int and not float(value).is_integer())):
        return f"must be {'an integer' if kind is int else 'a number'}"
    if meta.get("ge") is not None and value < meta["ge"]:
        return f"must be >= {meta['ge']}"
    if meta.get("gt") is not None and value <= meta["gt"]:
        return f"must be > {meta['gt']}"
    if meta.get("choices") is not None and value not in meta["choices"]:
        return f"choose one of {', '.join(meta['choices'])}"
    if meta.get("pattern") is not None and value and not meta["pattern"].match(value):
        return f"must be {meta['pattern_words']}"
    return None


def check_settings(settings: Any, where: str) -> None:
    """Refuse a settings class that is not a dataclass of described settings."""
    if not (isinstance(settings, type) and is_dataclass(settings)):
        raise ValueError(f"{where}: settings= must be a dataclass (use setting(default, help))")
    for f in fields(settings):
        if not f.metadata.get("help"):
            raise ValueError(f"{where}: setting {f.name!r} has no help text: declare it with "
                             "setting(default, help)")
        if f.name in EVERY_COLUMN_ASSET:
            raise ValueError(f"{where}: setting {f.name!r} is one every column asset has")
