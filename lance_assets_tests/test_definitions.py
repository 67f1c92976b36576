import sys
from pathlib import Path

import dagster as dg

import lance_assets
from lance_assets.definitions import defs
from lance_assets.table import Table
from lance_assets.table.producer import producers

TAGGERS = ("detected_language", "personal_data", "paragraph_dups", "contamination", "quality_score",
           "semantic_dup", "opted_out")


def test_definitions_load():
    dg.Definitions.validate_loadable(defs)


def test_every_group_is_named_after_the_package_that_holds_its_code():
    """In the UI as in the code: an asset's group is the ``defs/`` folder that defines it and
    the library package that holds its code; a column producer's asset (made by
    ``defs/columns.py``) is in the group of the package its producer lives in. ``training`` is
    the one group over several packages (``train/``, ``launch/``, ``ablation/``)."""
    packages = {p.parent.name for p in Path(lance_assets.__file__).parent.glob("*/__init__.py")}
    made = {p.name: next(m.__name__ for m in list(sys.modules.values())
                         if getattr(m, "PRODUCER", None) is p) for p in producers()}
    graph = defs.resolve_asset_graph()
    wrong, groups = [], set()
    for key in graph.get_all_asset_keys():
        name, group = key.to_user_string(), graph.get(key).group_name
        groups.add(group)
        fn = defs.resolve_assets_def(key).op.compute_fn.decorated_fn
        module = made[name] if name in made else fn.__module__
        home = module.split(".")[1] if name in made else module.split(".")[2]
        if home != group:
            wrong.append(f"{name}: group {group}, code in {module}")
    assert not wrong, wrong
    assert groups - packages == {"training"} and "defs" not in groups
    assert {"ingest", "tokens", "curation", "embeddings", "forensics", "table"} <= groups


def test_asset_graph_shape():
    graph = defs.resolve_asset_graph()
    keys = {k.to_user_string() for k in graph.get_all_asset_keys()}
    assert keys == {"raw_text", "dedup_flag", "tokenizer", "token_ids", "pretrained_model", "samples",
                    "quality_signals", "near_dup", "text_index", "curation_rules", "corpus_profile",
                    "embeddings", "vector_index", "chunk_embeddings", "chunk_index", "forensics",
                    "detected_language", "personal_data", "paragraph_dups", "contamination",
                    "quality_score", "table_maintenance", "curation_ablation", "document_stories",
                    "semantic_dup", "fineweb_signals", "mixture_search", "opted_out",
                    "training_data_summary"}
    parents = {k.to_user_string(): {p.to_user_string() for p in graph.get(k).parent_keys}
               for k in graph.get_all_asset_keys()}
    assert parents == {"raw_text": set(), "dedup_flag": {"raw_text"}, "tokenizer": {"dedup_flag"},
                       "token_ids": {"dedup_flag", "tokenizer", "personal_data"},
                       "pretrained_model": {"token_ids", "curation_rules"},
                       "samples": {"pretrained_model"},
                       "training_data_summary": {"pretrained_model"},
                       "curation_ablation": {"token_ids", "curation_rules"},
                       "mixture_search": {"token_ids", "curation_rules"},
                       "quality_signals": {"raw_text"}, "near_dup": {"raw_text"},
                       "fineweb_signals": {"raw_text"},
                       "text_index": {"raw_text"},
                       # training waits only for what the default rules read (and the
                       # taggers' rules: `lang`, `contaminated`, `opted_out`); no embedding model
                       # on its path
                       "curation_rules": {"dedup_flag", "quality_signals", "near_dup", "token_ids",
                                          "detected_language", "contamination", "opted_out"},
                       "corpus_profile": {"dedup_flag", "quality_signals", "near_dup", "token_ids",
                                          "fineweb_signals", *TAGGERS},
                       "detected_language": {"raw_text"}, "personal_data": {"raw_text"},
                       "opted_out": {"raw_text"},
                       "paragraph_dups": {"raw_text"}, "contamination": {"raw_text"},
                       "quality_score": {"raw_text", "embeddings"},
                       "embeddings": {"raw_text", "dedup_flag"}, "vector_index": {"embeddings"},
                       "chunk_embeddings": {"raw_text", "dedup_flag", "embeddings"},
                       "chunk_index": {"chunk_embeddings"},
                       "semantic_dup": {"raw_text", "chunk_embeddings", "detected_language"},
                       "forensics": {"samples", "vector_index", "chunk_index", "text_index"},
                       "table_maintenance": {"raw_text"},
                       "document_stories": {"forensics", "curation_rules", "curation_ablation"}}
    for key in ("raw_text", "dedup_flag", "token_ids", "quality_signals", "near_dup", "text_index",
                "curation_rules", "embeddings", "vector_index", "chunk_embeddings", "chunk_index",
                "table_maintenance", *TAGGERS):
        node = graph.get(dg.AssetKey(key))
        assert node.pools == {"lance_corpus"}  # one writer of the table at a time
    for key in keys:
        node = graph.get(dg.AssetKey(key))
        assert node.description and node.group_name and node.kinds and node.code_version
    # the checks that guard training block it (one only warns)
    guards = {k.name for k in graph.asset_check_keys if k.asset_key == dg.AssetKey("curation_rules")}
    assert guards == {"rules_valid", "filter_keeps_rows", "input_ids_present", "n_tokens_consistent",
                      "duplicate_rate_in_bounds", "contamination_not_kept",
                      "rule_columns_written", "no_source_wiped_out"}
    # every column asset's columns are checked written on every row
    covered = {k.asset_key.to_user_string() for k in graph.asset_check_keys
               if k.name == "columns_written"}
    assert covered == {"dedup_flag", "quality_signals", "near_dup", "token_ids", "embeddings",
                       "chunk_embeddings", "fineweb_signals", *TAGGERS}
    blocking = {k.name for k in graph.asset_check_keys if graph.get_check_spec(k).blocking}
    assert guards - {"no_source_wiped_out"} <= blocking and "columns_written" in blocking
    # the comparisons with earlier runs, and a source one rule empties, only warn
    assert not blocking & {"bytes_per_token_not_worse", "val_bpb_not_worse", "no_source_wiped_out"}
    assert graph.get(dg.AssetKey("table_maintenance")).group_name == "table"
    # automation: everything after ingest follows new data; ingest and maintenance have their
    # schedules, training starts by itself only with LANCE_ASSETS_AUTO_TRAIN=1, and
    # document_stories answers a person's question (the ids in its run config)
    unautomated = {k.to_user_string() for k in graph.get_all_asset_keys()
                   if graph.get(k).automation_condition is None}
    assert unautomated == {"raw_text", "pretrained_model", "table_maintenance", "curation_ablation",
                           "document_stories", "mixture_search"}
    assert all(graph.get(k).automation_condition is not None for k in graph.asset_check_keys)


def test_train_config_mirrors_every_trainer_flag(tmp_path):
    from lance_assets.defs.training.assets import TrainConfig
    from lance_assets.defs.training.config import LAUNCH_ONLY
    from lance_assets.train.spec import RunSpec
    from lance_assets.train.trainer import parse_args

    cfg = TrainConfig(compile=True, pack=False, epochs=1.5, log_batch_hashes=True,
                      filter="NOT is_dup")  # '' would read the curation rules from a table
    args = parse_args(RunSpec.of(Table.of(tmp_path), tmp_path / "out", cfg.model_dump()).argv())
    trainer_flags = set(vars(args)) - {"data", "out", "table", "table_version", "table_tag"}
    assert trainer_flags == set(TrainConfig.model_fields) - LAUNCH_ONLY
    for name in trainer_flags:
        assert getattr(args, name) == getattr(cfg, name), name



def test_torchrun_steps_run_one_at_a_time_inside_a_run():
    """`pretrained_model` and `curation_ablation` each take every core (or GPU): in one run, the
    executor of every job (also the implicit one `dagster asset materialize` builds) limits the
    steps tagged as trainers to one at a time."""
    from lance_assets.defs.common import RUN_EXECUTOR, TRAINER_TAG

    trainers = {key.to_user_string() for key in defs.resolve_asset_graph().get_all_asset_keys()
                if defs.get_assets_def(key).op.tags.get(TRAINER_TAG)}
    assert trainers == {"pretrained_model", "curation_ablation", "mixture_search"}
    for job in ("end_to_end", "ingest", "__ASSET_JOB"):
        assert defs.resolve_job_def(job).executor_def is RUN_EXECUTOR, job


def test_make_demo_and_the_end_to_end_job_run_the_same_ablation_config():
    """`make demo` passes the end_to_end job's run config (a budget the demo corpus can fill)."""
    import json
    import re
    from pathlib import Path

    from lance_assets.definitions import defs
    from lance_assets.defs.training.ablation import DEMO_RUN_CONFIG

    makefile = (Path(__file__).parents[1] / "Makefile").read_text()
    demo = json.loads(re.search(r"^DEMO_RUN_CONFIG := (.*)$", makefile, re.M).group(1))
    assert demo == DEMO_RUN_CONFIG
    assert "--config-json '$(DEMO_RUN_CONFIG)'" in makefile
    assert defs.get_job_def("end_to_end").run_config == DEMO_RUN_CONFIG
