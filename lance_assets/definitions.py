"""The `lance_assets` code location: every column, the model and its samples, the schedule and
sensor that ingest new rows, and the automation sensor that brings the columns up to date."""

import dagster as dg

from lance_assets.defs.common import RUN_EXECUTOR
from lance_assets.defs.conditions import corpus_automation_sensor
from lance_assets.defs.corpus.assets import dedup_flag, raw_text, token_ids, tokenizer
from lance_assets.defs.corpus.automation import ingest_job, ingest_schedule, landing_sensor
from lance_assets.defs.corpus.checks import CHECKS as CORPUS_CHECKS
from lance_assets.defs.curation.assets import (
                                                corpus_profile,
                                                curation_rules,
                                                near_dup,
                                                quality_signals,
                                                text_index,
)
from lance_assets.defs.curation.checks import CHECKS as CURATION_CHECKS
from lance_assets.defs.curation.taggers import TAGGERS as CURATION_TAGGERS
from lance_assets.defs.forensics.assets import (
    chunk_embeddings,
    chunk_index,
    embeddings,
    forensics,
    vector_index,
)
from lance_assets.defs.maintenance.assets import table_maintenance
from lance_assets.defs.maintenance.automation import table_maintenance_job, table_maintenance_schedule
from lance_assets.defs.maintenance.checks import coverage_checks
from lance_assets.defs.maintenance.forget import forget_job
from lance_assets.defs.resources import lance_store_from_env
from lance_assets.defs.training.ablation import DEMO_RUN_CONFIG, curation_ablation
from lance_assets.defs.training.assets import pretrained_model, samples
from lance_assets.defs.training.checks import CHECKS as TRAINING_CHECKS
from lance_assets.defs.training.torchrun import TorchrunPipesClient

ASSETS = [raw_text, dedup_flag, tokenizer, token_ids, pretrained_model, samples,
          quality_signals, near_dup, text_index, curation_rules, corpus_profile,
          embeddings, vector_index, chunk_embeddings, chunk_index, forensics, *CURATION_TAGGERS,
          table_maintenance, curation_ablation]

end_to_end_job = dg.define_asset_job(
    "end_to_end", selection=dg.AssetSelection.all(),
    description="The whole graph: ingest (raw_text); curation (dedup_flag, quality_signals, "
                "near_dup, text_index, curation_rules, corpus_profile; the taggers detected_language, "
                "personal_data, paragraph_dups, contamination, quality_score); tokenizer and "
                "token_ids; embeddings and vector_index; chunk_embeddings and chunk_index; "
                "training (pretrained_model, samples, curation_ablation); the forensics report; "
                "table_maintenance.",
    config=DEMO_RUN_CONFIG,
)

defs = dg.Definitions(
    assets=ASSETS,
    executor=RUN_EXECUTOR,
    asset_checks=[*CURATION_CHECKS, *CORPUS_CHECKS, *TRAINING_CHECKS, *coverage_checks(ASSETS)],
    jobs=[ingest_job, end_to_end_job, table_maintenance_job, forget_job],
    schedules=[ingest_schedule, table_maintenance_schedule],
    sensors=[landing_sensor, corpus_automation_sensor],
    resources={
        "lance_store": lance_store_from_env(),
        # Longer than torchrun's own shutdown, so a cancelled run's ranks can flush a checkpoint,
        # and short enough that every rank is gone within a minute.
        "pipes_subprocess_client": TorchrunPipesClient(termination_timeout_seconds=55),
    },
)
