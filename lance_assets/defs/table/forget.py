"""``forget``: a job that removes documents for good (``corpus.forget``), for a privacy or
takedown request. Not an asset: it materializes nothing; its report is the op's output
metadata and a line of ``<data>/forget.log.jsonl``."""

import dagster as dg

from lance_assets.defs.config import RunConfig
from lance_assets.defs.resources import LanceStore
from lance_assets.table.forget import MAX_SHARE, ForgetError, forget


class ForgetConfig(RunConfig):
    where: str
    """Which documents: a predicate over the table's columns (the curation rules' parser), e.g.
    `url = 'https://example.com/page'` or `id IN (17, 42)`. The instance keeps a run's config:
    name documents by id or url here, never by a passage of their text (`python -m lance_assets
    forget` keeps no record of the predicate but its sha256)."""
    force: bool = False
    """Redact (or release) the snapshots that hold them even while a training run still reads
    one (that run then fails). Without it, the job refuses and names the run."""
    dry_run: bool = False
    """Report how many documents would go, a few of their urls and the snapshots it would
    redact or release; change nothing."""
    max_share: float = MAX_SHARE
    """Refuse when the documents (matched in any version on disk) are more than this share of
    the most rows a version on disk holds."""
    allow_all: bool = False
    """Allow a predicate that matches every row of the table."""
    release: list[str] = []
    """Snapshots holding a document being forgotten to release whole instead of redacting them.
    Every other holder (the project's `train-*` and `ablation-*`, and a user's) is redacted: its
    tag names a copy with every other row."""


@dg.op(tags={"lance_assets/table": "corpus"}, out=dg.Out(dg.Nothing))
def forget_documents(context: dg.OpExecutionContext, config: ForgetConfig,
                     lance_store: LanceStore):
    """Delete the documents, redact every snapshot that held them (naming the runs, checkpoints
    and ablations behind each; one that `release` names is released instead), compact and
    clean up so that no version on disk reads them, then check that none does."""
    try:
        report = forget(lance_store.table, config.where, force=config.force,
                        dry_run=config.dry_run, max_share=config.max_share,
                        allow_all=config.allow_all, release=config.release,
                        log=context.log.info)
    except ForgetError as e:
        raise dg.Failure(str(e)) from None
    if report.still_readable or report.still_in_files:
        raise dg.Failure(f"{report.still_readable} forgotten document(s) are still readable "
                         f"and {report.still_in_files} fragment(s) keep some in their data "
                         "files; see the log, then run forget again")
    yield dg.Output(None, metadata={
        "summary": dg.MetadataValue.md(report.markdown()),
        "documents": report.ids,
        "rows_deleted": report.rows_deleted,
        "snapshots_released": dg.MetadataValue.json(report.released),
        "snapshots_redacted": dg.MetadataValue.json(report.redacted),
        "runs": dg.MetadataValue.json(report.runs),
        "holders": dg.MetadataValue.json([vars(h) for h in report.holders]),
        "versions_removed": report.versions_removed,
        "still_readable": report.still_readable,
        "still_in_files": report.still_in_files,
        "dry_run": report.dry_run,
        "resumed": dg.MetadataValue.json(report.resumed),
        "lance/table_version": report.version_after,
    })


@dg.job(description="Remove documents for good: delete them, redact the snapshots that hold "
                    "them, compact and clean up (python -m lance_assets forget is the same).")
def forget_job():
    forget_documents()
