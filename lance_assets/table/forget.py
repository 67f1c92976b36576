"""Removing documents for good: ``forget``.

A delete alone removes rows from the newest version only: every older version, and above all
every tagged snapshot (training runs, ablations), still holds them, and so do the data files
until a compaction rewrites them. ``forget`` goes all the way:

1. **Find** the documents: the predicate (through the same parser as the curation rules, so it
   is data, never SQL pasted into a query) is evaluated on the newest version and on every
   tagged snapshot where its columns exist; their ids are what is forgotten.
2. **Account**: every tagged snapshot that holds one of them, the training run or ablation
   behind it (its folder, its checkpoints, how many of the documents its filter trained on).
3. **Refuse** while a training run still reads one of those snapshots (``Snapshots.using``),
   unless forced.
4. **Delete** the rows (by id, so the set cannot grow between steps), **release** the
   snapshots, **compact** every fragment that held them (the deleted rows are dropped from the
   rewritten files) and **clean up** every version older than now: the old data files go.
   Side stores derived from the columns (``semantic_dup``'s document vectors by cluster, the
   saved row ranges of unwritten fragments) are removed: the next run makes them again.
5. **Verify**: no version left on disk holds any of the ids, and say so.

The report goes to the run's metadata and to an append-only log (``<data>/forget.log.jsonl``).
It names the documents by id count and range, never by text, and the predicate by its sha256
(a predicate such as ``text LIKE '%…%'`` quotes the document). A predicate that matches nothing
changes nothing: no delete, no release, no compaction, no cleanup of old versions.
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from datetime import timedelta
from pathlib import Path

import lance
import numpy as np

from lance_assets import paths, storage
from lance_assets.table import Table
from lance_assets.table.maintenance import (
    SNAPSHOT_PREFIX,
    MaintenanceReport,
    cleanup_versions,
    compact_table,
)
from lance_assets.table.predicate import PredicateError, lance_problem, safe_predicate
from lance_assets.table.read_record import rows_read

ABLATION_PREFIX = "ablation-"
LOG_NAME = "forget.log.jsonl"
ID_CHUNK = 2000


class ForgetError(ValueError):
    """A predicate that cannot be used, or a forget that must not run; the message says why."""


@dataclass
class Holder:
    """A tagged snapshot that held forgotten documents, and what stands behind it."""

    tag: str
    version: int
    rows: int  # forgotten documents in that version
    kind: str = "snapshot"  # run | ablation | snapshot
    name: str = ""  # the run or ablation
    folder: str | None = None
    trained_on: int | None = None  # of ``rows``, those it read (else those its filter kept)
    kept_by_filter: int | None = None  # of ``rows``, those its training filter kept (runs)
    read_record: bool = False  # ``trained_on`` counts what it read (``table.read_record``)
    checkpoints: list[str] = field(default_factory=list)
    permutations: list[str] = field(default_factory=list)  # stored shuffles: they list the ids
    rebuild: str = ""  # what makes its artifacts again without the forgotten documents
    in_use: bool = False


def predicate_digest(predicate: str) -> str:
    """What the log and the run's metadata keep of a predicate: it may quote the documents."""
    return "sha256:" + hashlib.sha256(predicate.encode()).hexdigest()


@dataclass
class ForgetReport:
    predicate: str  # the caller's own text: never written anywhere (``predicate_sha256`` is)
    ids: int = 0
    id_range: list[int] = field(default_factory=list)  # [smallest, largest]
    rows_deleted: int = 0
    holders: list[Holder] = field(default_factory=list)
    released: dict[str, int] = field(default_factory=dict)
    forced: bool = False
    versions_removed: int = 0
    bytes_reclaimed: int = 0
    versions_checked: int = 0
    still_readable: int = 0  # forgotten ids readable from some version after the cleanup
    indexes: list[dict] = field(default_factory=list)  # every index in force, rebuilt
    files_removed: list[dict] = field(default_factory=list)  # {path, rebuild}: quoted them
    artifacts: list[dict] = field(default_factory=list)  # {path, rebuild}: may hold them
    version_after: int = 0
    duration_s: float = 0.0

    @property
    def runs(self) -> list[str]:
        return [h.name for h in self.holders if h.kind == "run"]

    @property
    def predicate_sha256(self) -> str:
        return predicate_digest(self.predicate)

    def to_dict(self) -> dict:
        """What is recorded (the log, the run's metadata): the predicate as its digest."""
        out = {**asdict(self), "runs": self.runs, "predicate_sha256": self.predicate_sha256}
        del out["predicate"]
        return out

    def markdown(self) -> str:
        if not self.ids:
            return (f"No document matches the predicate ({self.predicate_sha256[:19]}…): nothing "
                    f"was deleted, released or cleaned up; version {self.version_after} and every "
                    "version before it are as they were.")
        lines = [f"Forgot **{self.ids:,} document(s)** matching the predicate "
                 f"({self.predicate_sha256[:19]}…) "
                 f"({self.rows_deleted:,} deleted from the newest version). "
                 f"{len(self.released)} snapshot(s) released; cleanup removed "
                 f"{self.versions_removed} version(s), {self.bytes_reclaimed / 1e6:,.1f} MB. "
                 f"Checked {self.versions_checked} version(s) left on disk: "
                 + ("none holds a forgotten document." if not self.still_readable else
                    f"**{self.still_readable} forgotten document(s) still readable**.")]
        for i in self.indexes:
            lines.append(f"- index `{i['name']}` ({i['type']} on `{i['column']}`): rebuilt over "
                         f"{i['rows']:,} rows, none of them forgotten")
        for f in self.files_removed:
            lines.append(f"- removed `{f['path']}` (it quoted a forgotten document); "
                         f"rebuild: `{f['rebuild']}`")
        for a in self.artifacts:
            lines.append(f"- `{a['path']}` was made from documents including forgotten ones and "
                         f"cannot be edited; rebuild: `{a['rebuild']}`")
        if self.holders:
            lines.append("\n| snapshot | version | held | kind | name | read by it | kept by "
                         "its filter | checkpoints |\n|---|---|---|---|---|---|---|---|")
            lines += [f"| `{h.tag}` | {h.version} | {h.rows} | {h.kind} | {h.name} | "
                      f"{h.trained_on if h.read_record else '(no record)'} | "
                      f"{'' if h.kept_by_filter is None else h.kept_by_filter} | "
                      f"{len(h.checkpoints)} |" for h in self.holders]
            lines += [f"- `{h.name}`: its {len(h.checkpoints)} checkpoint(s) and "
                      f"{len(h.permutations)} stored shuffle(s) hold what it learned from or "
                      f"read; rebuild: `{h.rebuild}`" for h in self.holders if h.rebuild]
        return "\n".join(lines)


def _id_filters(ids: np.ndarray) -> list[str]:
    """``id IN (...)`` filters over chunks of ``ids`` (integers only: nothing user-typed)."""
    return [f"id IN ({','.join(str(int(i)) for i in ids[lo:lo + ID_CHUNK])})"
            for lo in range(0, len(ids), ID_CHUNK)]


def _count(ds: lance.LanceDataset, filters: list[str], extra: str | None = None) -> int:
    return sum(ds.count_rows(filter=f if extra is None else f"({f}) AND ({extra})")
               for f in filters)


def _matching_ids(ds: lance.LanceDataset, where: str) -> np.ndarray | None:
    """Ids matching ``where`` in ``ds``, or None when the predicate does not apply there (a
    column it names is not in that version)."""
    try:
        pred = safe_predicate(where, ds.schema.names)
    except PredicateError:
        return None
    if lance_problem(ds, pred):
        return None
    return ds.to_table(columns=["id"], filter=pred.lance).column("id").to_numpy()


def _holder(table: Table, tag: str, version: int, rows: int) -> Holder:
    h = Holder(tag, version, rows)
    h.in_use = table.snapshots.in_use(tag)
    root = storage.location(table.root)
    if tag.startswith(SNAPSHOT_PREFIX):
        h.kind, h.name = "run", tag[len(SNAPSHOT_PREFIX):]
        folder = paths.run_dir(root, h.name)
        h.folder = str(folder)
        if folder.is_dir():
            h.checkpoints = sorted(str(p) for p in folder.iterdir()
                                   if p.name.startswith("ckpt_") and p.name.endswith(".pt"))
            summary = folder / "summary.json"
            if not summary.is_file() and storage.is_object_store(folder):
                h.in_use = True  # no lock there: a run without its summary may still train
        h.rebuild = (MATERIALIZE.format("pretrained_model") + " --config-json '{\"ops\": "
                     f"{{\"pretrained_model\": {{\"config\": {{\"run_name\": \"{h.name}\"}}}}}}}}'"
                     " (a new run on the table as it is now; remove the old folder)")
    elif tag.startswith(ABLATION_PREFIX):
        h.kind, h.name = "ablation", tag[len(ABLATION_PREFIX):]
        folder = paths.ablation_dir(root, h.name)
        h.folder = str(folder)
        if folder.is_dir():  # every arm's runs: <arm>/<seed>/ckpt_*.pt
            h.checkpoints = sorted(str(p) for p in folder.rglob("ckpt_*.pt"))
        h.rebuild = (MATERIALIZE.format("curation_ablation") + " (a new ablation on the table "
                     "as it is now; remove the old folder)")
    else:
        return h
    if folder.is_dir():
        h.permutations = sorted(str(p.parent) for p in folder.rglob("permutation.json"))
    return h


def _read_by(folders: list) -> np.ndarray | None:
    """The ids read by the finished runs in ``folders`` (``table.read_record``); None when one
    has no exact record (killed between checkpoints, or from before records)."""
    read = []
    for folder in folders:
        if not (folder / "summary.json").is_file():
            return None
        got = rows_read(folder)
        if got is None:
            return None
        read.append(got)
    return np.unique(np.concatenate(read)) if read else None


def _trained_on(table: Table, h: Holder, ds: lance.LanceDataset, filters: list[str],
                ids: np.ndarray) -> None:
    """Of the forgotten documents in ``h``'s version: those its runs read (their records) and
    those a run's training filter kept (its summary)."""
    if h.folder is None:
        return
    folder = storage.location(h.folder)
    if h.kind == "ablation":
        runs = sorted({p.parent for p in folder.rglob("summary.json")}) if folder.is_dir() else []
    elif h.kind == "run":
        runs = [folder]
    else:
        return
    read = _read_by(runs) if runs else None
    if h.kind == "run":
        summary = folder / "summary.json"
        try:
            train_filter = json.loads(summary.read_text()).get("filter")
        except (FileNotFoundError, ValueError):
            train_filter = None
        else:  # the run's own filter, validated when it trained; checked again all the same
            try:
                pred = safe_predicate(train_filter, ds.schema.names) if train_filter else None
            except PredicateError:
                pass
            else:
                h.kept_by_filter = _count(ds, filters, pred.lance if pred else None)
    if read is not None:
        held = ids[np.isin(ids, ds.to_table(columns=["id"], filter=" OR ".join(
            f"({f})" for f in filters)).column("id").to_numpy())]
        h.trained_on, h.read_record = int(np.isin(held, read).sum()), True
    else:
        h.trained_on = h.kept_by_filter


def forget(table: Table | str | Path, where: str, *, force: bool = False,
           log: Callable[[str], None] = print) -> ForgetReport:
    """Remove the documents ``where`` selects from every version on disk (module docstring)."""
    start = time.perf_counter()
    table = Table.of(table)
    newest = table.newest()
    try:
        pred = safe_predicate(where, newest.schema.names)
    except PredicateError as e:
        raise ForgetError(f"forget --where: {e}") from None
    problem = lance_problem(newest, pred)
    if problem:
        raise ForgetError(f"forget --where {where!r}: {problem}")
    report = ForgetReport(predicate=pred.source, forced=force)

    # 1. the documents: in the newest version and in every snapshot
    snaps = table.snapshots.list()
    found = [newest.to_table(columns=["id"], filter=pred.lance).column("id").to_numpy()]
    opened = {}
    for tag in snaps:
        opened[tag] = table.open(tag)
        got = _matching_ids(opened[tag], where)
        if got is not None:
            found.append(got)
    ids = np.unique(np.concatenate(found)).astype(np.int64)
    report.ids = len(ids)
    if len(ids):
        report.id_range = [int(ids[0]), int(ids[-1])]
    filters = _id_filters(ids)
    log(f"forget: {len(ids):,} document(s) match the predicate ({report.predicate_sha256[:19]}…)")

    # 2. who holds them
    for tag, snap in sorted(snaps.items()):
        if not filters:
            break
        rows = _count(opened[tag], filters)
        if rows:
            holder = _holder(table, tag, snap.version, rows)
            _trained_on(table, holder, opened[tag], filters, ids)
            report.holders.append(holder)
    busy = [h.tag for h in report.holders if h.in_use]
    if busy and not force:
        raise ForgetError(
            f"forget ({report.predicate_sha256[:19]}…): snapshot(s) {', '.join(busy)} hold some of the "
            f"{len(ids):,} document(s) and a running training run still reads them. Wait for it "
            "to finish (or cancel it), or pass force to release them anyway (the run then fails "
            "on its next read of a removed file).")

    if not filters:  # nothing matches: nothing changes, not even old versions
        report.version_after = newest.version
        report.duration_s = time.perf_counter() - start
        _log(table, report)
        log(report.markdown())
        return report

    texts = _texts(newest, filters) + [t for tag in opened for t in _texts(opened[tag], filters)]
    fingerprints = shingles(texts)

    # 3. delete, release, compact, clean up
    if filters:
        before = newest.count_rows()
        for f in filters:
            table.commit("forget: delete", lambda d, f=f: d.delete(f), log=log)
        report.rows_deleted = before - table.newest().count_rows()
    for h in report.holders:
        try:
            report.released[h.tag] = table.snapshots.release(h.tag)
        except ValueError:
            pass  # released meanwhile
        log(f"forget: released {h.tag} (version {h.version}, {h.rows} document(s))")
    holding = {f.fragment_id for f in table.newest().get_fragments()
               if f.metadata.deletion_file is not None}
    maint = MaintenanceReport()
    compact_table(table, include=holding, report=maint, log=log)
    report.indexes = rebuild_indexes(table, log)  # before the cleanup: it removes the old ones
    cleanup_versions(table, timedelta(0), maint, log)
    report.files_removed = scrub_files(storage.location(table.root), fingerprints,
                                       {str(int(i)) for i in ids}, log)
    partial = paths.partials_dir(table.root)
    if filters and storage.remove_tree(partial) > 0:  # vectors of unwritten fragments: a cache
        report.files_removed.append({"path": str(partial), "rebuild": "the next run of "
                                     "`embeddings` / `chunk_embeddings` embeds those rows again"})
        log(f"forget: removed {partial} (row ranges saved for fragments not written yet)")
    side = paths.semantic_dup_dir(table.root)
    if filters and storage.remove_tree(side) > 0:  # document vectors by cluster: derived
        report.files_removed.append({"path": str(side), "rebuild": "the next run of "
                                     "`semantic_dup` makes it again from the table's columns"})
        log(f"forget: removed {side} (semantic_dup's side store: it held their vectors)")
    report.artifacts = artifacts(storage.location(table.root))
    report.versions_removed, report.bytes_reclaimed = maint.versions_removed, maint.bytes_reclaimed

    # 4. verify: no version left on disk reads any of them, no index in force covers them
    final = table.newest()
    report.version_after = final.version
    for v in final.versions():
        report.versions_checked += 1
        if filters:
            report.still_readable += _count(table.open(int(v["version"])), filters)
    rows = final.count_rows()
    for i in report.indexes:
        i["indexed_rows_now"] = next((d.num_rows_indexed for d in final.describe_indices()
                                      if d.name == i["name"]), 0)
        if i["indexed_rows_now"] > rows:
            report.still_readable += i["indexed_rows_now"] - rows
    report.duration_s = time.perf_counter() - start
    _log(table, report)
    log(report.markdown())
    return report


def _log(table: Table, report: ForgetReport) -> None:
    """One line of ``forget.log.jsonl``: ids' count and range, the predicate's digest."""
    storage.append_text(storage.location(table.root) / LOG_NAME, json.dumps(
        {"at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), **report.to_dict()},
        sort_keys=True, default=str) + "\n")


# ---------------------------------------------------------------------------- beyond the table

SHINGLE_WORDS = 8
# Files under the data root that may quote documents, and the asset that writes them again.
QUOTING = ("reports", "samples")
WRITER = {"stories": "document_stories", "forensics": "forensics", "samples": "samples",
          "corpus_profile": "curation_profile"}
TEXT_SUFFIXES = (".md", ".json", ".jsonl", ".txt", ".csv", ".html")
MATERIALIZE = "dagster asset materialize -m lance_assets.definitions --select {}"


def _texts(ds: lance.LanceDataset, filters: list[str]) -> list[str]:
    if "text" not in ds.schema.names:
        return []
    return [t for f in filters for t in ds.to_table(columns=["text"], filter=f)
            .column("text").to_pylist() if t]


def _windows(words: list[str], k: int) -> Iterator[int]:
    return (hash(" ".join(words[i:i + k])) for i in range(len(words) - k + 1))


def shingles(texts: list[str]) -> dict[int, set[int]]:
    """``{k: hashes}`` of every run of SHINGLE_WORDS words of ``texts`` (k = SHINGLE_WORDS), or
    of the whole text when it is shorter (k = its words): what a file quoting one of them holds,
    whatever it cut or wrapped around the quote. Hashes live in this process only."""
    out: dict[int, set[int]] = {}
    for text in texts:
        words = text.split()
        k = min(SHINGLE_WORDS, len(words))
        if k:
            out.setdefault(k, set()).update(_windows(words, k))
    return out


def _strings(value) -> Iterator[str]:
    if isinstance(value, str):
        yield value
    elif isinstance(value, dict):
        for v in value.values():
            yield from _strings(v)
    elif isinstance(value, list):
        for v in value:
            yield from _strings(v)


def _plain_text(path, raw: str) -> str:
    """A file's text as a reader sees it: a JSON file's strings unescaped."""
    if path.name.endswith((".json", ".jsonl")):
        try:
            docs = [json.loads(raw)] if path.name.endswith(".json") else \
                [json.loads(line) for line in raw.splitlines() if line.strip()]
            return "\n".join(s for d in docs for s in _strings(d))
        except ValueError:
            pass
    return raw


def quotes(text: str, fingerprints: dict[int, set[int]]) -> bool:
    words = text.split()
    return any(h in hashes for k, hashes in fingerprints.items() for h in _windows(words, k))


def _writer(root, path) -> str:
    rel = path.relative_to(root).parts
    key = rel[1] if len(rel) > 2 else (rel[0] if rel[0] == "samples" else path.stem)
    return WRITER.get(key, key)


def scrub_files(root, fingerprints: dict[int, set[int]], ids: set[str],
                log: Callable[[str], None]) -> list[dict]:
    """Remove every file under the data root's reports and samples that quotes a forgotten
    document (eight words of it in a row, or all of a shorter one), and every story named by a
    forgotten id; returns what was removed and the asset that writes it again."""
    removed = []
    for folder in QUOTING:
        base = root / folder
        if not base.is_dir():
            continue
        for path in sorted(base.rglob("*")):
            if not path.is_file() or not path.name.endswith(TEXT_SUFFIXES):
                continue
            named = path.parent.name == "stories" and path.stem in ids
            try:
                hit = named or quotes(_plain_text(path, path.read_text(errors="replace")),
                                      fingerprints)
            except FileNotFoundError:
                continue
            if hit:
                path.unlink()
                removed.append({"path": str(path),
                                "rebuild": MATERIALIZE.format(_writer(root, path))})
                log(f"forget: removed {path} (it quoted a forgotten document)")
    return removed


def artifacts(root) -> list[dict]:
    """Artifacts made from the documents that cannot be edited: a corpus tokenizer (a BPE
    learns its merges from every document it reads)."""
    out = []
    pointer = paths.tokenizers_dir(root) / "LATEST"
    if pointer.is_file():
        out.append({"path": str(paths.tokenizers_dir(root) / f"{pointer.read_text().strip()}.json"),
                    "rebuild": MATERIALIZE.format("tokenizer")})
    return out


def rebuild_indexes(table: Table, log: Callable[[str], None]) -> list[dict]:
    """Build every index in force again over the table as it is now, with the same kind and
    parameters: an index keeps what it was built from (BM25's token dictionary and postings,
    a vector index's centroids and codes) even after its rows are deleted and remapped."""
    ds = table.newest()
    out = []
    for desc in ds.describe_indices():
        name, column = desc.name, desc.field_names[0]
        stats = ds.stats.index_stats(name)
        kind = str(stats.get("index_type", ""))
        detail = (stats.get("indices") or [{}])[0]
        if kind.upper().startswith("IVF"):
            kwargs = {"metric": detail.get("metric_type", "l2"),
                      "num_partitions": int(detail.get("num_partitions") or 1)}
            sub = detail.get("sub_index") or {}
            if "num_sub_vectors" in sub and "PQ" in kind.upper():
                kwargs["num_sub_vectors"] = int(sub["num_sub_vectors"])

            def build(d, column=column, kind=kind, name=name, kwargs=kwargs):
                return d.create_index(column, kind.upper(), name=name, replace=True, **kwargs)
        else:
            scalar = "INVERTED" if kind.lower() == "inverted" else kind.upper()

            def build(d, column=column, scalar=scalar, name=name):
                return d.create_scalar_index(column, scalar, name=name, replace=True)
        table.commit(f"forget: rebuild index {name}", build, log=log)
        rows = next(d.num_rows_indexed for d in table.newest().describe_indices() if d.name == name)
        out.append({"name": name, "type": kind, "column": column, "rows": rows})
        log(f"forget: index {name} rebuilt over {rows:,} rows")
    return out
