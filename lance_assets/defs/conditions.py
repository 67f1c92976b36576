"""Declarative automation: which assets Dagster materializes by itself, and when.

The ``ingest_schedule`` (or the ``landing_sensor``) runs ``raw_text``; everything after that is
declared on the assets and evaluated by the ``corpus_automation`` sensor:

- ``ON_NEW_DATA`` (every column asset, index, report and curation): request the asset when the
  data version of one of its upstream assets changed (a no-op run keeps its data version, so it
  triggers nothing), when none of its upstream assets is missing or running, and when the
  blocking checks of its upstream assets passed. Upstream assets requested in the same tick count
  as changed, so one ingest brings the whole chain in one run, in dependency order.
- ``CHECK_ON_ASSET_UPDATE`` (asset checks): run whenever their asset materializes, in the same
  run when both are requested together (so a blocking check stops what follows it).
- ``pretrained_model`` carries ``ON_NEW_DATA`` only when ``LANCE_ASSETS_AUTO_TRAIN=1``; without
  it training starts only by hand. Its checks and ``samples``/``forensics`` follow a training run.

A new column asset takes ``automation_condition=ON_NEW_DATA`` and reports
``data_version=column_data_version(...)`` (``defs/metadata.py``).
"""

from __future__ import annotations

import os

import dagster as dg

AUTO_TRAIN_ENV = "LANCE_ASSETS_AUTO_TRAIN"
AC = dg.AutomationCondition


def any_deps_data_changed() -> dg.AutomationCondition:
    """An upstream asset has a new data version since the last tick (not from a run that also
    ran this asset), or is requested on this tick."""
    return AC.any_deps_match(
        (AC.data_version_changed() & ~AC.executed_with_root_target()).with_label(
            "data_version_changed_without_root")
        | AC.will_be_requested()
    ).with_label("any_deps_data_changed")


def deps_checks_passed_or_requested() -> dg.AutomationCondition:
    """Every upstream asset's blocking checks passed, or that asset is requested on this tick.

    Dagster's ``all_deps_blocking_checks_passed`` admits checks requested on this tick, but a
    check sits one level below its asset, the same level as the asset's children, so the
    children are evaluated before they can see it requested (every column asset's blocking
    ``columns_written`` check would split one ingest's chain into one run per level). An
    upstream asset requested on this tick has its checks requested with it
    (``CHECK_ON_ASSET_UPDATE``), in the same run, where a failing blocking check stops what
    follows it."""
    return AC.all_deps_match(
        AC.will_be_requested()
        | AC.all_checks_match(AC.check_passed() | AC.will_be_requested(), blocking_only=True)
    ).with_label("all_deps_blocking_checks_passed_or_requested")


def on_new_data(ignore: dg.AssetSelection | None = None) -> dg.AutomationCondition:
    """Dagster's ``eager()`` with data versions instead of materializations as the trigger, and
    upstream blocking checks respected; ``ignore``: upstream assets whose changes do not
    trigger this one."""
    changed = any_deps_data_changed()
    if ignore is not None:
        changed = changed.ignore(ignore)
    return (
        (AC.newly_missing() | changed).since_last_handled()
        & ~AC.any_deps_missing()
        & ~AC.any_deps_in_progress()
        & ~AC.in_progress()
        & deps_checks_passed_or_requested()
    ).with_label("on_new_data")


ON_NEW_DATA = on_new_data()
CHECK_ON_ASSET_UPDATE = AC.eager()


def auto_train() -> bool:
    value = os.environ.get(AUTO_TRAIN_ENV, "").strip().lower()
    if value not in ("", "0", "1", "false", "true", "no", "yes"):
        raise ValueError(f"{AUTO_TRAIN_ENV}={value!r} is not a yes/no value: set it to 1 to let "
                         "automation start training after new data, or unset it")
    return value in ("1", "true", "yes")


def training_condition() -> dg.AutomationCondition | None:
    """``ON_NEW_DATA`` when ``LANCE_ASSETS_AUTO_TRAIN`` says so, else none: training is started
    by a person (or a job they launch), never by new rows alone."""
    return ON_NEW_DATA if auto_train() else None


corpus_automation_sensor = dg.AutomationConditionSensorDefinition(
    "corpus_automation",
    target=dg.AssetSelection.all(),
    default_status=dg.DefaultSensorStatus.RUNNING,
    minimum_interval_seconds=30,
    description="Evaluates the assets' automation conditions every 30 s: after raw_text brings "
                "new rows, every column asset, index, report and the curation rules (with their "
                "checks) follow in one run; pretrained_model only with LANCE_ASSETS_AUTO_TRAIN=1. "
                "Reacts only to new materializations, so a fresh instance starts nothing.",
)
