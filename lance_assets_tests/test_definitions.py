import dagster as dg

from lance_assets.definitions import defs


def test_definitions_load():
    dg.Definitions.validate_loadable(defs)


def test_asset_graph_shape():
    graph = defs.resolve_asset_graph()
    keys = {k.to_user_string() for k in graph.get_all_asset_keys()}
    assert keys == {"raw_text", "dedup_flag", "tokenizer", "token_ids", "pretrained_model", "samples",
                    "quality_signals", "near_dup", "text_index", "curation_rules", "corpus_profile",
                    "embeddings", "vector_index", "chunk_embeddings", "chunk_index",
                    "forensics"}
    parents = {k.to_user_string(): {p.to_user_string() for p in graph.get(k).parent_keys}
               for k in graph.get_all_asset_keys()}
    assert parents == {"raw_text": set(), "dedup_flag": {"raw_text"}, "tokenizer": {"dedup_flag"},
                       "token_ids": {"dedup_flag", "tokenizer"},
                       "pretrained_model": {"token_ids", "curation_rules"},
                       "samples": {"pretrained_model"},
                       "quality_signals": {"raw_text"}, "near_dup": {"raw_text"},
                       "text_index": {"raw_text"},
                       "curation_rules": {"dedup_flag", "quality_signals", "near_dup", "token_ids"},
                       "corpus_profile": {"dedup_flag", "quality_signals", "near_dup", "token_ids"},
                       "embeddings": {"raw_text"}, "vector_index": {"embeddings"},
                       "chunk_embeddings": {"raw_text", "embeddings"},
                       "chunk_index": {"chunk_embeddings"},
                       "forensics": {"samples", "vector_index", "chunk_index", "text_index"}}
    for key in ("raw_text", "dedup_flag", "token_ids", "quality_signals", "near_dup", "text_index",
                "curation_rules", "embeddings", "vector_index", "chunk_embeddings", "chunk_index"):
        node = graph.get(dg.AssetKey(key))
        assert node.pools == {"lance_corpus"}  # one writer of the table at a time
    for key in keys:
        node = graph.get(dg.AssetKey(key))
        assert node.description and node.group_name and node.kinds and node.code_version
    # the checks that guard training block it
    guards = {k.name for k in graph.asset_check_keys if k.asset_key == dg.AssetKey("curation_rules")}
    assert guards == {"rules_valid", "filter_keeps_rows", "input_ids_present", "n_tokens_consistent",
                      "duplicate_rate_in_bounds"}
    assert all(graph.get_check_spec(k).blocking for k in graph.asset_check_keys)


def test_train_config_mirrors_every_trainer_flag(tmp_path):
    from lance_assets.defs.training.assets import LAUNCH_ONLY, TrainConfig, trainer_command
    from lance_assets.train.trainer import parse_args

    cfg = TrainConfig(compile=True, pack=False, epochs=1.5, log_batch_hashes=True,
                      filter="NOT is_dup")  # '' would read the curation rules from a table
    cmd = trainer_command(cfg, tmp_path, tmp_path / "out")
    args = parse_args(cmd[cmd.index("lance_assets.train") + 1:])
    trainer_flags = set(vars(args)) - {"data", "out", "table", "table_version"}
    assert trainer_flags == set(TrainConfig.model_fields) - LAUNCH_ONLY
    for name in trainer_flags:
        assert getattr(args, name) == getattr(cfg, name), name
