"""The `lance_assets` code location: every column, the model and its samples, the schedule and
sensor that keep the corpus current."""

import dagster as dg

from lance_assets.defs.corpus.assets import dedup_flag, raw_text, token_ids, tokenizer
from lance_assets.defs.corpus.automation import corpus_refresh_job, corpus_refresh_schedule, landing_sensor
from lance_assets.defs.curation.assets import (
                                                corpus_profile,
                                                curation_rules,
                                                near_dup,
                                                quality_signals,
                                                text_index,
)
from lance_assets.defs.curation.checks import CHECKS as CURATION_CHECKS
from lance_assets.defs.forensics.assets import (
    chunk_embeddings,
    chunk_index,
    embeddings,
    forensics,
    vector_index,
)
from lance_assets.defs.resources import lance_store_from_env
from lance_assets.defs.training.assets import pretrained_model, samples
from lance_assets.defs.training.torchrun import TorchrunPipesClient

end_to_end_job = dg.define_asset_job(
    "end_to_end", selection=dg.AssetSelection.all(),
    description="The whole graph: ingest (raw_text); curation (dedup_flag, quality_signals, "
                "near_dup, text_index, curation_rules, corpus_profile); tokenizer and token_ids; "
                "embeddings and vector_index; chunk_embeddings and chunk_index; "
                "training (pretrained_model, samples); and the "
                "forensics report.",
)

defs = dg.Definitions(
    assets=[raw_text, dedup_flag, tokenizer, token_ids, pretrained_model, samples,
            quality_signals, near_dup, text_index, curation_rules, corpus_profile,
            embeddings, vector_index, chunk_embeddings, chunk_index, forensics],
    asset_checks=CURATION_CHECKS,
    jobs=[corpus_refresh_job, end_to_end_job],
    schedules=[corpus_refresh_schedule],
    sensors=[landing_sensor],
    resources={
        "lance_store": lance_store_from_env(),
        # Longer than torchrun's own shutdown, so a cancelled run's ranks can flush a checkpoint,
        # and short enough that every rank is gone within a minute.
        "pipes_subprocess_client": TorchrunPipesClient(termination_timeout_seconds=55),
    },
)
