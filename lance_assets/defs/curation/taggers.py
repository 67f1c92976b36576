"""Curation taggers: one column asset per signal, each a thin wrapper over one library module
(Dolma's shape: taggers write attributes beside the documents, ``curation_rules`` mixes them).

``detected_language`` (``corpus.language``), ``personal_data`` (``corpus.pii``),
``paragraph_dups`` (``corpus.para_dup``), ``contamination`` (``corpus.contamination``) and
``quality_score`` (``corpus.quality_model``). Every one writes through ``write_columns``, takes
the ``lance_corpus`` pool, runs on Ray when asked, and reports the same stats block: rows
written, fragments, duration, rows/s (``column_write_metadata``), plus its own counts.
"""

from typing import Optional

import dagster as dg
from dagster_ray import RayResource

from lance_assets.curation import contamination as contamination_lib
from lance_assets.curation import detected_language as language
from lance_assets.curation import paragraph_dups as para_dup
from lance_assets.curation import personal_data as pii
from lance_assets.curation import quality_score as quality_model_lib
from lance_assets.defs.common import CURATION_GROUP as GROUP
from lance_assets.defs.common import EMBEDDINGS, POOL, RAW_TEXT, TABLE_TAGS
from lance_assets.defs.conditions import ON_NEW_DATA
from lance_assets.defs.executor import RAY_RESOURCE_DEFS, ExecutorConfig, column_executor
from lance_assets.defs.metadata import column_data_version, column_schema, column_write_metadata
from lance_assets.defs.resources import LanceStore
from lance_assets.markdown import markdown_table
from lance_assets.table import Table

LANGUAGE_COLUMNS = column_schema(language.FIELDS, language.DESCRIPTIONS)
PII_COLUMNS = column_schema(pii.FIELDS, pii.DESCRIPTIONS)
PARAGRAPH_DUPS_COLUMNS = column_schema(para_dup.FIELDS, para_dup.DESCRIPTIONS)
CONTAMINATION_COLUMNS = column_schema(contamination_lib.UNION_FIELDS, contamination_lib.DESCRIPTIONS)
QUALITY_SCORE_COLUMNS = column_schema([quality_model_lib.QUALITY_SCORE],
                                      quality_model_lib.DESCRIPTIONS)
FROM_TEXT = [("raw_text", "text")]


class TaggerConfig(ExecutorConfig):
    fragments_per_commit: Optional[int] = None
    """Fragments per commit. Unset: commits batched by time (every 2 s of work or more, at most
    120 s, and at least 20x the last commit's own time, so commits stay under ~5% of the run as
    the manifest grows); a kill loses at most that group. A number: exactly that many."""


def _count(table: Table, predicate: str) -> int:
    """Rows matching a fixed predicate of ours (never user text)."""
    return table.newest().count_rows(filter=predicate)


@dg.asset(deps=[RAW_TEXT], group_name=GROUP, kinds={"lance", "python"}, code_version="1",
          pool=POOL, tags=TABLE_TAGS, metadata={"dagster/column_schema": LANGUAGE_COLUMNS},
          resource_defs=RAY_RESOURCE_DEFS, automation_condition=ON_NEW_DATA)
def detected_language(context: dg.AssetExecutionContext, config: TaggerConfig,
                      lance_store: LanceStore, ray_cluster: RayResource):
    """`lang` (ISO 639-1 code, 'und' when undetermined) and `lang_score` (share of the text in
    that language), detected by CLD2 from `text` on every row, offline (the model is inside the
    pycld2 wheel). Not the source's own `language` label. `curation_rules` keeps the corpus's
    main languages by default."""
    report = language.language_id(lance_store.root, fragments_per_commit=config.fragments_per_commit,
                                  executor=column_executor(context, config, ray_cluster),
                                  log=context.log.info)
    table = lance_store.table
    shares = language.language_shares(table.newest())
    version = column_data_version(context, table, LANGUAGE_COLUMNS)
    return dg.MaterializeResult(data_version=version, metadata={
        **column_write_metadata(table, report, LANGUAGE_COLUMNS,
                                {c: FROM_TEXT for c in language.DESCRIPTIONS}),
        "languages": dg.MetadataValue.md(markdown_table(shares[:15])),
        "distinct_languages": len(shares),
    })


@dg.asset(deps=[RAW_TEXT], group_name=GROUP, kinds={"lance", "python"}, code_version="1",
          pool=POOL, tags=TABLE_TAGS, metadata={"dagster/column_schema": PII_COLUMNS},
          resource_defs=RAY_RESOURCE_DEFS, automation_condition=ON_NEW_DATA)
def personal_data(context: dg.AssetExecutionContext, config: TaggerConfig,
                  lance_store: LanceStore, ray_cluster: RayResource):
    """Personal data in `text`: counts of e-mail addresses, phone numbers, IP addresses and
    Luhn-checked payment card numbers (`pii_*_count`), and their character spans (`pii_spans`).
    The text never changes; `token_ids` with `redact_pii: true` tokenizes it with the spans
    replaced by placeholders."""
    report = pii.pii(lance_store.root, fragments_per_commit=config.fragments_per_commit,
                     executor=column_executor(context, config, ray_cluster), log=context.log.info)
    table = lance_store.table
    counts = {f"rows_with_{kind}": _count(table, f"{field.name} > 0")
              for kind, field in pii.COUNT_FIELDS.items()}
    version = column_data_version(context, table, PII_COLUMNS)
    return dg.MaterializeResult(data_version=version, metadata={
        **column_write_metadata(table, report, PII_COLUMNS, {c: FROM_TEXT for c in pii.COLUMNS}),
        **counts,
    })


@dg.asset(deps=[RAW_TEXT], group_name=GROUP, kinds={"lance", "numpy"}, code_version="1",
          pool=POOL, tags=TABLE_TAGS, metadata={"dagster/column_schema": PARAGRAPH_DUPS_COLUMNS},
          resource_defs=RAY_RESOURCE_DEFS, automation_condition=ON_NEW_DATA)
def paragraph_dups(context: dg.AssetExecutionContext, config: TaggerConfig,
                   lance_store: LanceStore, ray_cluster: RayResource):
    """`dup_paragraph_frac`: the share of a document's paragraph characters in paragraphs
    (normalised, hashed) that appeared in an earlier document, and `paragraph_hashes`, the
    state later runs match new documents against. Order-dependent: hashing runs per fragment
    (Ray tasks when asked), the comparison in id order; values already written never change."""
    report, stats = para_dup.paragraph_dups(
        lance_store.root, fragments_per_commit=config.fragments_per_commit,
        executor=column_executor(context, config, ray_cluster), log=context.log.info)
    table = lance_store.table
    version = column_data_version(context, table, PARAGRAPH_DUPS_COLUMNS)
    return dg.MaterializeResult(data_version=version, metadata={
        **column_write_metadata(table, report, PARAGRAPH_DUPS_COLUMNS, {
            "dup_paragraph_frac": [("raw_text", "text"), ("raw_text", "id")],
            "paragraph_hashes": FROM_TEXT}),
        "new_rows_with_repeated_paragraphs": stats.get("with_repeated_paragraphs", 0),
        "rows_with_half_repeated": _count(table, "dup_paragraph_frac >= 0.5"),
    })


class EvalSetConfig(dg.Config):
    name: str
    """A lowercase identifier (it names the set's column: contam_<name>_<fingerprint>)."""
    path: str
    """A .jsonl, .jsonl.gz or .parquet file (local path, or s3:// gs:// az://)."""
    text_field: str = "text"
    """The field holding each item's text."""


class ContaminationConfig(TaggerConfig):
    eval_sets: list[EvalSetConfig] = []
    """The evaluation sets to check the corpus against. A set added later is checked over the
    whole table; new rows are checked against every set."""


@dg.asset(deps=[RAW_TEXT], group_name=GROUP, kinds={"lance", "numpy"}, code_version="1",
          pool=POOL, tags=TABLE_TAGS, metadata={"dagster/column_schema": CONTAMINATION_COLUMNS},
          resource_defs=RAY_RESOURCE_DEFS, automation_condition=ON_NEW_DATA)
def contamination(context: dg.AssetExecutionContext, config: ContaminationConfig,
                  lance_store: LanceStore, ray_cluster: RayResource):
    """Benchmark contamination: `contaminated` (bool) and `contaminated_with` (set names) mark
    every document that shares a normalised word 13-gram with a registered evaluation set; one
    `contam_<name>_<fingerprint>` column per set makes new sets and new rows incremental. A
    blocking check on `curation_rules` stops training while a kept row is contaminated."""
    specs = [contamination_lib.EvalSetSpec(s.name, s.path, s.text_field) for s in config.eval_sets]
    try:
        report = contamination_lib.contamination(
            lance_store.root, specs, fragments_per_commit=config.fragments_per_commit,
            executor=column_executor(context, config, ray_cluster), log=context.log.info)
    except contamination_lib.EvalSetError as err:
        raise dg.Failure(description=str(err), allow_retries=False) from None
    table = lance_store.table
    ds = table.newest()
    descriptions = {**contamination_lib.DESCRIPTIONS, **contamination_lib.set_column_descriptions(ds)}
    written = set(report.new_columns) | {f.name for f in contamination_lib.UNION_FIELDS
                                         if report.union and not report.union.nothing_to_do}
    if not written:  # a no-op run reports the columns it owns
        written = {f.name for f in contamination_lib.UNION_FIELDS}
    fields = [f for f in ds.schema if f.name in written]
    union = report.union
    # what it owns: the per-set columns of the registered sets and the union over them
    owned = [f.name for f in contamination_lib.UNION_FIELDS] + [s["column"] for s in report.sets]
    version = column_data_version(context, table, owned)
    return dg.MaterializeResult(data_version=version, metadata={
        **column_write_metadata(table, union, column_schema(fields, descriptions),
                                {f.name: FROM_TEXT for f in fields}),
        "nothing_to_do": report.nothing_to_do,
        "rows_written": sum(r.rows_written for r in [*report.per_set, union]),
        "eval_sets": dg.MetadataValue.md(markdown_table([
            {**{k: s[k] for k in ("name", "column", "items", "items_too_short", "ngrams")},
             "rows": report.rows_by_set.get(s["name"], 0)} for s in report.sets])
            if report.sets else "no evaluation sets registered"),
        "contaminated_rows": report.contaminated_rows,
        "registry_changed": report.registry_changed,
        "new_set_columns": dg.MetadataValue.json(report.new_columns),
    })


class QualityScoreConfig(TaggerConfig):
    label: str = "score"
    """The numeric column to learn from (FineWeb-Edu's `score`, 0-5)."""
    threshold: float = 3.0
    """`label >= threshold` is the positive class for accuracy / F1 (FineWeb-Edu uses 3)."""
    ridge: float = 1.0
    """L2 penalty of the ridge regression."""
    retrain: bool = False
    """Train again on the labelled rows of now; a different model re-scores every row."""


@dg.asset(deps=[RAW_TEXT, EMBEDDINGS], group_name=GROUP, kinds={"lance", "numpy"},
          code_version="1", pool=POOL, tags=TABLE_TAGS,
          metadata={"dagster/column_schema": QUALITY_SCORE_COLUMNS},
          resource_defs=RAY_RESOURCE_DEFS, automation_condition=ON_NEW_DATA)
def quality_score(context: dg.AssetExecutionContext, config: QualityScoreConfig,
                  lance_store: LanceStore, ray_cluster: RayResource):
    """`quality_score` (float32): a linear (ridge) head on `embedding` trained on the rows that
    carry a label (FineWeb-Edu's `score`), the FineWeb-Edu recipe. A tenth of the labelled rows,
    chosen by id hash, is held out: its MAE, accuracy, precision, recall and F1 at the threshold
    are shown here. The model is DATA/models/quality/<sha256>.json, named in the table's config;
    later runs score new rows with it."""
    report = quality_model_lib.quality_score(
        lance_store.root, label=config.label, threshold=config.threshold, ridge=config.ridge,
        retrain=config.retrain, fragments_per_commit=config.fragments_per_commit,
        executor=column_executor(context, config, ray_cluster), log=context.log.info)
    table = lance_store.table
    if report.write is None:
        context.log.warning(report.skipped)
        return dg.MaterializeResult(data_version=column_data_version(
            context, table, QUALITY_SCORE_COLUMNS), metadata={
            "dagster/uri": table.uri, "lance/table_version": table.newest().version,
            "nothing_to_do": True, "skipped": report.skipped})
    held = report.model.get("heldout", {})
    model_file = f"models/quality/{report.model['sha256']}.json"
    version = column_data_version(context, table, QUALITY_SCORE_COLUMNS)
    return dg.MaterializeResult(data_version=version, metadata={
        **column_write_metadata(table, report.write, QUALITY_SCORE_COLUMNS, {
            "quality_score": [("embeddings", "embedding"), ("raw_text", config.label)]
            if config.label == "score" else [("embeddings", "embedding")]}),
        "trained": report.trained,
        "model_sha256": report.model["sha256"],
        "model_file": dg.MetadataValue.path(str(lance_store.root / model_file)),
        "heldout_rows": held.get("rows", 0),
        "heldout_mae": held.get("mae"),
        "heldout_mae_of_mean_baseline": held.get("mae_of_mean_baseline"),
        "heldout_accuracy": held.get("accuracy"),
        "heldout_f1": held.get("f1"),
        "metrics": dg.MetadataValue.md(markdown_table([
            {"split": name, **report.model.get(name, {})} for name in ("train", "heldout")])),
    })


TAGGERS = [detected_language, personal_data, paragraph_dups, contamination, quality_score]
