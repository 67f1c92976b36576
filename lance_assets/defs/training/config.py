"""The ``pretrained_model`` run config, generated from the trainer's own settings.

``lance_assets.train.config`` defines every setting once (type, default, help, allowed range);
this module turns those dataclasses into a Dagster ``Config`` whose fields carry the same help
as descriptions and whose validator applies the same ranges, so the launchpad, the CLI and the
trainer cannot drift apart.
"""

from dataclasses import MISSING, fields
from typing import Any, get_type_hints

import dagster as dg
import pydantic

from lance_assets.train import config as train_config


def dagster_config(name: str, doc: str, *sources: type) -> type[dg.Config]:
    """A ``dg.Config`` with one field per dataclass field of ``sources`` (CLI-only ones left
    out: the asset sets them), validated by the trainer's own ``check_value``."""
    owner: dict[str, type] = {}
    spec: dict[str, Any] = {}
    for cls in sources:
        hints = get_type_hints(cls)
        for f in fields(cls):
            if f.metadata["cli_only"]:
                continue
            default = f.metadata["dagster_default"]
            default = f.default if default is MISSING else default
            spec[f.name] = (hints[f.name], pydantic.Field(default=default, description=f.metadata["help"]))
            owner[f.name] = cls

    def check(self):
        for field_name, cls in owner.items():
            try:
                train_config.check_value(cls, field_name, getattr(self, field_name))
            except train_config.ConfigError as e:  # "--seq-len 0: ..." -> "seq_len 0: ..."
                flag, rest = str(e).split(" ", 1)
                raise ValueError(f"{flag[2:].replace('-', '_')} {rest}") from None
        problem = train_config.settings_problem(self)
        if problem:
            raise ValueError(train_config.config_words(problem))
        return self

    model = pydantic.create_model(
        name, __base__=dg.Config,
        __validators__={"check_ranges": pydantic.model_validator(mode="after")(check)}, **spec)
    model.__doc__ = doc
    return model


TrainConfig = dagster_config(
    "TrainConfig",
    "Settings of `python -m lance_assets.train` (same names, `_` for `-`) and of its launch. "
    "The defaults train the demo's `tiny` model in about a minute on 2 CPU cores.",
    train_config.TrainConfig, train_config.LaunchConfig)

LAUNCH_ONLY = {f.name for f in fields(train_config.LaunchConfig)}
