"""``training_data_summary``: the public summary of what a training run read, after
``pretrained_model`` (``forensics.summary``; the CLI twin: ``python -m lance_assets summary``)."""

import dagster as dg

from lance_assets.defs.common import PRETRAINED_MODEL
from lance_assets.defs.common import TRAINING_GROUP as GROUP
from lance_assets.defs.conditions import ON_NEW_DATA
from lance_assets.defs.config import RunConfig
from lance_assets.defs.resources import LanceStore
from lance_assets.forensics import summary as lib


class SummaryConfig(RunConfig):
    run: str = ""
    """The run to summarise: a run under DATA/train, or an ablation or mixture arm
    `<ablation>/<arm>`. Empty: the newest `pretrained_model` run."""
    top_share: float = lib.DEFAULT_TOP_SHARE
    """Share of the domain names listed, ranked by bytes of content (the template: 10%)."""
    cap: int = lib.MAX_TOP_DOMAINS
    """At most this many domains in that list (1 to 1,000)."""
    top_n: int = lib.DEFAULT_TOP_N
    """Also the top N domains."""
    provider_name: str = ""
    """The provider placing the model on the market: the table cannot know it (blank: said so)."""
    provider_contact: str = ""
    """The provider's contact (blank: said so)."""
    model_name: str = ""
    """The model's name as published (blank: said so)."""
    model_version: str = ""
    """The model's version as published (blank: said so)."""
    source_kinds: dict[str, str] = {}
    """Source name prefix -> template category (publicly_available_datasets,
    private_third_party_datasets, crawled_and_scraped, user_data, synthetic_data, other); a
    local file set is `other` until declared."""


@dg.asset(deps=[PRETRAINED_MODEL], group_name=GROUP, kinds={"lance", "python"}, code_version="1",
          automation_condition=ON_NEW_DATA)
def training_data_summary(context: dg.AssetExecutionContext, config: SummaryConfig,
                          lance_store: LanceStore) -> dg.MaterializeResult:
    """What the model was trained on, for the public, in the sections of the EU AI Act's
    template (general information, data sources, data processing): documents, tokens and bytes
    per source (with its collection period), per registered domain (the top 10% by size) and
    per language, counted from what the run read (its read records) at the version it pinned;
    the rules in force and what each removed, duplicates, personal data and redaction,
    contamination checks, opt-out lists with their digests, and the forget requests since the
    previous run. Counts only: no document text, no url beyond its domain. Also
    DATA/reports/training_data_summary/<run>.md and .json."""
    declared = lib.Declared(provider_name=config.provider_name,
                            provider_contact=config.provider_contact,
                            model_name=config.model_name, model_version=config.model_version,
                            source_kinds=dict(config.source_kinds))
    try:
        got = lib.summarize(lance_store.table, config.run or None, top_share=config.top_share,
                            cap=config.cap, top_n=config.top_n, declared=declared)
    except lib.SummaryError as err:
        raise dg.Failure(description=str(err), allow_retries=False) from None
    text = lib.markdown(got)
    md_path, json_path = lib.save(lance_store.table, got, text)
    size, run = got["general_information"]["training_data_size"], got["run"]
    if run["snapshot"]["state"] != "readable":
        context.log.warning(run["snapshot"]["note"])
    return dg.MaterializeResult(metadata={
        "summary": dg.MetadataValue.md(text),
        "summary_json": dg.MetadataValue.json(got),
        "summary_path": dg.MetadataValue.path(md_path),
        "summary_json_path": dg.MetadataValue.path(json_path),
        "run": run["name"],
        "lance/table_version": run["table_version"],
        "snapshot": run["snapshot"]["state"],
        "documents_read": size["documents_read"],
        "tokens": size["tokens"] if size["tokens"] is not None else -1,
        "bytes": size["bytes"],
        "sources": len(got["data_sources"]["sources"]),
        "domains": got["data_sources"]["crawled_domains"]["domains"],
        "duration_s": run["computed_in_s"],
    })
