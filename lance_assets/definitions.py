"""The `lance_assets` code location: every column, the model and its samples, one schedule."""

import dagster as dg

from lance_assets.defs.corpus.assets import dedup_flag, raw_text, token_ids
from lance_assets.defs.corpus.tokenizer import tokenizer
from lance_assets.defs.curation.assets import (corpus_profile, curation_rules, near_dup,
                                              quality_signals, text_index)
from lance_assets.defs.curation.checks import CHECKS as CURATION_CHECKS
from lance_assets.defs.resources import lance_store_from_env
from lance_assets.defs.training.assets import pretrained_model, samples

corpus_job = dg.define_asset_job(
    "corpus_refresh",
    selection=dg.AssetSelection.assets(raw_text, dedup_flag, token_ids, quality_signals, near_dup,
                                       text_index),
    description="Ingest what is new in LANCE_ASSETS_SOURCE, then bring every column up to date.",
)
end_to_end_job = dg.define_asset_job(
    "end_to_end", selection=dg.AssetSelection.all(),
    description="The whole graph: ingest, dedup, tokenize, train, sample.",
)
corpus_schedule = dg.ScheduleDefinition(
    job=corpus_job, cron_schedule="0 3 * * *", default_status=dg.DefaultScheduleStatus.STOPPED,
    description="Daily incremental ingest + column catch-up (off until switched on in the UI).",
)

defs = dg.Definitions(
    assets=[raw_text, dedup_flag, tokenizer, token_ids, pretrained_model, samples,
            quality_signals, near_dup, text_index, curation_rules, corpus_profile],
    asset_checks=CURATION_CHECKS,
    jobs=[corpus_job, end_to_end_job],
    schedules=[corpus_schedule],
    resources={
        "lance_store": lance_store_from_env(),
        # Longer than torchrun's own shutdown, so a cancelled run's ranks can flush a checkpoint.
        "pipes_subprocess_client": dg.PipesSubprocessClient(termination_timeout_seconds=90),
    },
)
