"""Incremental ingest on a clock (schedule) or when files land (sensor); both run
`corpus_refresh`: `raw_text` and every column asset downstream of it, so new files end up
deduplicated and tokenized with no manual step. Training, sampling and the forensics report on
the samples are not part of it."""

import hashlib
import json
import os
from pathlib import Path

import dagster as dg

from lance_assets.corpus.sources import FILE_SUFFIXES, SourceError, expand_paths
from lance_assets.defs.common import FORENSICS, TRAINING_GROUP
from lance_assets.defs.resources import LanceStore

CRON_ENV = "LANCE_ASSETS_INGEST_CRON"
DEFAULT_CRON = "0 3 * * *"

corpus_refresh_job = dg.define_asset_job(
    "corpus_refresh",
    selection=(dg.AssetSelection.keys("raw_text").downstream()
               - dg.AssetSelection.groups(TRAINING_GROUP) - dg.AssetSelection.assets(FORENSICS)),
    description="Ingest what is new in the source (raw_text), then bring everything downstream "
                "of it up to date on the new fragments: dedup_flag, tokenizer, token_ids, "
                "quality_signals, near_dup, text_index, curation_rules, corpus_profile, "
                "embeddings and vector_index, chunk_embeddings and chunk_index. Training "
                "(pretrained_model, samples) and the "
                "forensics report are not part of it.",
)

corpus_refresh_schedule = dg.ScheduleDefinition(
    name="corpus_refresh_schedule",
    job=corpus_refresh_job,
    cron_schedule=os.environ.get(CRON_ENV, DEFAULT_CRON),
    default_status=dg.DefaultScheduleStatus.STOPPED,
    description="Runs corpus_refresh (incremental ingest, then everything downstream of it but "
                f"training and forensics); cron from ${CRON_ENV} (default "
                f"'{DEFAULT_CRON}'). Off until switched on.",
)


def landing_files(source: str) -> dict[str, list[int]]:
    """{path: [size, mtime_ns]} of the ingestible files the source names (a folder or glob)."""
    if source.startswith(("synthetic", "hf:")):
        return {}
    try:
        files = expand_paths(source)
    except SourceError:
        return {}
    out = {}
    for path in files:
        if path.name.endswith(FILE_SUFFIXES):
            st = path.stat()
            out[str(path)] = [st.st_size, st.st_mtime_ns]
    return out


@dg.sensor(job=corpus_refresh_job, minimum_interval_seconds=60,
           default_status=dg.DefaultSensorStatus.STOPPED,
           description="Runs corpus_refresh when files appear or change under the source folder "
                       "or glob (LANCE_ASSETS_SOURCE); checks every 60 s once switched on. Off "
                       "until switched on.")
def landing_sensor(context: dg.SensorEvaluationContext, lance_store: LanceStore):
    """Requests a `corpus_refresh` run when files appear (or change) under the source folder
    (LANCE_ASSETS_SOURCE pointing at a folder or glob). The cursor holds the files seen."""
    source = lance_store.source
    seen = json.loads(context.cursor) if context.cursor else {}
    current = landing_files(source)
    if not current and not Path(source).expanduser().exists() and "*" not in source:
        return dg.SkipReason(f"source {source!r} is not a folder or glob of files")
    new = sorted(p for p, stat in current.items() if seen.get(p) != stat)
    context.update_cursor(json.dumps(current, sort_keys=True))
    if not new:
        return dg.SkipReason(f"no new files in {source!r} ({len(current)} seen)")
    run_key = hashlib.sha256(json.dumps({p: current[p] for p in new}).encode()).hexdigest()[:16]
    context.log.info(f"{len(new)} new file(s): {', '.join(Path(p).name for p in new[:10])}")
    return dg.RunRequest(run_key=run_key, tags={"lance_assets/new_files": str(len(new))})
