"""Run configs made from the library's settings: the one way a settings dataclass becomes a
``dg.Config``.

The library defines each setting once (``lance_assets.table.settings.setting``: type, default,
help, allowed range): a column producer's, the trainer's, a curation ablation's and a mixture
search's. ``dagster_config`` turns those dataclasses into the asset's run config: one field per
setting of the run config, its help as the description, a nested dataclass as a nested
``Config``; its validator applies the settings' own ranges and the rule across them before the
run starts, so the launchpad, the CLI and the library cannot drift apart. ``settings_of``
turns a run config back into the library's dataclass.

An asset whose library function takes plain arguments, with no settings class behind them,
writes its run config by hand on ``RunConfig``: each field's docstring is its description.
"""

from collections.abc import Callable
from dataclasses import MISSING, Field, is_dataclass
from typing import Any, Optional, Union, get_args, get_origin, get_type_hints

import dagster as dg
import pydantic

from lance_assets.table.settings import (
    run_config_default,
    run_config_fields,
    value_problem,
)


class RunConfig(dg.Config):
    """A run config written by hand: each field's docstring is its description in the
    launchpad (a plain ``dg.Config`` drops them)."""

    model_config = pydantic.ConfigDict(use_attribute_docstrings=True)


def _config_type(annotation: Any, owner: str, module: str) -> Any:
    """A setting's type as a run config type: nested dataclasses become Configs."""
    if isinstance(annotation, type) and is_dataclass(annotation):
        return dagster_config(f"{owner}{annotation.__name__}", annotation, module=module)
    origin = get_origin(annotation)
    if origin in (list, tuple) and get_args(annotation):
        return list[_config_type(get_args(annotation)[0], owner, module)]
    if origin is Union:
        inner = next(a for a in get_args(annotation) if a is not type(None))
        return Optional[_config_type(inner, owner, module)]
    return annotation


def _field(f: Field) -> Any:
    """The pydantic field of setting ``f``: its run config default and its help."""
    if f.metadata.get("run_config_default", MISSING) is MISSING \
            and f.default_factory is not MISSING:
        return pydantic.Field(default_factory=f.default_factory, description=f.metadata["help"])
    default = run_config_default(f)
    if default is MISSING:  # required
        return pydantic.Field(description=f.metadata["help"])
    return pydantic.Field(default=default, description=f.metadata["help"])


def dagster_config(name: str, *sources: type, module: str, doc: str | None = None,
                   base: type[dg.Config] = dg.Config,
                   problem: Callable[[Any], str | None] | None = None, **overrides: Any) -> type:
    """A ``dg.Config`` named ``name`` with one field per run config setting of the dataclasses
    ``sources``, on ``base`` (whose own fields ``overrides`` may redeclare). Its validator
    refuses a value out of its setting's range (``seq_len 0: must be >= 1``), then what
    ``problem`` finds wrong across the settings (a message in run config words, or None).
    ``module``: the module the class belongs to (the caller's ``__name__``); ``doc``: the
    class's docstring (default: the first source's)."""
    owner: dict[str, type] = {}
    spec: dict[str, Any] = {}
    for cls in sources:
        hints = get_type_hints(cls)
        for f in run_config_fields(cls):
            spec[f.name] = (_config_type(hints[f.name], name, module), _field(f))
            owner[f.name] = cls
    spec.update(overrides)

    def check(self):
        for field_name, cls in owner.items():
            value = getattr(self, field_name)
            wrong = value_problem(cls, field_name, value)
            if wrong:
                raise ValueError(f"{field_name} {value!r}: {wrong}")
        wrong = problem(self) if problem is not None else None
        if wrong:
            raise ValueError(wrong)
        return self

    return pydantic.create_model(
        name, __base__=base, __module__=module, __doc__=doc or sources[0].__doc__,
        __validators__={"check_settings": pydantic.model_validator(mode="after")(check)},
        **spec)


def settings_of(settings: type, config: dg.Config) -> Any:
    """The ``settings`` dataclass from the run config ``config`` (nested Configs included); the
    settings outside the run config keep their defaults."""

    def plain(value: Any, annotation: Any) -> Any:
        if isinstance(annotation, type) and is_dataclass(annotation):
            hints = get_type_hints(annotation)
            return annotation(**{f.name: plain(getattr(value, f.name), hints[f.name])
                                 for f in run_config_fields(annotation)})
        if get_origin(annotation) in (list, tuple) and get_args(annotation):
            return [plain(v, get_args(annotation)[0]) for v in value]
        return value

    hints = get_type_hints(settings)
    return settings(**{f.name: plain(getattr(config, f.name), hints[f.name])
                       for f in run_config_fields(settings)})
