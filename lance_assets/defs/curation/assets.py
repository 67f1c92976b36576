"""Curation assets: ``curation_rules`` and ``corpus_profile``. The taggers (``quality_signals``,
``near_dup``, ``dedup_flag`` ...) are column producers under ``curation/``, made into assets by
``defs/columns.py``.

``curation_rules`` records the rules in the table's config; ``corpus_profile`` only reads.
Assets of other domains are referenced by their keys (``defs/common.py``).
"""

from pathlib import Path

import dagster as dg

from lance_assets import paths, storage
from lance_assets.curation import minhash, profile
from lance_assets.curation import near_dup as near_dup_lib
from lance_assets.curation import rules as rules_lib
from lance_assets.curation import sweeps as sweeps_lib
from lance_assets.defs.common import CURATION_GROUP as GROUP
from lance_assets.defs.common import (
    DEDUP_FLAG,
    FINEWEB_GROUP,
    POOL,
    TABLE_TAGS,
    TOKEN_IDS,
)
from lance_assets.defs.conditions import ON_NEW_DATA
from lance_assets.defs.config import RunConfig
from lance_assets.defs.metadata import (
    column_schema,
    data_version,
)
from lance_assets.defs.resources import LanceStore
from lance_assets.markdown import markdown_table, png_markdown
from lance_assets.progress import phase
from lance_assets.table.fingerprint import digest
from lance_assets.table.producer import producers

NEAR_DUP_COLUMNS = column_schema(near_dup_lib.fields(minhash.MinHashSettings()),
                                 near_dup_lib.DESCRIPTIONS)


CONFIGURED_RULES = rules_lib.configured_rules()


class CurationConfig(RunConfig):
    rules: dict[str, str] = dict(CONFIGURED_RULES)
    """name -> SQL predicate a document must satisfy to be trained on: one boolean expression over
    the table's columns (comparisons, AND/OR/NOT, BETWEEN, IN, IS NULL, LIKE, arithmetic,
    length/lower/upper/abs/coalesce); anything else is refused before it is stored. Defaults:
    the file named by $LANCE_ASSETS_RULES, else Gopher, C4 and FineWeb thresholds plus both
    dedup flags."""
    min_duplicate_rate: float = 0.0
    max_duplicate_rate: float = 0.5
    """Bounds on the share of rows flagged `is_dup OR near_dup` (blocking check)."""
    min_kept_rows: int = 1
    """The training filter must keep at least this many rows (blocking check)."""
    keep_languages: list[str] = ["auto"]
    """Adds the rule `main_language: lang IN (...)`: `["auto"]` keeps the corpus's main
    languages (each detected on at least `main_language_min_share` of the rows), a list of codes
    (`["en", "fr"]`) keeps those, `[]` adds no language rule."""
    main_language_min_share: float = rules_lib.DEFAULT_MAIN_LANGUAGE_MIN_SHARE
    """With `keep_languages: ["auto"]`: the share of rows a language needs to count as main."""
    main_language_min_score: float = 0.0
    """Least `lang_score` (fastText lid.176's probability of `lang`) a document needs to pass
    `main_language`; 0: no bound. FineWeb keeps English at lang_score >= 0.65."""
    drop_contaminated: bool = True
    """Adds the rule `not_contaminated: NOT contaminated` (benchmark contamination)."""


# Training waits only for what its rules read: the producers whose columns the configured rules
# (and the taggers' own rules: `lang`, `contaminated`, `opted_out`) name are upstream of `curation_rules`, so
# `*pretrained_model` runs them; the other signals (opt-in taggers, the embedding-based ones)
# are off that path and keep up with new rows through automation. A rule set at run time that
# names one of them is held by the blocking check `rule_columns_written` until it is written.
TAGGER_COLUMNS = frozenset({"lang", "contaminated", "opted_out"})
# corpus_profile (off the training path) profiles every signal of the curation and fineweb groups
TAGGER_DEPS = [dg.AssetKey(p.name) for p in producers() if p.group in (GROUP, FINEWEB_GROUP)]
_WRITERS = {f.name: p for p in producers() for f in p.fields}
RULE_DEPS = sorted({dg.AssetKey(_WRITERS[c].name) for c in
                    rules_lib.rule_columns(CONFIGURED_RULES, frozenset(_WRITERS)) | TAGGER_COLUMNS
                    if c in _WRITERS}, key=str)


@dg.asset(deps=sorted({DEDUP_FLAG, TOKEN_IDS, *RULE_DEPS}, key=str), group_name=GROUP,
          kinds={"lance", "sql"}, code_version="3", pool=POOL, tags=TABLE_TAGS,
          automation_condition=ON_NEW_DATA)
def curation_rules(context: dg.AssetExecutionContext, config: CurationConfig,
                   lance_store: LanceStore):
    """The curation rules in force: named SQL predicates over columns, joined with AND into the
    training filter that `pretrained_model` applies. Each rule is parsed into one expression over
    the table's columns and checked by Lance before anything is recorded: a broken rule fails
    this asset, naming the rule and the fix, and nothing is stored. Recorded in the table's
    config; each rule's hit count (rows it removes, and rows only it removes) is in the metadata.
    The taggers add their rules: the corpus's main languages (`lang`) and `NOT contaminated`.
    Blocking checks (rules parse, filter keeps rows, tokens present and consistent, duplicate
    rate in bounds, no contaminated row kept) stop training when they fail."""
    try:
        with phase("curation_rules: checking and counting the rules", context.log.info,
                   announce=False):
            done = rules_lib.put_in_force(
                lance_store.table, dict(config.rules), keep_languages=config.keep_languages,
                main_language_min_share=config.main_language_min_share,
                main_language_min_score=config.main_language_min_score,
                drop_contaminated=config.drop_contaminated,
                min_duplicate_rate=config.min_duplicate_rate,
                max_duplicate_rate=config.max_duplicate_rate,
                min_kept_rows=config.min_kept_rows)
    except rules_lib.RulesRefused as err:
        raise dg.Failure(description=str(err), allow_retries=False,
                         metadata={"broken_rules": dg.MetadataValue.json(err.broken),
                                   "stored": False}) from None
    except rules_lib.RuleError as err:  # a tagger's rule cannot be made (keep_languages)
        raise dg.Failure(description=str(err), allow_retries=False) from None
    for note in done.notes:
        context.log.info(note)
    ev = done.evaluation
    # its output is the rules in force: the data version changes when they do
    stored = data_version(context, done.version, digest(done.curation.to_dict()))
    return dg.MaterializeResult(data_version=stored, metadata={
        "dagster/uri": lance_store.table.uri,
        "lance/table_version": done.version,
        "dagster/row_count": ev.total_rows,
        "rules": dg.MetadataValue.md(markdown_table(ev.rows())),
        "training_filter": dg.MetadataValue.md(f"```sql\n{ev.filter}\n```"),
        "kept_rows": ev.kept_rows if ev.kept_rows is not None else -1,
        "kept_share": round(ev.kept_share, 4),
        "broken_rules": dg.MetadataValue.json([h.rule for h in ev.hits if h.problem]),
        "hit_counts": dg.MetadataValue.json({h.rule: h.removed for h in ev.hits}),
        "tagger_rules": dg.MetadataValue.json(done.added),
        "tagger_rule_notes": dg.MetadataValue.json(done.notes),
        **curation_numbers(ev, done.tokens),
        # each numeric threshold swept on the version the rules were recorded at (one read)
        **{k: dg.MetadataValue.md(v) for k, v in sweeps_lib.markdown(sweeps_lib.sweeps(
            lance_store.table.open(done.version), done.curation.rules)).items()},
    })


def curation_numbers(ev: rules_lib.Evaluation,
                     tokens: rules_lib.TokenHits | None) -> dict[str, float]:
    """Plain numbers Dagster plots across materializations: rows and tokens the rules keep, and
    ``removed_rows/<rule>`` / ``removed_tokens/<rule>`` for each rule (a rule that cannot be
    evaluated has none)."""
    out: dict[str, float] = {f"removed_rows/{h.rule}": h.removed for h in ev.hits
                             if h.removed is not None}
    if tokens is not None:
        out.update({f"removed_tokens/{rule}": n for rule, n in tokens.removed.items()})
        out["total_tokens"] = tokens.total_tokens
        if tokens.kept_tokens is not None:
            out["kept_tokens"] = tokens.kept_tokens
            out["kept_token_share"] = round(tokens.kept_tokens / tokens.total_tokens, 4) \
                if tokens.total_tokens else 0.0
    return out


class ProfileConfig(RunConfig):
    queries_dir: str = ""
    """Folder of .sql files to run (default: lance_assets/curation/sql/profile in the package)."""


@dg.asset(deps=sorted({DEDUP_FLAG, TOKEN_IDS, *TAGGER_DEPS}, key=str), group_name=GROUP,
          kinds={"duckdb", "lance"}, code_version="3", tags=TABLE_TAGS,
          automation_condition=ON_NEW_DATA)
def corpus_profile(context: dg.AssetExecutionContext, config: ProfileConfig,
                   lance_store: LanceStore):
    """EDA of the corpus: DuckDB SQL over the Lance table through Arrow (no copy). Rows by score
    bucket, length percentiles, duplicate rates, language (stop-word heuristic), tokens per
    document, near-duplicate clusters, rule hit counts, and a histogram of what curation keeps;
    detected languages, personal data, contamination, quality score and paragraph duplicates.
    The queries are the .sql files in lance_assets/curation/sql/profile: edit or add one."""
    folder = Path(config.queries_dir) if config.queries_dir else profile.QUERIES_DIR
    with phase("corpus_profile: DuckDB queries over the table", context.log.info, announce=False):
        prof = profile.profile(lance_store.table, folder)
    metadata: dict = {
        "dagster/uri": lance_store.table.uri,
        "lance/table_version": prof.table_version,
        "dagster/row_count": prof.rows,
        "queries_dir": dg.MetadataValue.path(str(folder)),
        "kept_column": "passes the rules in force" if prof.kept_defined else
        "undefined: a rule could not be evaluated by DuckDB",
    }
    failed = []
    for res in [*prof.results, prof.rule_hits]:
        if res.skipped:
            metadata[res.name] = dg.MetadataValue.md(f"_skipped: {res.skipped}_")
        elif res.error:
            failed.append(res.name)
            metadata[res.name] = dg.MetadataValue.md(
                f"**query failed:** {res.error}\n\n```sql\n{res.sql}\n```")
        else:
            metadata[res.name] = dg.MetadataValue.md(markdown_table(res.rows))
    metadata["failed_queries"] = dg.MetadataValue.json(failed)
    if prof.histogram_png:
        out = paths.reports_dir(lance_store.root) / "corpus_profile.png"
        storage.write_atomic(out, prof.histogram_png)
        metadata["histogram"] = dg.MetadataValue.md(
            png_markdown(prof.histogram_png, "words and scores, kept vs removed"))
        metadata["histogram_png"] = dg.MetadataValue.path(str(out))
    if failed:
        context.log.warning(f"profile queries failed: {failed}")
    # its output is the query results, read at one table version
    results = digest([[r.name, r.rows, r.error] for r in [*prof.results, prof.rule_hits]])
    return dg.MaterializeResult(metadata=metadata,
                                data_version=data_version(context, prof.table_version, results))
