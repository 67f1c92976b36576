"""One training run as a plain value: ``RunSpec``.

A spec holds everything a run needs: the trainer's settings and how it is launched (by their
run-config names, every one of them: ``pretrained_model``'s defaults fill what is not given),
the table snapshot it reads (the table's root and name, the tag and the version) and its run
folder. ``argv`` is the one place a run becomes a trainer command line and ``digest`` the one
place it becomes a cache key; ``pretrained_model``, ``curation_ablation`` and
``mixture_search`` build specs, and a launcher (torchrun through Dagster Pipes, a Ray job, Ray
tasks) runs them.

An empty ``filter`` reaches the trainer as ``--filter ''``: the trainer resolves the curation
rules in force at the version it pins, so the rules are read once, where the rows are read.
"""

from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass, field

from lance_assets import paths
from lance_assets.storage import Location
from lance_assets.table import Table
from lance_assets.table.fingerprint import digest
from lance_assets.table.settings import run_config_default, run_config_fields
from lance_assets.train import config as train_config

RESULT_NEUTRAL = ("run_name", "resume", "launcher")  # where a run writes and how it resumes


@functools.cache
def _settings() -> dict[str, tuple[type, object]]:
    """Every setting a spec holds (trainer and launch, CLI-only ones left out): its dataclass
    and its default as the run config has it."""
    out = {}
    for cls in (train_config.TrainConfig, train_config.LaunchConfig):
        for f in run_config_fields(cls):
            out[f.name] = (cls, run_config_default(f))
    return out


def _complete(values: dict) -> dict:
    """``values`` over the defaults, a whole number in a float setting as a float (a digest
    tells 1 from 1.0), in the order of the settings."""
    known = _settings()
    unknown = sorted(set(values) - set(known))
    if unknown:
        raise ValueError(f"not a trainer or launch setting: {', '.join(unknown)}")
    out = {}
    for name, (cls, default) in known.items():
        value = values.get(name, default)
        if train_config.value_type(cls, name) is float and type(value) is int:
            value = float(value)
        out[name] = value
    return out


@dataclass(frozen=True)
class RunSpec:
    """One training run: ``settings`` (every trainer and launch setting by its run-config name)
    read from the table ``table`` under ``root``, at ``tag``/``version`` when pinned, into the
    run folder ``out``. Build one with ``RunSpec.of``."""

    root: str
    out: str
    settings: dict = field(default_factory=dict)
    table: str = paths.TABLE_NAME
    tag: str | None = None
    version: int | None = None

    @classmethod
    def of(cls, table: Table, out: Location | str, settings: dict | None = None,
           snapshot: tuple[str, int] | None = None) -> RunSpec:
        """The run of ``settings`` (the rest at ``pretrained_model``'s defaults) on ``table``,
        reading ``snapshot`` (tag, version) when given, into ``out``."""
        tag, version = snapshot if snapshot else (None, None)
        return cls(str(table.root), str(out), _complete(dict(settings or {})), table.name, tag,
                   version)

    def replace(self, **changes) -> RunSpec:
        """This spec with some settings changed (``steps=...``)."""
        return dataclasses.replace(self, settings=_complete({**self.settings, **changes}))

    @property
    def snapshot(self) -> tuple[str, int] | None:
        return (self.tag, self.version) if self.tag is not None else None

    @property
    def nproc_per_node(self) -> int:
        return int(self.settings["nproc_per_node"])

    @property
    def nnodes(self) -> int:
        return int(self.settings["nnodes"])

    @property
    def launcher(self) -> str:
        return self.settings["launcher"]

    def trainer_settings(self) -> dict:
        """The settings that are trainer flags (the launch settings left out)."""
        return {k: v for k, v in self.settings.items()
                if _settings()[k][0] is train_config.TrainConfig}

    def trainer_config(self) -> train_config.TrainConfig:
        """The trainer's settings as the trainer parses ``argv``."""
        return train_config.TrainConfig(**self.trainer_settings(), data=self.root,
                                        table=self.table, table_version=self.version,
                                        table_tag=self.tag, out=self.out)

    def argv(self) -> list[str]:
        """The arguments of ``-m lance_assets.train`` for this run: the table, the run folder,
        the pinned snapshot and one flag per trainer setting."""
        named = ["--table", self.table] if self.table != paths.TABLE_NAME else []
        pinned = ["--table-tag", self.tag] if self.tag is not None else []
        pinned += ["--table-version", str(self.version)] if self.version is not None else []
        return ["--data", self.root, *named, "--out", self.out, *pinned,
                *train_config.to_flags(self.trainer_settings())]

    def comparable(self, leave_out: tuple[str, ...] | set[str] = ()) -> dict:
        """What decides the run's result: every setting but where it writes, how it resumes
        and ``leave_out``."""
        skip = {*RESULT_NEUTRAL, *leave_out}
        return {k: v for k, v in self.settings.items() if k not in skip}

    def digest(self, leave_out: tuple[str, ...] | set[str] = (), add: dict | None = None) -> str:
        """The run's cache key: a short hash of ``comparable(leave_out)`` and ``add`` (what else
        decides a result for the caller, such as the version or the held-out split)."""
        return digest({**(add or {}), **self.comparable(leave_out)})
