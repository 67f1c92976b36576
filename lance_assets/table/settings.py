"""A column producer's settings: a frozen dataclass of ``setting(default, help)`` fields.

The Dagster layer turns each setting into a field of the asset's run config, its help into the
field's description; a setting declared with ``run_config=False`` is for library callers only
(a stand-in model in tests, tokenizer threads) and keeps its default in the asset.
``InputError`` is what a producer raises when a setting or a user's file is wrong: the asset
fails with the message and without retries, since running again cannot help.
"""

from __future__ import annotations

from dataclasses import MISSING, Field, dataclass, field, fields, is_dataclass
from typing import Any

RUN_CONFIG = "run_config"
EVERY_COLUMN_ASSET = ("executor", "fragments_per_commit")  # settings no producer may declare


def setting(default: Any = MISSING, help: str = "", *, default_factory: Any = MISSING,
            run_config: bool = True) -> Any:
    """A producer setting: a dataclass field with its help text (the run config's description).
    ``run_config=False``: for library callers only, not a field of the asset's run config."""
    if not help:
        raise ValueError("a setting needs its help text: it is the run config's description")
    return field(default=default, default_factory=default_factory,
                 metadata={"help": help, RUN_CONFIG: run_config})


@dataclass(frozen=True)
class NoSettings:
    """A producer without knobs of its own."""


class InputError(ValueError):
    """A setting or a user's file is wrong; the message names it and the fix."""


def run_config_fields(settings: type) -> list[Field]:
    """The settings that are fields of the asset's run config."""
    return [f for f in fields(settings) if f.metadata.get(RUN_CONFIG, True)]


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
