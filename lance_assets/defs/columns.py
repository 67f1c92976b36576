"""Every column asset, made from its library declaration (``lance_assets.table.producer``).

``column_asset(producer)`` is the one factory: the asset takes the producer's name, docstring,
deps, group, kinds and code version, and gets what every column asset has: the ``lance_corpus``
pool, the Ray resource and the ``executor`` setting, ``fragments_per_commit``, the
``ON_NEW_DATA`` automation condition, the declared ``dagster/column_schema``
and column lineage, the shared write metadata (``column_write_metadata``), a data version from
the files holding its columns and the producer's version, and the blocking ``columns_written``
check. The run config is ``ColumnConfig`` plus the producer's own settings, with their help as
descriptions (``defs/config.py``).

The assets are found, not listed: ``producers()`` walks the library for ``PRODUCER``
declarations, so a new column is one library file (docs/write-a-tagger.md).
"""

from typing import Any, Optional

import dagster as dg
import pydantic
from dagster_ray import RayResource

from lance_assets.defs.common import POOL, TABLE_TAGS
from lance_assets.defs.conditions import ON_NEW_DATA
from lance_assets.defs.config import dagster_config, settings_of
from lance_assets.defs.executor import RAY_RESOURCE_DEFS, ExecutorConfig, column_executor
from lance_assets.defs.metadata import column_data_version, column_schema, column_write_metadata
from lance_assets.defs.resources import LanceStore
from lance_assets.defs.table.checks import coverage_check
from lance_assets.markdown import FilePath, Json, Markdown
from lance_assets.progress import phase
from lance_assets.table.producer import ColumnProducer, Skip, produce, producers
from lance_assets.table.settings import InputError, run_config_fields


class ColumnConfig(ExecutorConfig):
    """The knobs every column asset has; a producer's own settings are added to them."""

    fragments_per_commit: Optional[int] = None
    """Fragments per commit. Unset: commits batched by time (every 2 s of work or more, at most
    120 s, and at least 20x the last commit's own time, so commits stay under ~5% of the run as
    the manifest grows); a kill loses at most that group. A number: exactly that many."""


def _camel(name: str) -> str:
    return "".join(part.capitalize() for part in name.split("_"))


def column_config(producer: ColumnProducer) -> type[ColumnConfig]:
    """``ColumnConfig`` plus ``producer``'s settings (``TokenIdsConfig``...); ``ColumnConfig``
    itself for a producer without settings of its own."""
    if not run_config_fields(producer.settings) and producer.fragments_per_commit is None:
        return ColumnConfig
    overrides = {}
    if producer.fragments_per_commit is not None:
        overrides["fragments_per_commit"] = (Optional[int], pydantic.Field(
            default=producer.fragments_per_commit,
            description=ColumnConfig.model_fields["fragments_per_commit"].description))
    return dagster_config(f"{_camel(producer.name)}Config", producer.settings, module=__name__,
                          base=ColumnConfig, **overrides)


def metadata_value(value: Any) -> Any:
    """A producer summary value as Dagster metadata."""
    if isinstance(value, Markdown):
        return dg.MetadataValue.md(value.text)
    if isinstance(value, Json):
        return dg.MetadataValue.json(value.value)
    if isinstance(value, FilePath):
        return dg.MetadataValue.path(value.path)
    return value


def column_asset(producer: ColumnProducer) -> tuple[dg.AssetsDefinition, dg.AssetChecksDefinition]:
    """The asset of ``producer`` and its blocking ``columns_written`` check."""
    config_class = column_config(producer)
    declared = column_schema(producer.fields, producer.descriptions)

    def materialize(context: dg.AssetExecutionContext, config, lance_store: LanceStore,
                    ray_cluster: RayResource) -> dg.MaterializeResult:
        settings = settings_of(producer.settings, config)
        table = lance_store.table
        try:  # never silent for long, whatever the producer logs itself
            with phase(producer.name, context.log.info, announce=False):
                report = produce(producer, table, settings,
                                 executor=column_executor(context, config, ray_cluster),
                                 fragments_per_commit=config.fragments_per_commit,
                                 log=context.log.info)
        except InputError as err:  # wrong settings or files: retrying cannot help
            raise dg.Failure(description=str(err), allow_retries=False) from None
        if isinstance(report, Skip):
            context.log.warning(report.reason)
            version = column_data_version(context, table, declared, salt=producer.version)
            return dg.MaterializeResult(data_version=version, metadata={
                "dagster/uri": table.uri, "lance/table_version": table.newest().version,
                "nothing_to_do": True, "skipped": report.reason})
        # columns named by the data (one per evaluation set): the report says which it wrote
        named = getattr(report, "reported", None)
        reported = declared if named is None else column_schema(
            named.fields, {**producer.descriptions, **named.descriptions})
        owned = named.owned if named is not None else [c.name for c in reported.columns]
        version = column_data_version(context, table, owned, salt=producer.version)
        summary = {}
        if producer.summary is not None:
            with phase(f"{producer.name}: summary", context.log.info, announce=False):
                summary = {k: metadata_value(v)
                           for k, v in producer.summary(table, report).items()}
        lineage = producer.lineage(settings)
        return dg.MaterializeResult(data_version=version, metadata={
            **column_write_metadata(table, report, reported,
                                    {c.name: lineage.get(c.name, [("raw_text", "text")])
                                     for c in reported.columns}),
            **summary,
        })

    materialize.__annotations__["config"] = config_class
    materialize.__name__ = producer.name
    asset = dg.asset(
        name=producer.name, description=producer.doc, deps=[dg.AssetKey(d) for d in producer.deps],
        group_name=producer.group, kinds=set(producer.kinds),
        code_version=producer.version, pool=POOL,
        tags=TABLE_TAGS, metadata={"dagster/column_schema": declared},
        resource_defs=RAY_RESOURCE_DEFS, automation_condition=ON_NEW_DATA,
    )(materialize)
    return asset, coverage_check(asset, producer.not_computed)


COLUMN_ASSETS = {p.name: column_asset(p) for p in producers()}


@dg.definitions
def column_definitions() -> dg.Definitions:
    """Every column asset and its ``columns_written`` check."""
    return dg.Definitions(assets=[a for a, _ in COLUMN_ASSETS.values()],
                          asset_checks=[c for _, c in COLUMN_ASSETS.values()])
