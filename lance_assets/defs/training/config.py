"""The ``pretrained_model`` run config, generated from the trainer's own settings.

``lance_assets.train.config`` defines every setting once (type, default, help, allowed range);
``defs/config.py`` turns those dataclasses into a Dagster ``Config`` whose fields carry the same
help as descriptions and whose validator applies the same ranges and the same rules across
settings, so the launchpad, the CLI and the trainer cannot drift apart.
"""

from dataclasses import fields

from lance_assets.defs.config import dagster_config
from lance_assets.train import config as train_config


def settings_problem(config) -> str | None:
    """The trainer's rules across settings (``min_lr`` within ``lr``, the mixture's), in run
    config words."""
    problem = train_config.settings_problem(config)
    return train_config.config_words(problem) if problem else None


TrainConfig = dagster_config(
    "TrainConfig", train_config.TrainConfig, train_config.LaunchConfig, module=__name__,
    doc="Settings of `python -m lance_assets.train` (same names, `_` for `-`) and of its launch. "
    "The defaults train the demo's `tiny` model in about a minute on 2 CPU cores.",
    problem=settings_problem)

LAUNCH_ONLY = {f.name for f in fields(train_config.LaunchConfig)}
