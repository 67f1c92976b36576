"""Forensics assets: ``text_index`` (the full-text index), then ``forensics`` (with
``samples`` and the vector indexes of ``defs/embeddings``), then ``document_stories`` (one
document's whole story per looked-up id).

``text_index`` writes the corpus table and takes the ``lance_corpus`` pool; ``forensics`` only
reads (the rows of the table version the newest model trained on).
"""

import dataclasses

import dagster as dg

from lance_assets import paths
from lance_assets.defs.common import (
    CHUNK_INDEX,
    CURATION_ABLATION,
    CURATION_RULES,
    POOL,
    RAW_TEXT,
    SAMPLES,
    TABLE_TAGS,
    TEXT_INDEX,
    VECTOR_INDEX,
)
from lance_assets.defs.common import FORENSICS_GROUP as GROUP
from lance_assets.defs.conditions import ON_NEW_DATA, on_new_data
from lance_assets.defs.config import RunConfig
from lance_assets.defs.metadata import (
    data_version,
    index_data_version,
)
from lance_assets.defs.resources import LanceStore
from lance_assets.forensics import text_index as fts
from lance_assets.markdown import markdown_table
from lance_assets.progress import phase
from lance_assets.table.fingerprint import digest


class TextIndexConfig(RunConfig):
    example_query: str = "telescope"
    """A keyword query whose best matches (ids and scores: metadata never quotes a document,
    since `forget` cannot erase the instance's records) are shown in the metadata."""


@dg.asset(deps=[RAW_TEXT], group_name=GROUP, kinds={"lance"}, code_version="1", pool=POOL,
          tags=TABLE_TAGS, automation_condition=ON_NEW_DATA)
def text_index(context: dg.AssetExecutionContext, config: TextIndexConfig, lance_store: LanceStore):
    """Lance full-text (BM25 inverted) index `text_fts` on `text`. The first run builds it; later
    runs add only the rows appended since. Query: `Table.of(root).newest().to_table(
    full_text_query="telescope", limit=10)` or `lance_assets.forensics.text_index.search`."""
    report = fts.text_index(lance_store.table, log=context.log.info)
    hits = fts.search(lance_store.table, config.example_query, limit=5, columns=("id",))
    example = [{"id": r["id"], "score": round(r["_score"], 3)} for r in hits.to_pylist()]
    version = index_data_version(context, lance_store.table, fts.INDEX_NAME)
    return dg.MaterializeResult(data_version=version, metadata={
        "dagster/uri": lance_store.table.uri,
        "lance/table_version": report.version,
        "index_name": fts.INDEX_NAME,
        "action": report.action,
        "nothing_to_do": report.nothing_to_do,
        "indexed_rows": report.indexed_rows,
        "unindexed_rows": report.unindexed_rows,
        "duration_s": round(report.duration_s, 3),
        "example_query": config.example_query,
        "example_results": dg.MetadataValue.md(markdown_table(example)),
    })


class ForensicsConfig(RunConfig):
    k: int = 5
    """Training documents listed per sample."""
    near_dup_threshold: float = 0.95
    """Cosine similarity at or above which two documents count as semantic near-duplicates."""
    near_dup_sample: int = 2000
    """Documents sampled for the near-duplicate pairs (all pairs of the sample are compared)."""


# After each new set of samples; the indexes it searches change with every ingest, which does
# not change what the samples drew on (the table version the model trained on).
@dg.asset(deps=[SAMPLES, VECTOR_INDEX, CHUNK_INDEX, TEXT_INDEX],
          group_name=GROUP, kinds={"lance", "python"}, code_version="1", tags=TABLE_TAGS,
          automation_condition=on_new_data(
              ignore=dg.AssetSelection.assets(VECTOR_INDEX, CHUNK_INDEX, TEXT_INDEX)))
def forensics(context: dg.AssetExecutionContext, config: ForensicsConfig,
              lance_store: LanceStore):
    """Where did each generated sample come from? Every sample of `samples` is attributed to the
    training documents it most likely draws on (word spans shared whatever the layout, plus
    meaning over whole documents from `chunk_embeddings`) with a verdict (near-verbatim, edited
    copy or remixed) and the matched character ranges of both texts; semantic near-duplicate
    pairs of the corpus are added. Reads the table version the model trained on. Also
    DATA/reports/forensics.md and .json."""
    from lance_assets.forensics.report import forensics_report

    report = forensics_report(lance_store.table, k=config.k,
                              near_dup_threshold=config.near_dup_threshold,
                              near_dup_sample=config.near_dup_sample, log=context.log.info)
    nd = report.near_dups
    version = data_version(context, report.pin.version, digest(report.markdown()))
    return dg.MaterializeResult(data_version=version, metadata={
        "dagster/uri": lance_store.table.uri,
        "lance/table_version": report.pin.version,
        "pinned": report.pin.source,
        "checkpoint": report.checkpoint or "",
        "report": dg.MetadataValue.md(report.markdown(quote=False)),
        "report_path": dg.MetadataValue.path(
            str(paths.reports_dir(lance_store.root) / "forensics.md")),
        "samples": len(report.attributions),
        "verdicts": dg.MetadataValue.json(report.verdicts),
        "near_dup_pair_rate": nd.pair_rate if nd else -1.0,
        "near_dup_rows_share": nd.rows_with_neighbour_share if nd else -1.0,
        "duration_s": round(report.duration_s, 3),
    })


MAX_STORIES = 50


def _unquoted(story) -> str:
    """A story as the instance keeps it: verdicts, clusters and runs by id, never what
    identifies or quotes the document (url, source, signal values, matched spans). The instance
    cannot be edited by ``forget``; the story's files hold the rest, and ``forget`` removes
    them."""
    return dataclasses.replace(
        story, document={}, signals={},
        samples=[{k: v for k, v in s.items() if k != "span"} for s in story.samples]
    ).markdown(quote=False)


class StoriesConfig(RunConfig):
    ids: list[int] = []
    """Documents to explain, by `id`. Empty: the top source of each forensics sample and the
    first document the curation rules remove."""
    version: str = ""
    """Table version number or snapshot tag to read the signals and rule verdicts at (empty:
    the newest). Runs and ablation arms are always judged at their own tagged versions."""


@dg.asset(deps=[forensics, CURATION_RULES, CURATION_ABLATION], group_name=GROUP,
          kinds={"lance", "python"}, code_version="1")
def document_stories(context: dg.AssetExecutionContext, config: StoriesConfig,
                     lance_store: LanceStore):
    """Why is this document in, or out? For each looked-up document (`ids` in the run config):
    every signal, each rule in force with its verdict and the ones that removed it, its exact,
    near and semantic duplicate clusters and the member kept, contamination, every tagged
    snapshot, training run and ablation arm that read it (judged at their tagged versions) and
    the generated samples attributed to it; one metadata entry per document, also
    DATA/reports/stories/<id>.md and .json. The CLI twin: python -m lance_assets explain --id N."""
    from lance_assets.forensics import explain as ex

    if len(config.ids) > MAX_STORIES:
        raise dg.Failure(f"ids: {len(config.ids)} documents; explain at most {MAX_STORIES} per "
                         "run (the rest in another run, or with python -m lance_assets explain)")
    ref = config.version.strip() or None
    ids = list(dict.fromkeys(config.ids)) or ex.example_ids(lance_store.table)
    metadata, rows = {}, []
    for doc_id in ids:
        try:
            with phase(f"document_stories: document {doc_id}", context.log.info, announce=False):
                story = ex.explain(lance_store.table, doc_id, ref=ref)
        except ex.ExplainError as err:
            raise dg.Failure(str(err)) from None
        md_path, _ = ex.save(lance_store.table, story)
        context.log.info(story.headline())
        metadata[f"document_{doc_id}"] = dg.MetadataValue.md(_unquoted(story))
        rows.append({"id": doc_id, "in version": story.present,
                     "removed by": ", ".join(story.removed_by) or "",
                     "trained on by": ", ".join(s.name for s in story.trained_by),
                     "samples attributed": len(story.samples), "story": md_path})
    return dg.MaterializeResult(metadata={
        "dagster/uri": lance_store.table.uri,
        "documents": dg.MetadataValue.md(markdown_table(rows)),
        "ids": dg.MetadataValue.json(ids),
        **metadata,
    })
