"""What a model was trained on, for the public: the training-data summary of one run.

Laid out in the sections of the EU AI Act's template for the public summary of training content
(Art. 53(1)(d), July 2025): general information, the list of data sources, the data processing
aspects. Every figure comes from what the run **read** (its read records,
``table.read_record.read_by``), never from what its filter would allow, with the columns read at
the version the run pinned (its snapshot tag ``train-<run>``; an ablation arm: its ablation's).
The cost follows what it read: the read records, then one scan of the few narrow columns the
summary needs (never ``text`` where ``n_bytes`` exists).

It quotes no document text and no url beyond its registered domain (``curation.url_domain``);
forget requests appear as counts and dates, never ids. A field the table cannot know (the
provider, the model's name) is a value the caller declares, left blank and said so where not.

A run whose snapshot ``forget`` redacted is summarised on the redacted copy: what it read minus
the forgotten documents, said with their count. One whose snapshot was released (``--release``,
retention) is still summarised: the documents it read that the newest version still holds are
counted there, the summary says so, and the rules are reported as recorded but not evaluated.
"""

from __future__ import annotations

import calendar
import json
import math
import re
import time
from dataclasses import dataclass, field

import lance
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from lance_assets import keys, paths, storage
from lance_assets.curation import rules as rules_mod
from lance_assets.curation.source_shares import source_name
from lance_assets.curation.url_domain import UNKNOWN, domain_codes
from lance_assets.markdown import markdown_table
from lance_assets.table import Table, VersionChoiceError, forget_log, get_json_config
from lance_assets.table.maintenance import SNAPSHOT_PREFIX
from lance_assets.table.read_record import read_by

FORMAT = 1
DEFAULT_TOP_SHARE = 0.1  # the template: the top 10% of domain names by size of content
MAX_TOP_DOMAINS = 1000
DEFAULT_TOP_N = 10
ABLATION_PREFIX = "ablation-"
CATEGORIES = ("publicly_available_datasets", "private_third_party_datasets",
              "crawled_and_scraped", "user_data", "synthetic_data", "other")
DUP_COLUMNS = (keys.IS_DUP, keys.NEAR_DUP, keys.SEMANTIC_DUP)
PII_KINDS = ("email", "phone", "ip", "card")
_URL_LITERAL = re.compile(r"'[^']*://[^']*'")


class SummaryError(ValueError):
    """A run that cannot be summarised; the message says why and what to do."""


@dataclass
class Declared:
    """What the table cannot know: declared by whoever publishes the summary (blank: not
    declared, and the summary says so). ``source_kinds`` maps a source name prefix
    (``file:/data/web``, ``hf:HuggingFaceFW``) to a template category (``CATEGORIES``)."""

    provider_name: str = ""
    provider_contact: str = ""
    model_name: str = ""
    model_version: str = ""
    source_kinds: dict[str, str] = field(default_factory=dict)

    def check(self) -> None:
        bad = {k: v for k, v in self.source_kinds.items() if v not in CATEGORIES}
        if bad:
            raise SummaryError(f"source_kinds {bad}: a category is one of {', '.join(CATEGORIES)}")


@dataclass
class Target:
    """The run (or ablation arm) summarised: its run folders, version, tag and finish time."""

    kind: str  # run | arm
    name: str
    folders: list
    version: int
    tag: str | None
    finished: float  # unix time its (last) summary.json was written
    steps: int | None = None
    tokens_seen: int | None = None
    arm_rules: dict | None = None  # an ablation arm's own rule set (its plan's), when it has one


def _json(path) -> dict | None:
    try:
        return json.loads(path.read_text()) if path.is_file() else None
    except (OSError, ValueError):
        return None


def _dirs(folder) -> list:
    try:
        return sorted(p for p in folder.iterdir() if p.is_dir())
    except (FileNotFoundError, NotADirectoryError):
        return []


def _mtime(path) -> float:
    """When ``path`` was last written (a local file or an object); 0 when that is not known."""
    try:
        return float(path.stat().st_mtime)
    except Exception:  # noqa: BLE001 - an object store without the time: not known
        return 0.0


def newest_run(table: Table) -> str:
    """The run DATA/train/LATEST names (the newest finished ``pretrained_model``)."""
    pointer = paths.latest_checkpoint_pointer(table.root)
    if not pointer.is_file():
        raise SummaryError(f"{table.root}: no trained model (DATA/train/LATEST is missing): "
                           "materialize `pretrained_model` first, or name a run")
    return storage.location(pointer.read_text().strip()).parent.name


def target(table: Table, ref: str | None) -> Target:
    """``ref``: a run under DATA/train (default: the newest), or an arm ``<ablation>/<arm>`` of a
    curation ablation or a mixture search (``mixture-<name>/<arm>``): every seed it ran."""
    ref = (ref or "").strip() or newest_run(table)
    if ref.startswith(SNAPSHOT_PREFIX) and not paths.run_dir(table.root, ref).is_dir():
        ref = ref[len(SNAPSHOT_PREFIX):]
    parts = ref.split("/")
    if len(parts) == 1:
        folder = paths.run_dir(table.root, ref)
        info = _json(folder / "summary.json")
        if info is None or "table_version" not in info:
            raise SummaryError(f"training run {ref!r}: {folder} has no finished summary.json; "
                               "a summary needs a finished run (python -m lance_assets diff "
                               "--list names the runs)")
        return Target("run", ref, [folder], int(info["table_version"]),
                      info.get("table_tag") or SNAPSHOT_PREFIX + ref,
                      _mtime(folder / "summary.json"), info.get("step"), info.get("tokens_seen"))
    if len(parts) != 2 or not all(parts):
        raise SummaryError(f"{ref!r}: name a training run or an ablation arm <ablation>/<arm>")
    base = paths.ablation_dir(table.root, parts[0])
    plan = _json(base / "plan.json")
    if not plan or plan.get("version") is None:
        raise SummaryError(f"{ref!r}: no ablation {parts[0]!r} with a plan under {base}")
    arms = {str(a.get("name")): a for a in plan.get("arms", [])}
    if arms and parts[1] not in arms:
        raise SummaryError(f"{ref!r}: ablation {parts[0]} has no arm {parts[1]!r}; its arms: "
                           f"{', '.join(sorted(arms))}")
    safe = re.sub(r"[^A-Za-z0-9_.-]", "_", parts[1])
    # a curation ablation's arms: <base>/<arm>-<digest>/seed-N; a mixture search's: under verify/
    seeds = [s for d in _dirs(base) + _dirs(base / "verify") if d.name.rsplit("-", 1)[0] == safe
             for s in _dirs(d) if s.name.startswith("seed-") and (s / "summary.json").is_file()]
    if not seeds:
        raise SummaryError(f"{ref!r}: the arm has no finished seed run under {base}")
    infos = [_json(s / "summary.json") or {} for s in seeds]
    return Target("arm", ref, seeds, int(plan["version"]),
                  plan.get("tag") or ABLATION_PREFIX + parts[0],
                  max(_mtime(s / "summary.json") for s in seeds),
                  None, sum(int(i.get("tokens_seen") or 0) for i in infos) or None,
                  arms.get(parts[1], {}).get("rules"))


def _snapshot(table: Table, t: Target) -> tuple[lance.LanceDataset, dict]:
    """The version the run read (its redacted copy where forget redacted it), or (released,
    cleaned up) the newest, with what happened."""
    try:
        chosen = table.choose(t.tag, version=t.version)
    except VersionChoiceError:
        chosen = None
    if chosen is not None and chosen.branch is None:
        return chosen.dataset, {"state": "readable", "tag": t.tag, "version": t.version,
                                "note": ""}
    if chosen is not None:  # forget redacted it: every other row, under the same tag
        return chosen.dataset, {"state": "redacted", "tag": t.tag, "version": t.version,
                                "forgets": len(chosen.redactions), "note": ""}
    from lance_assets.forensics.diff.refs import release_story

    ds = table.newest()
    return ds, {"state": "released", "tag": t.tag, "version": t.version,
                "read_at_version": ds.version,
                "note": (f"the run's snapshot (tag {t.tag}, version {t.version}) can no "
                         f"longer be read: {release_story(table, t.tag, t.version)}. The "
                         "documents it read are counted at the newest version "
                         f"({ds.version}) where they still exist; the rules are not "
                         "evaluated")}


def _column(batch: pa.RecordBatch, name: str) -> pa.Array:
    col = batch.column(name)
    if pa.types.is_dictionary(col.type):
        col = col.cast(col.type.value_type)
    return col


def read_rows(ds: lance.LanceDataset, read: np.ndarray) -> tuple[pa.Table, dict]:
    """The narrow columns the summary needs, for the rows of ``ds`` among ``read``."""
    names = set(ds.schema.names)
    lang = "lang" if "lang" in names else ("language" if "language" in names else None)
    wanted = ["id", "source", "url", "date", keys.N_TOKENS, keys.N_BYTES, lang, "contaminated",
              "opted_out", *[f"pii_{k}_count" for k in PII_KINDS]]
    columns = [c for c in dict.fromkeys(wanted) if c and c in names]
    bytes_from_text = keys.N_BYTES not in names and "text" in names
    parts = []
    for batch in ds.to_batches(columns=columns + (["text"] if bytes_from_text else [])):
        ids = batch.column("id").to_numpy(zero_copy_only=False)
        mask = np.isin(ids, read, assume_unique=False)
        if not mask.any():
            continue
        got = batch.filter(pa.array(mask))
        arrays = {c: _column(got, c) for c in columns}
        if bytes_from_text:
            arrays[keys.N_BYTES] = pc.binary_length(pc.cast(got.column("text"), pa.binary()))
        parts.append(pa.table(arrays))
    empty = pa.table({c: pa.array([], ds.schema.field(c).type) for c in columns})
    rows = pa.concat_tables(parts, promote_options="permissive") if parts else empty
    return rows, {"language_column": lang,
                  "bytes_from": "n_bytes" if not bytes_from_text else "UTF-8 length of text"}


def _ints(rows: pa.Table, name: str) -> np.ndarray | None:
    if name not in rows.column_names:
        return None
    return pc.fill_null(rows.column(name), 0).to_numpy(zero_copy_only=False).astype(np.int64)


def _encoded(rows: pa.Table, name: str | None, missing: str) -> tuple[np.ndarray, list[str]]:
    """A string column as codes into its distinct values (``missing`` for nulls)."""
    if name is None or name not in rows.column_names:
        return np.zeros(rows.num_rows, np.int64), [missing] if rows.num_rows else []
    col = pc.fill_null(rows.column(name), missing)
    if isinstance(col, pa.ChunkedArray):
        col = col.combine_chunks() if col.num_chunks else pa.array([], pa.string())
    encoded = pc.dictionary_encode(col)
    return (encoded.indices.to_numpy(zero_copy_only=False).astype(np.int64),
            [str(v) for v in encoded.dictionary.to_pylist()])


def _sums(codes: np.ndarray, n: int, tokens: np.ndarray | None, nbytes: np.ndarray
          ) -> tuple[np.ndarray, np.ndarray | None, np.ndarray]:
    docs = np.bincount(codes, minlength=n).astype(np.int64)
    tok = None if tokens is None else np.bincount(codes, tokens, minlength=n).astype(np.int64)
    return docs, tok, np.bincount(codes, nbytes, minlength=n).astype(np.int64)


def _category(name: str, declared: Declared) -> tuple[str, str]:
    for prefix, kind in sorted(declared.source_kinds.items(), key=lambda kv: -len(kv[0])):
        if name.startswith(prefix):
            return kind, "declared"
    if name.startswith("hf:"):
        return "publicly_available_datasets", "a Hugging Face dataset"
    if name.startswith("synthetic"):
        return "synthetic_data", "generated by this project"
    return "other", "not known to the table: declare it in source_kinds"


def _sources(rows: pa.Table, tokens, nbytes, declared: Declared) -> list[dict]:
    inverse, uniq = _encoded(rows, "source", "(no source)")
    named = [source_name(k) for k in uniq]
    names = sorted({n for n, _ in named})
    index = {n: i for i, n in enumerate(names)}
    of_key = np.array([index[n] for n, _ in named], dtype=np.int64)
    codes = of_key[inverse] if len(inverse) else np.zeros(0, np.int64)
    docs, tok, size = _sums(codes, len(names), tokens, nbytes)
    periods: dict[int, tuple] = {}
    if "date" in rows.column_names and rows.num_rows:
        agg = pa.table({"s": codes, "d": rows.column("date")}).group_by("s").aggregate(
            [("d", "min"), ("d", "max")])
        for s, lo, hi in zip(*(agg.column(c).to_pylist() for c in ("s", "d_min", "d_max"))):
            if lo is not None:
                periods[s] = (lo[:10], hi[:10])
    units: dict[str, set] = {}
    for name, unit in named:
        units.setdefault(name, set()).add(unit)
    out = []
    for i, name in enumerate(names):
        kind, why = _category(name, declared)
        lo, hi = periods.get(i, (None, None))
        out.append({"source": name, "category": kind, "category_from": why,
                    "units": len(units[name]), "documents": int(docs[i]),
                    "tokens": None if tok is None else int(tok[i]), "bytes": int(size[i]),
                    "collection_period": {"from": lo, "to": hi,
                                          "from_column": "date" if lo else None}})
    return sorted(out, key=lambda s: (-s["bytes"], s["source"]))


def _domains(rows: pa.Table, tokens, nbytes, share: float, cap: int, top_n: int) -> dict:
    if "url" not in rows.column_names:
        return {"column": None, "note": "the table has no url column", "domains": 0,
                "documents_without_url": rows.num_rows, "top_share": [], "top_n": []}
    codes, names = domain_codes(rows.column("url"))
    docs, tok, size = _sums(codes, len(names), tokens, nbytes)
    known = [i for i, n in enumerate(names) if n != UNKNOWN]
    ranked = sorted(known, key=lambda i: (-int(size[i]), names[i]))
    entry = [{"domain": names[i], "documents": int(docs[i]),
              "tokens": None if tok is None else int(tok[i]), "bytes": int(size[i])}
             for i in ranked]
    k = min(cap, math.ceil(share * len(ranked))) if ranked else 0
    no_url = int(docs[names.index(UNKNOWN)]) if UNKNOWN in names else 0
    return {"column": "url", "rule": "registered domain (lance_assets.curation.url_domain)",
            "ranked_by": "bytes", "domains": len(ranked), "documents_without_url": no_url,
            "share": share, "cap": cap, "top_share": entry[:k], "top_n": entry[:top_n]}


def _languages(rows: pa.Table, column: str | None, tokens, nbytes) -> list[dict]:
    codes, names = _encoded(rows, column, "und")
    docs, tok, size = _sums(codes, len(names), tokens, nbytes)
    out = [{"language": str(n), "documents": int(docs[i]),
            "tokens": None if tok is None else int(tok[i]), "bytes": int(size[i])}
           for i, n in enumerate(names)]
    return sorted(out, key=lambda x: (-x["bytes"], x["language"]))


def _masked(predicate: str) -> str:
    """A rule as shown: a quoted url in it becomes ``'<url>'``."""
    return _URL_LITERAL.sub("'<url>'", predicate)


def _rules(ds: lance.LanceDataset, t: Target, readable: bool) -> dict:
    curation = rules_mod.stored_curation(ds)
    rules = dict(curation.rules) if curation else dict(rules_mod.DEFAULT_RULES)
    said = (f"the curation rules in force at version {ds.version}" if curation
            else "the default rules (no curation recorded at that version)")
    if t.arm_rules is not None:
        name, arm = t.name.split("/")
        rules, said = dict(t.arm_rules), f"arm {arm}'s rule set (ablation {name})"
    listed = [{"rule": k, "keep_when": _masked(v)} for k, v in rules.items()]
    if not readable:
        return {"from": said + " (the newest: the run's own version is gone, its rules may "
                "have differed; not evaluated)", "rules": listed,
                "documents_in_version": None, "evaluated": False}
    ev = rules_mod.evaluate(ds, rules)
    toks = rules_mod.token_hits(ds, rules)
    by = {h.rule: h for h in ev.hits}
    for r in listed:
        h = by.get(r["rule"])
        r["documents_removed"] = None if h is None or h.problem else h.removed
        r["documents_removed_only_by_this_rule"] = None if h is None or h.problem \
            else h.removed_only_by_this
        r["tokens_removed"] = toks.removed.get(r["rule"]) if toks else None
        r["problem"] = h.problem if h else ""
    return {"from": said, "rules": listed, "documents_in_version": ev.total_rows,
            "documents_kept": ev.kept_rows, "evaluated": True}


def _processing(ds: lance.LanceDataset, rows: pa.Table, rules: dict, readable: bool) -> dict:
    names = set(ds.schema.names)
    in_force = {r["rule"]: r for r in rules["rules"]}

    def reads(col: str) -> list[str]:
        return [k for k, r in in_force.items() if re.search(rf"\b{col}\b", r["keep_when"])]

    def flagged(col: str) -> int | None:
        return ds.count_rows(filter=col) if readable and col in names else None

    def read_with(col: str) -> int | None:
        if col not in rows.column_names:
            return None
        return int(pc.sum(pc.fill_null(rows.column(col), False).cast(pa.int64())).as_py() or 0)

    dup_rules = sorted({r for c in DUP_COLUMNS for r in reads(c)})
    pii = {k: int((v > 0).sum()) for k in PII_KINDS
           if (v := _ints(rows, f"pii_{k}_count")) is not None}
    redaction = get_json_config(ds, keys.TOKEN_REDACTION_KEY) or {}
    contamination = get_json_config(ds, keys.CONTAMINATION_KEY) or {}
    opt_out = get_json_config(ds, keys.OPT_OUT_KEY) or {}
    return {
        "duplicates": {
            "flagged_in_version": {c: flagged(c) for c in DUP_COLUMNS if c in names},
            "rules": dup_rules,
            "documents_removed_by_these_rules": _removed_by(ds, rules, dup_rules)
            if readable else None},
        "personal_data": {
            "detected": bool(pii), "documents_read_with": pii,
            "columns": "pii_*_count (personal_data)" if pii else None,
            "token_ids_redacted": bool(redaction.get("redact_pii", False)),
            "placeholders": sorted((redaction.get("placeholders") or {}).values())},
        "contamination": {
            "evaluation_sets": [{"name": s.get("name"), "fingerprint": str(
                s.get("fingerprint", ""))[:16]} for s in contamination.get("sets", [])],
            "rules": reads("contaminated"),
            "flagged_in_version": flagged("contaminated"),
            "documents_read_flagged": read_with("contaminated")},
        "opt_outs": {
            "lists": [{k: v for k, v in item.items() if k in ("kind", "name", "sha256", "entries",
                                                               "user_agents")}
                      for item in opt_out.get("lists", [])],
            "digest": opt_out.get("digest"),
            "rules": reads("opted_out"),
            "flagged_in_version": flagged("opted_out"),
            "documents_read_flagged": read_with("opted_out")},
    }


def _removed_by(ds: lance.LanceDataset, rules: dict, names: list[str]) -> int | None:
    chosen = {r["rule"]: r["keep_when"] for r in rules["rules"] if r["rule"] in names}
    if not chosen:
        return 0
    usable, problems = rules_mod.rule_predicates(ds, chosen)
    if problems or not usable:
        return None
    return ds.count_rows() - ds.count_rows(filter=rules_mod.combined_predicate(usable).lance)


def _epoch(at: str) -> float | None:
    try:
        return float(calendar.timegm(time.strptime(at, "%Y-%m-%dT%H:%M:%SZ")))
    except (TypeError, ValueError):
        return None


def _forgets(table: Table, t: Target) -> dict:
    """Forget requests between the previous run's end and this one's, and since it: counts and
    dates from ``forget.log.jsonl`` (the log keeps no text; ids are left out here too)."""
    earlier = [_mtime(p / "summary.json") for p in _dirs(paths.train_dir(table.root))]
    earlier = [m for m in earlier if 0 < m < t.finished]
    since = max(earlier) if earlier else None
    before, after = [], []
    for entry in forget_log.entries(table, newest_first=False):
        at = _epoch(entry.get("at"))
        if entry.get("dry_run") or at is None:
            continue
        item = {"date": entry["at"], "documents": int(entry.get("ids") or 0),
                "rows_deleted": int(entry.get("rows_deleted") or 0),
                "snapshots_released": len(entry.get("released") or {}),
                "snapshots_redacted": len(entry.get("redacted") or {})}
        if at > t.finished:
            after.append(item)
        elif since is None or at > since:
            before.append(item)
    return {"since": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(since)) if since else None,
            "until": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(t.finished)),
            "requests": before, "documents": sum(i["documents"] for i in before),
            "after_the_run": {"requests": len(after),
                              "documents": sum(i["documents"] for i in after)}}


def summarize(table: Table, run: str | None = None, *, top_share: float = DEFAULT_TOP_SHARE,
              cap: int = MAX_TOP_DOMAINS, top_n: int = DEFAULT_TOP_N,
              declared: Declared | None = None) -> dict:
    """The public summary of what ``run`` read, as plain JSON-ready data (stable keys)."""
    declared = declared or Declared()
    declared.check()
    if not 0 < top_share <= 1 or not 1 <= cap <= MAX_TOP_DOMAINS or top_n < 0:
        raise SummaryError(f"top_share {top_share}, cap {cap}, top_n {top_n}: give a share in "
                           f"(0, 1], a cap from 1 to {MAX_TOP_DOMAINS} and top_n >= 0")
    started = time.perf_counter()
    t = target(table, run)
    read = read_by(t.folders)
    if read is None:
        raise SummaryError(f"{t.kind} {t.name}: no exact read record (read.json of a finished "
                           "run); what it read cannot be said, so no summary is made. Train it "
                           "again with this version of the trainer")
    ds, snapshot = _snapshot(table, t)
    readable = snapshot["state"] in ("readable", "redacted")
    rows, how = read_rows(ds, read)
    if snapshot["state"] == "redacted":  # what it read that forget removed since: a count
        gone = int(len(read)) - rows.num_rows
        snapshot["documents_read_forgotten"] = gone
        snapshot["note"] = (f"forget removed {gone:,} of the documents the run read from its "
                            f"snapshot (tag {t.tag}) after it trained; the figures count the "
                            "others, on the redacted copy")
    tokens, nbytes = _ints(rows, keys.N_TOKENS), _ints(rows, keys.N_BYTES)
    nbytes = nbytes if nbytes is not None else np.zeros(rows.num_rows, np.int64)
    rule_info = _rules(ds, t, readable)
    blank = [k for k in ("provider_name", "provider_contact", "model_name", "model_version")
             if not getattr(declared, k)]
    sources = _sources(rows, tokens, nbytes, declared)
    by_kind = {c: [s["source"] for s in sources if s["category"] == c] for c in CATEGORIES}
    return {
        "format": FORMAT,
        "general_information": {
            "provider": {"name": declared.provider_name or None,
                         "contact": declared.provider_contact or None},
            "model": {"name": declared.model_name or None,
                      "version": declared.model_version or None},
            "not_declared": blank,
            "not_declared_note": "config values the table cannot know; left blank, never "
                                 "guessed" if blank else "",
            "modalities": ["text"],
            "training_data_size": {
                "documents_read": int(len(read)), "documents_counted": rows.num_rows,
                "tokens": None if tokens is None else int(tokens.sum()),
                "bytes": int(nbytes.sum()), "bytes_from": how["bytes_from"],
                "tokens_trained_on": t.tokens_seen},
            "languages": _languages(rows, how["language_column"], tokens, nbytes),
            "language_column": how["language_column"],
        },
        "data_sources": {"sources": sources, "by_category": by_kind,
                         "crawled_domains": _domains(rows, tokens, nbytes, top_share, cap, top_n)},
        "data_processing": {"rules": rule_info, **_processing(ds, rows, rule_info, readable),
                            "forget_requests": _forgets(table, t)},
        "run": {"kind": t.kind, "name": t.name, "table_version": t.version, "tag": t.tag,
                "snapshot": snapshot, "read_from": f"read.json of {len(t.folders)} run(s)",
                "steps": t.steps, "computed_in_s": round(time.perf_counter() - started, 3)},
    }


def save(table: Table, summary: dict, text: str) -> tuple[str, str]:
    """DATA/reports/training_data_summary/<run>.md and .json."""
    folder = paths.reports_dir(table.root) / "training_data_summary"
    name = summary["run"]["name"].replace("/", "__")
    md, js = folder / f"{name}.md", folder / f"{name}.json"
    storage.write_atomic(md, text.encode())
    storage.write_atomic(js, json.dumps(summary, indent=2).encode())
    return str(md), str(js)



def _n(v) -> str:
    return "–" if v is None else (f"{v:,}" if isinstance(v, int) else str(v))


def _cell(v) -> str:
    return _n(v).replace("|", "\\|")


def markdown(s: dict) -> str:
    """The summary for a person: the template's three sections, tables of counts."""
    g, d, p, r = (s["general_information"], s["data_sources"], s["data_processing"], s["run"])
    size = g["training_data_size"]
    blank = "_blank: a config value the table cannot know, not declared_"
    lines = [f"# Training data summary: {r['kind']} `{r['name']}`", "",
             f"Read at table version {r['table_version']} (tag `{r['tag']}`); every figure counts "
             "the documents the run read (its read records), not what its filter allowed.", ""]
    if r["snapshot"]["state"] != "readable":
        lines += [f"**Snapshot {r['snapshot']['state']}.** {r['snapshot']['note']}.", ""]
    lines += ["## 1. General information", "",
              f"- Provider: {g['provider']['name'] or blank}; contact: "
              f"{g['provider']['contact'] or blank}",
              f"- Model: {g['model']['name'] or blank}; version: {g['model']['version'] or blank}",
              f"- Modalities: {', '.join(g['modalities'])}",
              f"- Size: {_n(size['documents_read'])} documents read ({_n(size['documents_counted'])}"
              f" of them in the version counted), {_n(size['tokens'])} tokens, {_n(size['bytes'])} "
              f"bytes ({size['bytes_from']}); tokens trained on (epochs included): "
              f"{_n(size['tokens_trained_on'])}", "",
              f"Languages (column `{g['language_column'] or 'none'}`):", "",
              _table(g["languages"], ("language", "documents", "tokens", "bytes")), "",
              "## 2. List of data sources", "",
              _table([{**x, "collection period": (f"{x['collection_period']['from']} to "
                                                  f"{x['collection_period']['to']}")
                       if x["collection_period"]["from"] else "no date column values"}
                      for x in d["sources"]],
                     ("source", "category", "units", "documents", "tokens", "bytes",
                      "collection period")), ""]
    dom = d["crawled_domains"]
    if dom["column"]:
        lines += [f"Crawled and scraped content: {_n(dom['domains'])} registered domains "
                  f"({_n(dom['documents_without_url'])} documents read without a url). The top "
                  f"{dom['share']:.0%} of domain names by bytes of content "
                  f"({len(dom['top_share'])}, at most {dom['cap']:,}):", "",
                  _table(dom["top_share"], ("domain", "documents", "tokens", "bytes")), "",
                  f"The top {len(dom['top_n'])}:", "",
                  _table(dom["top_n"], ("domain", "documents", "tokens", "bytes")), ""]
    else:
        lines += [f"Crawled content: {dom['note']}.", ""]
    rules = p["rules"]
    lines += ["## 3. Data processing aspects", "", f"### Rules in force ({rules['from']})", "",
              _table(rules["rules"], ("rule", "keep_when", "documents_removed", "tokens_removed")
                     if rules["evaluated"] else ("rule", "keep_when")), ""]
    dup, pii, con, opt = p["duplicates"], p["personal_data"], p["contamination"], p["opt_outs"]
    flags = ", ".join(f"`{c}` {_n(v)}" for c, v in dup["flagged_in_version"].items())
    lines += [f"- Duplicates: flagged in the version {flags or '(no duplicate column)'}; "
              f"removed by {', '.join(dup['rules']) or 'no rule'}: "
              f"{_n(dup['documents_removed_by_these_rules'])} documents",
              "- Personal data: " + ("documents read holding " + ", ".join(
                  f"{k} {v:,}" for k, v in pii["documents_read_with"].items())
                                      if pii["detected"] else "not detected (no personal_data "
                                      "columns)") +
              f"; token ids redacted: {'yes' if pii['token_ids_redacted'] else 'no'}",
              "- Evaluation sets checked for contamination: "
              + (", ".join(f"{e['name']} ({e['fingerprint']})" for e in con["evaluation_sets"])
                 or "none registered")
              + f"; rule {', '.join(con['rules']) or 'none'}; contaminated documents read: "
              f"{_n(con['documents_read_flagged'])}",
              "- Opt-outs from text and data mining: "
              + ("; ".join(f"{x.get('kind')} {x.get('name')} (sha256 {str(x.get('sha256'))[:16]}"
                           f", {_n(x.get('entries'))} entries)" for x in opt["lists"])
                 or "no opt-out list configured")
              + f"; rule {', '.join(opt['rules']) or 'none'}; opted-out documents in the version: "
              f"{_n(opt['flagged_in_version'])}, read: {_n(opt['documents_read_flagged'])}"]
    fg = p["forget_requests"]
    lines += [f"- Forget requests carried out between {fg['since'] or 'the first run'} and "
              f"{fg['until']}: {len(fg['requests'])} ({_n(fg['documents'])} documents)"
              + "".join(f"; {x['date']}: {x['documents']:,}" for x in fg["requests"])
              + f"; since the run: {fg['after_the_run']['requests']} "
              f"({_n(fg['after_the_run']['documents'])} documents)"]
    return "\n".join(lines) + "\n"


def _table(rows: list[dict], cols: tuple[str, ...]) -> str:
    return markdown_table([{c: _cell(r.get(c)) for c in cols} for r in rows])
