"""The whole graph as one job: what `make demo` materializes, and the UI's "end_to_end"."""

import dagster as dg

from lance_assets.defs.training.ablation import DEMO_RUN_CONFIG

end_to_end_job = dg.define_asset_job(
    "end_to_end", selection=dg.AssetSelection.all(),
    description="The whole graph, group by group: ingest (raw_text); curation (dedup_flag, "
                "quality_signals, near_dup, curation_rules, corpus_profile; the taggers "
                "detected_language, personal_data, paragraph_dups, contamination, opted_out, "
                "quality_score, semantic_dup); fineweb (fineweb_signals); tokens (tokenizer, "
                "token_ids); embeddings (embeddings and vector_index; chunk_embeddings and "
                "chunk_index); training (pretrained_model, samples, training_data_summary, "
                "curation_ablation; mixture_search, which does nothing until it is given "
                "domains); forensics (text_index, the forensics report and document_stories); "
                "table (table_maintenance).",
    config=DEMO_RUN_CONFIG,
)
