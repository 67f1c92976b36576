"""``no_source_wiped_out``: a warning check on ``curation_rules`` (it does not block training):
the share of every source, and of every domain above a size floor, that each rule removes
(``curation.source_shares``); it warns when one rule removes more than ``max_share`` of a
source's documents or tokens, with the table of shares in its metadata."""

import dagster as dg

from lance_assets.curation import source_shares as lib
from lance_assets.curation.rules import curation_in_force
from lance_assets.defs.common import CURATION_RULES
from lance_assets.defs.conditions import CHECK_ON_ASSET_UPDATE
from lance_assets.defs.config import RunConfig
from lance_assets.defs.resources import LanceStore
from lance_assets.markdown import markdown_table


class SourceCheckConfig(RunConfig):
    max_share: float = lib.DEFAULT_MAX_SHARE
    """Warn when one rule removes more than this share of a source (documents or tokens)."""
    min_domain_documents: int = lib.DEFAULT_MIN_DOMAIN_DOCUMENTS
    """Domains with fewer documents are left out of the table (too small to judge)."""


@dg.asset_check(asset=CURATION_RULES, name="no_source_wiped_out", blocking=False,
                description="No curation rule removes more than a set share (default 90%) of a "
                            "source; the share each rule removes of every source and large "
                            "domain is in the metadata.",
                automation_condition=CHECK_ON_ASSET_UPDATE)
def no_source_wiped_out(config: SourceCheckConfig, lance_store: LanceStore) -> dg.AssetCheckResult:
    ds = lance_store.table.newest()
    shares = lib.rule_shares(ds, curation_in_force(ds).rules, max_share=config.max_share,
                             min_domain_documents=config.min_domain_documents)
    wiped = [f"rule {s.rule} removes {s.document_share:.1%} of the documents and "
             + ("–" if s.token_share is None else f"{s.token_share:.1%}")
             + f" of the tokens of source {s.group}" for s in shares.wiped]
    passed = not wiped
    message = ("; ".join(wiped) + " (check the rule or the source before training)" if wiped
               else f"no rule removes more than {config.max_share:.0%} of a source")
    return dg.AssetCheckResult(
        passed=passed, severity=dg.AssetCheckSeverity.WARN, description=message,
        metadata={"shares": dg.MetadataValue.md(markdown_table(lib.markdown_rows(shares))),
                  "wiped_out": dg.MetadataValue.json([s.to_dict() for s in shares.wiped]),
                  "broken_rules": dg.MetadataValue.json(shares.broken),
                  "domains_below_floor": shares.domains_below_floor,
                  "max_share": config.max_share})
