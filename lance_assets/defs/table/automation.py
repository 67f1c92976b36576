"""The maintenance schedule: `table_maintenance` on a clock of its own, off by default."""

import os

import dagster as dg

from lance_assets.defs.common import TABLE_MAINTENANCE

CRON_ENV = "LANCE_ASSETS_MAINTENANCE_CRON"
DEFAULT_CRON = "30 4 * * *"

table_maintenance_job = dg.define_asset_job(
    "table_maintenance_job", selection=dg.AssetSelection.assets(TABLE_MAINTENANCE),
    description="table_maintenance alone: compaction, cleanup of untagged old versions, index "
                "refresh.")

table_maintenance_schedule = dg.ScheduleDefinition(
    name="table_maintenance_schedule",
    job=table_maintenance_job,
    cron_schedule=os.environ.get(CRON_ENV, DEFAULT_CRON),
    default_status=dg.DefaultScheduleStatus.STOPPED,
    description=f"Runs table_maintenance; cron from ${CRON_ENV} (default '{DEFAULT_CRON}', "
                "after the default ingest at 3:00). Off until switched on.",
)
