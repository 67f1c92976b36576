"""Every document's story: why it is in or out, its duplicates, and what trained on it.

``explain(table, id)`` answers, for one document (by its ``id``):

- **signals**: every column value of the row (vectors and lists summarised by their length),
  grouped by the asset that wrote them;
- **rules**: each rule of the curation in force with its verdict on this row (``keeps``,
  ``removes``, or ``removes: NULL`` when a column it reads is not computed) and the rules that
  removed it, evaluated by Lance on the row (the engine training filters with);
- **duplicates**: its exact (``is_dup``), near (``near_dup_cluster``) and semantic
  (``semantic_rep``) duplicate clusters, their sizes, first members and the member kept;
- **contamination**: ``contaminated`` and the evaluation sets it matched;
- **snapshots**: every tagged version of the table; for each, whether the row is in it, and each
  training run (``DATA/train/<run>/summary.json``) and ablation arm
  (``DATA/ablations/<name>/plan.json``) that read it, with the run's own filter evaluated on the
  row *at that tagged version*, not on today's table: a column recomputed or a rule changed
  since does not rewrite what a run trained on;
- **samples**: the generated samples the forensics report attributed to it.

The signals and rule verdicts are read at one version (``ref``: a version number or a tag; the
newest by default). Filters read from run records are files, so they are parsed again by the
curation rules' parser before Lance sees them; a record that does not parse is reported, not
trusted.
"""

from __future__ import annotations

import json
import re
import time
from dataclasses import asdict, dataclass, field
from typing import Any

import lance
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from lance_assets import keys, paths
from lance_assets.curation.predicate import PredicateError, safe_predicate
from lance_assets.markdown import markdown_table
from lance_assets.table import Table, VersionChoiceError
from lance_assets.table.forget_journal import Journal, forgotten_ids
from lance_assets.table.read_record import read_by

MAX_LIST = 12  # longer lists are shown by their length and first items
MAX_MEMBERS = 20  # cluster members listed (the size is always counted)
EXCERPT_CHARS = 300
TEXT_COLUMNS = ("text",)


class ExplainError(ValueError):
    """A document or version that cannot be explained; the message says which and why."""


@dataclass
class Cluster:
    kind: str  # exact | near | semantic
    key: int | str | None  # the cluster's value (near_dup_cluster, semantic_rep)
    size: int
    members: list[int]  # the first MAX_MEMBERS ids, ascending
    kept: int | None  # the member the flag keeps (smallest id / the representative)
    this_kept: bool
    detail: str = ""


@dataclass
class RuleVerdict:
    rule: str
    predicate: str
    verdict: str  # keeps | removes | removes: NULL | broken
    problem: str = ""


@dataclass
class RunVerdict:
    kind: str  # run | ablation arm | snapshot
    name: str  # run name, "<ablation>/<arm>", or the tag
    tag: str | None
    version: int | None
    present: bool | None  # the row is in that version (None: version gone)
    trained_on: bool | None  # the run's filter keeps the row there (None: unknown)
    filter: str = ""
    note: str = ""
    read: bool | None = None  # the run read the row (its read record); None: no record


@dataclass
class Story:
    id: int
    version: int  # the version the signals and verdicts were read at
    tag: str | None
    present: bool
    document: dict = field(default_factory=dict)
    signals: dict[str, dict[str, Any]] = field(default_factory=dict)  # asset -> column -> value
    rules: list[RuleVerdict] = field(default_factory=list)
    removed_by: list[str] = field(default_factory=list)
    kept_by_rules: bool | None = None  # None: no rules recorded at this version
    duplicates: list[Cluster] = field(default_factory=list)
    contamination: dict = field(default_factory=dict)
    snapshots: list[RunVerdict] = field(default_factory=list)
    samples: list[dict] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    forgotten: dict = field(default_factory=dict)  # the forget that erased it (its journal)

    def to_dict(self) -> dict:
        return asdict(self)

    @property
    def trained_by(self) -> list[RunVerdict]:
        """The runs that read the document (by their read records), or whose filter kept it
        where a run has no record."""
        return [s for s in self.snapshots if s.kind != "snapshot"
                and (s.read if s.read is not None else s.trained_on)]

    def headline(self) -> str:
        if self.forgotten:
            f = self.forgotten
            read = ", ".join(f"{s.name} (tag {s.tag})" for s in self.snapshots if s.read) or \
                "no run on record"
            return (f"document {self.id}: forgotten by `forget` (journal {f['op']}, planned "
                    f"{_when(f['at'])}" + (f", finished {_when(f['at_done'])}" if f["done"]
                                            else ", not finished yet") + f"; predicate "
                    f"{f['predicate_sha256'][:19]}…, {f['ids']:,} document(s) asked); read by: "
                    f"{read}")
        if not self.present:
            return f"document {self.id}: not in table version {self.version}"
        if self.kept_by_rules is None:
            verdict = "no curation rules recorded"
        elif self.kept_by_rules:
            verdict = "kept by every rule in force"
        else:
            verdict = "removed by " + ", ".join(self.removed_by)
        runs = ", ".join(f"{s.name} (tag {s.tag})" for s in self.trained_by) or "none"
        return f"document {self.id}: {verdict}; trained on by: {runs}"

    def markdown(self, quote: bool = True) -> str:
        """The story; ``quote=False`` leaves the document's excerpt out (for records that
        ``forget`` cannot reach, such as a run's metadata)."""
        out = [f"## Document {self.id}", "", self.headline(), "",
               f"Read at table version {self.version}"
               + (f" (tag `{self.tag}`)" if self.tag else "") + "."]
        if self.document:
            d = self.document
            out += ["", "**Document**: " + ", ".join(f"{k} `{v}`" for k, v in d.items()
                                                     if k != "excerpt"),
                    *(["", "> " + d.get("excerpt", "").replace("\n", " ")] if quote else [])]
        if self.rules:
            out += ["", "### Rules in force", "",
                    markdown_table([{"rule": r.rule, "keep when": f"`{_cell(r.predicate)}`",
                                     "verdict": r.verdict, "problem": r.problem}
                                    for r in self.rules])]
        if self.duplicates:
            out += ["", "### Duplicate clusters", "",
                    markdown_table([{"kind": c.kind, "cluster": c.key, "size": c.size,
                                     "kept member": c.kept, "this one kept": c.this_kept,
                                     "members": ", ".join(map(str, c.members))
                                     + (" ..." if c.size > len(c.members) else ""),
                                     "detail": c.detail} for c in self.duplicates])]
        if self.contamination:
            out += ["", "### Contamination", "",
                    ", ".join(f"{k}: `{v}`" for k, v in self.contamination.items())]
        if self.snapshots:
            out += ["", "### Snapshots, training runs and ablation arms", "",
                    markdown_table([{"kind": s.kind, "name": s.name, "tag": s.tag or "",
                                     "version": s.version, "in that version": _yn(s.present),
                                     "kept by its filter": _yn(s.trained_on),
                                     "read by it": _yn(s.read) if s.read is not None
                                     else "no record", "note": s.note}
                                    for s in self.snapshots])]
        if self.samples:
            out += ["", "### Generated samples attributed to it", "",
                    markdown_table([{k: _cell(str(v)) for k, v in s.items()}
                                    for s in self.samples])]
        if self.signals:
            out += ["", "### Signals", ""]
            rows = [{"asset": asset, "column": col, "value": _cell(_shown(v))}
                    for asset, cols in self.signals.items() for col, v in cols.items()]
            out.append(markdown_table(rows))
        if self.notes:
            out += ["", "Notes: " + "; ".join(self.notes)]
        return "\n".join(out)


def _when(t: float | None) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%SZ", time.gmtime(t)) if t else "?"


def _yn(v: bool | None) -> str:
    return "unknown" if v is None else ("yes" if v else "no")


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def _shown(v: Any) -> str:
    if isinstance(v, float):
        return f"{v:.4g}"
    return json.dumps(v, default=str) if isinstance(v, (list, dict)) else str(v)


# ---------------------------------------------------------------------------- reading one row

def _id_filter(doc_id: int) -> str:
    return f"id = {int(doc_id)}"


def _row(ds: lance.LanceDataset, doc_id: int) -> dict | None:
    """The row's values but its text and the table's own bookkeeping columns (``_...``); lists
    longer than ``MAX_LIST`` and vectors shown by their length."""
    columns = [f.name for f in ds.schema if f.name not in TEXT_COLUMNS
               and not f.name.startswith("_")]
    t = ds.to_table(columns=columns, filter=_id_filter(doc_id))
    if t.num_rows == 0:
        return None
    return {name: _summarised(t.column(name)[0].as_py()) for name in t.column_names}


def _summarised(v: Any) -> Any:
    if isinstance(v, list):
        if v and isinstance(v[0], (float, list)):
            return f"<{len(v)} {'vectors' if isinstance(v[0], list) else 'values'}>"
        if len(v) > MAX_LIST:
            return f"<{len(v)} items: {json.dumps(v[:5], default=str)[:-1]}, ...]>"
    if isinstance(v, bytes):
        return f"<{len(v)} bytes>"
    return v


def _present(ds: lance.LanceDataset, doc_id: int) -> bool:
    return ds.count_rows(filter=_id_filter(doc_id)) > 0


def _keeps(ds: lance.LanceDataset, doc_id: int, filter_text: str) -> tuple[bool | None, str]:
    """Whether ``filter_text`` (a stored filter: parsed again, never trusted) keeps the row at
    ``ds``; (None, why) when it does not parse there."""
    try:
        pred = safe_predicate(filter_text, ds.schema.names)
    except PredicateError as e:
        return None, f"filter not readable: {e}"
    return _passes(ds, doc_id, pred.lance), ""


def _passes(ds: lance.LanceDataset, doc_id: int, checked_sql: str) -> bool:
    """The row passes ``checked_sql`` (rendered by the predicate parser; NULL does not pass)."""
    t = ds.to_table(columns={"k": f"({checked_sql})"}, filter=_id_filter(doc_id))
    return bool(t.num_rows) and t.column("k")[0].as_py() is True


# ---------------------------------------------------------------------------- the sections

def _producer_of() -> dict[str, str]:
    from lance_assets.table.producer import producers

    owner = {}
    for p in producers():
        for f in p.fields:
            owner[f.name] = p.name
    return owner


def _signals(row: dict, owners: dict[str, str]) -> dict[str, dict[str, Any]]:
    out: dict[str, dict[str, Any]] = {}
    for col, v in row.items():
        if col in TEXT_COLUMNS:
            continue
        asset = owners.get(col) or ("contamination" if col.startswith("contaminated_") else
                                    "raw_text")
        out.setdefault(asset, {})[col] = v
    return out


def _rules(ds: lance.LanceDataset, doc_id: int) -> tuple[list[RuleVerdict], bool | None]:
    from lance_assets.curation.rules import stored_curation

    try:
        curation = stored_curation(ds)
    except (ValueError, TypeError) as e:
        return [RuleVerdict("(curation)", "", "broken", str(e))], None
    if curation is None:
        return [], None
    from lance_assets.curation.rules import rule_predicates

    usable, problems = rule_predicates(ds, curation.rules)
    broken = {p.rule: p.problem for p in problems}
    projections = {f"r{i}": f"({p.lance})" for i, p in enumerate(usable.values())}
    values: dict[str, Any] = {}
    if projections:
        t = ds.to_table(columns=projections, filter=_id_filter(doc_id))
        if t.num_rows:
            values = {name: t.column(f"r{i}")[0].as_py() for i, name in enumerate(usable)}
    out = []
    for name, text in curation.rules.items():
        if name in broken:
            out.append(RuleVerdict(name, str(text), "broken", broken[name]))
            continue
        v = values.get(name)
        out.append(RuleVerdict(name, str(text), "keeps" if v is True else
                               "removes" if v is False else "removes: NULL"))
    return out, all(r.verdict == "keeps" for r in out)


def _ids_where(ds: lance.LanceDataset, where: str) -> list[int]:
    t = ds.to_table(columns=["id"], filter=where)
    return sorted(t.column("id").to_pylist())


def _cluster(kind: str, key, ids: list[int], doc_id: int, kept: int | None, detail: str = ""
             ) -> Cluster:
    kept = kept if kept is not None else (ids[0] if ids else doc_id)
    return Cluster(kind, key, len(ids), ids[:MAX_MEMBERS], kept, kept == doc_id, detail)


def _exact_cluster(ds: lance.LanceDataset, doc_id: int, row: dict, text: str | None,
                   candidates: list[int] | None) -> Cluster:
    """The documents whose whitespace-normalised text equals this one's (``is_dup``'s rule):
    by the stored ``text_hash`` where ``dedup_flag`` wrote it, the text hashed here for rows it
    has not written yet. Without the column, looked for among ``candidates`` (its
    near-duplicate cluster, which holds every exact copy of a document with words) or the
    whole version."""
    from lance_assets.curation.dedup_flag import text_hashes

    mine = text_hashes(pa.array([text], pa.string()))[0]
    same = []
    hashed = keys.TEXT_HASH in ds.schema.names
    if hashed:
        stored = pa.scalar(mine.tobytes(), ds.schema.field(keys.TEXT_HASH).type)
        for batch in ds.to_batches(columns=["id", keys.TEXT_HASH],
                                   filter=f"{keys.TEXT_HASH} IS NOT NULL"):
            hit = pc.equal(batch.column(keys.TEXT_HASH), stored)
            same += pc.filter(batch.column("id"), hit).to_pylist()
        where = f"{keys.TEXT_HASH} IS NULL"
    else:
        where = f"id IN ({', '.join(str(int(i)) for i in candidates)})" if candidates else None
    for batch in ds.to_batches(columns=["id", "text"], filter=where):
        h = text_hashes(batch.column("text"))
        ids = batch.column("id").to_pylist()
        same += [ids[i] for i in range(batch.num_rows) if (h[i] == mine).all()]
    same.sort()
    detail = "is_dup = " + str(row.get(keys.IS_DUP)) if keys.IS_DUP in row else \
        "`is_dup` not computed"
    return _cluster("exact", None, same, doc_id, same[0] if same else doc_id, detail)


def _duplicates(ds: lance.LanceDataset, doc_id: int, row: dict, text: str | None
                ) -> list[Cluster]:
    out = []
    near_members = None
    if row.get("near_dup_cluster") is not None:
        c = int(row["near_dup_cluster"])
        near_members = _ids_where(ds, f"near_dup_cluster = {c}")
        first_kept = _ids_where(ds, f"near_dup_cluster = {c} AND NOT near_dup")
        out.append(_cluster("near", c, near_members, doc_id,
                            first_kept[0] if first_kept else None,
                            f"near_dup = {row.get(keys.NEAR_DUP)}"))
    has_words = row.get("minhash_bands") is not None
    out.insert(0, _exact_cluster(ds, doc_id, row, text,
                                 near_members if near_members and has_words else None))
    if row.get("semantic_rep") is not None:
        rep = int(row["semantic_rep"])
        members = _ids_where(ds, f"semantic_rep = {rep}")
        cos = row.get("semantic_cos")
        out.append(_cluster("semantic", rep, members, doc_id, rep,
                            f"semantic_dup = {row.get('semantic_dup')}"
                            + (f", best cosine with an earlier document {cos:.3f}"
                               if cos is not None
                               else "")))
    return out


def _read_json(path) -> dict | None:
    try:
        if not path.is_file():
            return None
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def _children(folder) -> list:
    try:
        return sorted(p for p in folder.iterdir() if p.is_dir())
    except (FileNotFoundError, NotADirectoryError):
        return []


def _open(table: Table, tag: str | None, version: int | None) -> lance.LanceDataset | None:
    """A tagged version, through its tag while it still names ``version``; None when gone."""
    if tag is None and version is None:
        return None
    try:
        return table.choose(tag, version=version).dataset
    except VersionChoiceError:
        return None


def _runs(table: Table, doc_id: int) -> list[RunVerdict]:
    """Every training run and ablation arm on record, and every other tag."""
    root = table.root
    out: list[RunVerdict] = []
    seen_tags: set[str] = set()
    for run in _children(paths.train_dir(root)):
        info = _read_json(run / "summary.json")
        if not info or "table_version" not in info:
            continue
        tag = info.get("table_tag") or None
        version = int(info["table_version"])
        v = _verdict(table, doc_id, "run", run.name, tag, version, info.get("filter") or "")
        _read(v, doc_id, [run], "the run")
        out.append(v)
        seen_tags.add(tag or "")
    ablations = paths.ablation_dir(root, "x").parent
    for folder in _children(ablations):
        plan = _read_json(folder / "plan.json")
        if not plan or "arms" not in plan:
            continue
        tag, version = plan.get("tag"), plan.get("version")
        ds = _open(table, tag, version)
        held = plan.get("held_out")
        for arm in plan["arms"]:
            v = _verdict(table, doc_id, "ablation arm", f"{folder.name}/{arm.get('name')}", tag,
                         version, arm.get("train_filter") or "", ds=ds)
            _read(v, doc_id, _arm_runs(folder, str(arm.get("name"))), "a seed of the arm")
            if held and ds is not None and v.present:
                in_held, _ = _keeps(ds, doc_id, held)
                if in_held:
                    v.note = (v.note + "; " if v.note else "") + \
                        "in the held-out split every arm is evaluated on"
            out.append(v)
        seen_tags.add(tag or "")
    for tag, snap in sorted(table.snapshots.list().items()):
        if tag in seen_tags:
            continue
        ds = _open(table, tag, snap.version)
        present = _present(ds, doc_id) if ds is not None else None
        note = f"owner {snap.owner}, kind {snap.kind}"
        kept = None
        if ds is not None and present:
            from lance_assets.curation.rules import stored_curation, validated_predicate

            try:
                cur = stored_curation(ds)
                if cur is not None:
                    kept = _passes(ds, doc_id, validated_predicate(ds, cur.rules).lance)
                    note += "; 'trained on it': the rules in force at that version keep it"
            except ValueError as e:
                note += f"; rules at that version cannot be read: {str(e).splitlines()[0]}"
        out.append(RunVerdict("snapshot", tag, tag, snap.version, present, kept, "", note))
    return out


def _read(v: RunVerdict, doc_id: int, runs: list, who: str) -> None:
    """``v.read`` from the runs' read records (``table.read_record.read_by``, as ``forget``
    counts them), where every run has one; else it stays None (the filter is the bound)."""
    read = read_by(runs) if (v.trained_on or v.note.startswith("forgotten")) and runs else None
    if read is not None:
        v.read = bool(np.isin(doc_id, read))
        v.note = (v.note + "; " if v.note else "") + (
            f"read by {who}" if v.read else "not read" if v.trained_on is None
            else "kept by its filter, not read")


def _arm_runs(folder, arm: str) -> list:
    """The seed runs of an ablation arm: ``<ablation>/<arm>-<digest>/seed-<n>`` (one digest per
    setting the arm was trained with)."""
    safe = re.sub(r"[^A-Za-z0-9_.-]", "_", arm)  # ablation.plan.arm_folder's name
    return [seed for d in _children(folder) if d.name.rsplit("-", 1)[0] == safe
            for seed in _children(d) if seed.name.startswith("seed-")]


def _verdict(table: Table, doc_id: int, kind: str, name: str, tag: str | None,
             version: int | None, filter_text: str, ds: lance.LanceDataset | None = None
             ) -> RunVerdict:
    ds = ds if ds is not None else _open(table, tag, version)
    if ds is None:
        return RunVerdict(kind, name, tag, version, None, None, filter_text,
                          "that version is gone (its tag was released and a cleanup removed "
                          "it): what it trained on can no longer be read")
    present = _present(ds, doc_id)
    if not present and doc_id in forgotten_ids(table, ds):
        return RunVerdict(kind, name, tag, ds.version, False, None, filter_text,
                          "forgotten: forget redacted it from this snapshot")
    if not present:
        return RunVerdict(kind, name, tag, ds.version, False, False, filter_text,
                          "not in that version")
    if not filter_text:
        return RunVerdict(kind, name, tag, ds.version, True, True, "", "no filter: every row")
    kept, problem = _keeps(ds, doc_id, filter_text)
    return RunVerdict(kind, name, tag, ds.version, True, kept, filter_text, problem)


def _samples(root, doc_id: int) -> list[dict]:
    report = _read_json(paths.reports_dir(root) / "forensics.json")
    out = []
    for i, a in enumerate((report or {}).get("attributions") or []):
        att = a.get("attribution") or {}
        for s in att.get("sources") or []:
            if s.get("id") == doc_id:
                out.append({"sample": i, "prompt": a.get("prompt", ""),
                            "verdict": att.get("verdict", ""), "rank": s.get("rank"),
                            "coverage": s.get("coverage"), "cosine": s.get("cosine"),
                            "longest_span_words": s.get("longest_span_words"),
                            "span": s.get("span", ""),
                            "table_version": att.get("table_version")})
    return out


def explain(table: Table, doc_id: int, *, ref: int | str | None = None) -> Story:
    """The story of document ``doc_id`` (see the module doc). ``ref``: the version or tag whose
    signals and rule verdicts to read (default the newest; ``Table.choose``)."""
    if isinstance(doc_id, bool) or not isinstance(doc_id, int):
        raise ExplainError(f"document id {doc_id!r}: give an integer `id` of the table")
    if not -2**63 <= doc_id < 2**63:
        raise ExplainError(f"document id {doc_id}: ids are 64-bit signed integers (0 to "
                           f"{2**63 - 1}); give an `id` of the table")
    try:
        chosen = table.choose(ref)
    except VersionChoiceError as e:
        raise ExplainError(f"--version {ref}: {e} (leave --version out for the newest)") from None
    ds, tag = chosen.dataset, chosen.tag
    row = _row(ds, doc_id)
    story = Story(id=doc_id, version=ds.version, tag=tag, present=row is not None)
    story.snapshots = _runs(table, doc_id)
    story.samples = _samples(table.root, doc_id)
    story.forgotten = Journal(table).forgotten(doc_id) or {}
    if row is None:
        story.notes.append(f"no row with id {doc_id} at version {ds.version}: never ingested, "
                           "ingested later, deleted or forgotten")
        return story
    text_t = ds.to_table(columns=["text"], filter=_id_filter(doc_id))
    text = text_t.column("text")[0].as_py()
    story.document = {k: row[k] for k in ("url", "source", "dump", "language", "score")
                      if k in row and row[k] is not None}
    story.document["characters"] = len(text or "")
    story.document["excerpt"] = (text or "")[:EXCERPT_CHARS] + \
        ("…" if text and len(text) > EXCERPT_CHARS else "")
    story.signals = _signals(row, _producer_of())
    story.rules, story.kept_by_rules = _rules(ds, doc_id)
    story.removed_by = [r.rule for r in story.rules if r.verdict != "keeps"]
    story.duplicates = _duplicates(ds, doc_id, row, text)
    story.contamination = {k: v for k, v in row.items()
                           if k == "contaminated" or k.startswith("contaminated_")}
    return story


def example_ids(table: Table, samples: int = 3) -> list[int]:
    """Documents worth explaining when none are named: the top source of each generated sample
    the forensics report attributed (up to ``samples``), then the smallest id the curation in
    force removes."""
    out: list[int] = []
    report = _read_json(paths.reports_dir(table.root) / "forensics.json") or {}
    for a in report.get("attributions") or []:
        sources = (a.get("attribution") or {}).get("sources") or []
        if sources and isinstance(sources[0].get("id"), int) and sources[0]["id"] not in out:
            out.append(sources[0]["id"])
        if len(out) >= samples:
            break
    from lance_assets.curation.rules import stored_curation, validated_predicate

    ds = table.newest()
    curation = stored_curation(ds)
    if curation is not None and curation.rules:
        removed = validated_predicate(ds, curation.rules).negated()
        t = ds.to_table(columns=["id"], filter=removed.lance)
        if t.num_rows:
            first = min(t.column("id").to_pylist())
            if first not in out:
                out.append(first)
    return out


def save(table: Table, story: Story) -> tuple[str, str]:
    """``DATA/reports/stories/<id>.md`` and ``.json``; returns their paths."""
    from lance_assets import storage

    folder = paths.reports_dir(table.root) / "stories"
    md, js = folder / f"{story.id}.md", folder / f"{story.id}.json"
    storage.write_atomic(md, (story.markdown() + "\n").encode())
    storage.write_atomic(js, json.dumps(story.to_dict(), indent=2, default=str).encode())
    return str(md), str(js)
