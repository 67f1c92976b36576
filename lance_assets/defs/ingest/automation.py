"""Incremental ingest on a clock (schedule) or when files land (sensor); both run the `ingest`
job (`raw_text`). The column assets downstream of it follow through their automation conditions
(`defs/conditions.py`, the `corpus_automation` sensor): new rows end up deduplicated, tokenized
and embedded with no manual step. Training starts by itself only with LANCE_ASSETS_AUTO_TRAIN=1."""

import hashlib
import json
import os
from pathlib import Path

import dagster as dg

from lance_assets.defs.common import RAW_TEXT
from lance_assets.defs.resources import LanceStore
from lance_assets.ingest.sources import FILE_SUFFIXES, SourceError, expand_paths

CRON_ENV = "LANCE_ASSETS_INGEST_CRON"
DEFAULT_CRON = "0 3 * * *"

ingest_job = dg.define_asset_job(
    "ingest",
    selection=dg.AssetSelection.assets(RAW_TEXT),
    description="Ingest what is new in the source (raw_text). The corpus_automation sensor then "
                "brings every column asset downstream of it up to date on the new fragments.",
)

ingest_schedule = dg.ScheduleDefinition(
    name="ingest_schedule",
    job=ingest_job,
    cron_schedule=os.environ.get(CRON_ENV, DEFAULT_CRON),
    default_status=dg.DefaultScheduleStatus.STOPPED,
    description="Runs ingest (raw_text: what is new in the source); the columns follow by "
                f"automation. Cron from ${CRON_ENV} (default '{DEFAULT_CRON}'). Off until "
                "switched on.",
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


@dg.sensor(job=ingest_job, minimum_interval_seconds=60,
           default_status=dg.DefaultSensorStatus.STOPPED,
           description="Runs ingest when files appear or change under the source folder or glob "
                       "(LANCE_ASSETS_SOURCE); checks every 60 s once switched on; the columns "
                       "follow by automation. Off until switched on.")
def landing_sensor(context: dg.SensorEvaluationContext, lance_store: LanceStore):
    """Requests an `ingest` run when files appear (or change) under the source folder
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
