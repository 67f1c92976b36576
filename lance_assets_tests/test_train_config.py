"""One definition of the trainer's settings: the CLI's flags, the Dagster run config and the
ranges both enforce. The launchpad's scaffolded default config of every asset must validate."""

import inspect
import json
import re
from dataclasses import MISSING, fields

import dagster as dg
import pytest
import yaml

from lance_assets.definitions import defs
from lance_assets.defs.training.ablation import AblationConfig
from lance_assets.defs.training.config import LAUNCH_ONLY
from lance_assets.defs.training.config import TrainConfig as DagsterTrainConfig
from lance_assets.defs.training.mixture import MixtureConfig
from lance_assets.table import Table
from lance_assets.table.settings import run_config_fields
from lance_assets.train import config
from lance_assets.train.spec import RunSpec
from lance_assets.train.trainer import main

# What a YAML 1.2 writer (the launchpad's) must quote; anything else it writes plain. The
# server reads the text back with PyYAML (YAML 1.1), where plain `off`, `yes`, `no` are booleans.
_NEEDS_QUOTES = re.compile(
    r"^$|^[\s\-?:,\[\]{}#&*!|>'\"%@`]|[:#]\s|:$|\s$|\n"
    r"|^(null|Null|NULL|~|true|True|TRUE|false|False|FALSE)$"
    r"|^[-+]?(\d[\d_]*(\.\d*)?|\.\d+)([eE][-+]?\d+)?$|^0x|^0o|^[-+]?\.(inf|Inf|INF)$|^\.(nan|NaN|NAN)$")


def yaml12_scalar(value) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    return json.dumps(value) if _NEEDS_QUOTES.search(value) else value


def launchpad_yaml(value, indent: int = 0) -> str:
    """``value`` as YAML text the way the launchpad scaffolds it (YAML 1.2, plain strings)."""
    pad = " " * indent
    if isinstance(value, dict):
        if not value:
            return "{}"
        lines = []
        for k, v in value.items():
            if isinstance(v, (dict, list)) and v:
                lines.append(f"{pad}{k}:\n{launchpad_yaml(v, indent + 2)}")
            else:
                text = launchpad_yaml(v) if isinstance(v, (dict, list)) else yaml12_scalar(v)
                lines.append(f"{pad}{k}: {text}")
        return "\n".join(lines)
    if isinstance(value, list):
        if not value:
            return "[]"
        return "\n".join(f"{pad}- {yaml12_scalar(v)}" if not isinstance(v, (dict, list))
                         else f"{pad}-\n{launchpad_yaml(v, indent + 2)}" for v in value)
    return yaml12_scalar(value)


def scaffold(config_field):
    """The default config the launchpad fills in: every field's default, nested shapes walked."""
    out = {}
    for name, f in config_field.config_type.fields.items():
        if f.default_provided:
            out[name] = f.default_value
        elif f.config_type.kind.name in ("STRICT_SHAPE", "SHAPE", "PERMISSIVE_SHAPE"):
            out[name] = scaffold(f)
    return out


def config_class(assets_def):
    """The asset's pydantic ``dg.Config`` class, from its function's signature."""
    fn = assets_def.op.compute_fn.decorated_fn
    for p in inspect.signature(fn).parameters.values():
        if isinstance(p.annotation, type) and issubclass(p.annotation, dg.Config):
            return p.annotation
    return None


def test_the_yaml_writer_reproduces_the_launchpad_trap():
    """A string default such as `off` comes back a boolean, and Dagster refuses it: the
    validation below would catch a default like that."""
    assert yaml.safe_load(launchpad_yaml({"mode": "off"})) == {"mode": False}  # YAML 1.1 reading
    job = defs.resolve_implicit_global_asset_job_def()
    with pytest.raises(dg.DagsterInvalidConfigError):
        dg.validate_run_config(job, {"ops": {"pretrained_model": {"config": {"arch": False}}}})
    assert yaml.safe_load(launchpad_yaml({"f": "", "n": None, "s": "NOT is_dup"})) == {
        "f": "", "n": None, "s": "NOT is_dup"}


def test_every_asset_default_config_validates_as_the_launchpad_scaffolds_it():
    job = defs.resolve_implicit_global_asset_job_def()
    checked = 0
    for key in defs.resolve_asset_graph().get_all_asset_keys():
        assets_def = defs.get_assets_def(key)
        schema = assets_def.op.config_schema
        if schema is None:
            continue
        text = launchpad_yaml(scaffold(schema.as_field()))
        loaded = yaml.safe_load(text) or {}
        result = dg.validate_run_config(job, {"ops": {assets_def.op.name: {"config": loaded}}})
        assert result, key
        cls = config_class(assets_def)
        if cls is not None:  # the ranges and validators Dagster applies when the run starts
            cls(**loaded)
        checked += 1
    assert checked >= 5


def test_cli_flags_and_dagster_config_come_from_one_definition(tmp_path):
    parser = config.build_parser()
    actions = {a.dest: a for a in parser._actions if a.dest != "help"}
    trainer_fields = {f.name: f for f in fields(config.TrainConfig)}
    assert set(actions) == set(trainer_fields)
    for name, f in trainer_fields.items():
        assert f.metadata["help"] and actions[name].help.startswith(f.metadata["help"].replace("%", "%%"))
    dagster_fields = DagsterTrainConfig.model_fields
    expected = {f.name for f in run_config_fields(config.TrainConfig)} | LAUNCH_ONLY
    assert set(dagster_fields) == expected
    for name in expected - LAUNCH_ONLY:
        f = trainer_fields[name]
        default = f.default if f.metadata["run_config_default"] is MISSING \
            else f.metadata["run_config_default"]
        assert dagster_fields[name].default == default, name
        assert dagster_fields[name].description == f.metadata["help"], name
    # a non-default value of every setting reaches the trainer unchanged through the command
    cfg = DagsterTrainConfig(compile=True, pack=False, epochs=1.5, log_batch_hashes=True,
                             filter="NOT is_dup", arch="modern", seq_len=64, lr=1e-3, min_lr=1e-4,
                             transform_parallelism=3, resume="auto", tokenizer="byte")
    args = config.parse_args(RunSpec.of(Table.of(tmp_path), tmp_path / "out",
                                        cfg.model_dump()).argv())
    for name in expected - LAUNCH_ONLY:
        assert getattr(args, name) == getattr(cfg, name), name


@pytest.mark.parametrize("flag, value", [("--seq-len", "0"), ("--steps", "-5"),
                                         ("--eval-every", "0"), ("--num-splits", "0"),
                                         ("--val-mod", "0"), ("--batch-size", "0"),
                                         ("--grad-accum", "0"), ("--lr", "0"),
                                         ("--model", "huge"), ("--arch", "gpt5"),
                                         ("--seq-len", "many")])
def test_a_flag_out_of_range_is_one_line_naming_the_flag(flag, value, capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["--data", "/nonexistent", flag, value])
    assert exit_.value.code == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and flag in err and "Traceback" not in err


@pytest.mark.parametrize("field, value", [("seq_len", 0), ("steps", -5), ("eval_every", 0),
                                          ("num_splits", 0), ("val_mod", 0), ("batch_size", 0),
                                          ("arch", "gpt5"), ("model", "huge")])
def test_the_dagster_config_enforces_the_same_ranges(field, value):
    with pytest.raises(Exception, match=field):
        DagsterTrainConfig(**{field: value})


@pytest.mark.parametrize("config", [AblationConfig, MixtureConfig])
@pytest.mark.parametrize("field, value", [("seq_len", 0), ("batch_size", 0), ("lr", 0.0),
                                          ("eval_blocks", 0), ("model", "huge"),
                                          ("arch", "gpt5"), ("name", "../x")])
def test_the_proxy_run_configs_enforce_the_trainers_ranges(config, field, value):
    with pytest.raises(Exception, match=re.escape(f"{field} {value!r}: ")):
        config(**{field: value})


@pytest.mark.parametrize("name", ["../escape", "/etc", "a/b", "..", ".hidden", "x" * 101, "a\\b"])
def test_run_name_must_be_a_plain_folder_name(name):
    with pytest.raises(Exception, match="run_name"):
        DagsterTrainConfig(run_name=name)


def test_run_name_plain_names_are_accepted():
    for name in ("", "exp-1", "lr_3e-4.v2"):
        assert DagsterTrainConfig(run_name=name).run_name == name


def test_min_lr_above_lr_is_refused_on_both_paths(capsys):
    with pytest.raises(SystemExit):
        main(["--lr", "1e-4", "--min-lr", "1e-3"])
    assert "--min-lr" in capsys.readouterr().err
    with pytest.raises(Exception, match="min_lr"):
        DagsterTrainConfig(lr=1e-4, min_lr=1e-3)


@pytest.mark.parametrize("steps, epochs, expected, why", [
    (None, None, 300, "--steps 300"),
    (12, None, 12, "--steps 12"),
    (None, 1.0, 18, "--epochs 1: 18 steps"),
    (12, 1.0, 12, "--steps 12 ends before --epochs 1 (18 steps)"),
    (40, 1.0, 18, "--epochs 1 (18 steps) ends before --steps 40"),
])
def test_steps_with_epochs_stop_at_whichever_ends_first_and_say_which(steps, epochs, expected, why):
    cfg = config.TrainConfig(steps=steps, epochs=epochs)
    planned, said = config.planned_steps(cfg, blocks_per_epoch=288, global_batch=16)
    assert planned == expected and said.startswith(why)


def test_workers_must_divide_the_splits_of_a_rank(capsys):
    with pytest.raises(config.ConfigError, match=r"--num-splits 8 .* world size x --num-workers \(2 x 3\)"):
        config.check_world(config.TrainConfig(num_splits=8, num_workers=3), world=2)
    config.check_world(config.TrainConfig(num_splits=8, num_workers=2, batch_size=4), world=2)
    assert main(["--data", "/nonexistent", "--num-workers", "3"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "--num-workers" in err
