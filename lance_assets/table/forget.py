"""Removing documents for good: ``forget``, a journaled operation that a rerun finishes.

1. **Find** the documents: the predicate (the curation rules' parser: data, never SQL) is
   evaluated on every version on disk, of every branch, tagged or not, where its columns exist:
   an operator's own delete, or an earlier forget that died, hides nothing. The holders are the
   snapshots whose version reads one of them or keeps one in its data files.
2. **Guard** (``forget_guard``): more than ``max_share`` of the most rows a version on disk
   holds, or all of them, is refused without an explicit setting; ``dry_run`` reports what
   would go and changes nothing; a snapshot a running training run reads is not redacted or
   released unless forced.
3. **Journal** the ids (``forget_journal``) before anything changes, then each phase: remove
   the files that quote them (reports, stories, samples: read while the texts still exist);
   delete the rows; release the holders ``release`` names; rewrite every fragment whose data
   files still hold one (compaction); redact every other holder (``redact``: a copy on a branch
   of its own under the same tag, each step journaled); rebuild every index in force; clean up
   every untagged old version; reset the side stores made from the columns.
4. **Verify** through Lance: no version of any branch reads one of them and no data file such
   a version references holds one. A concurrent writer that keeps changing a fragment is met by
   another round; after ``ROUNDS`` the forget fails and says so, and the journal keeps it
   pending.

Every forget first finishes the pending ones. The report goes to the run's metadata and to
``<data>/forget.log.jsonl`` (ids' count and range, the predicate's sha256, the snapshots
redacted and released, the versions its cleanup removed: never text).
"""
from __future__ import annotations

import hashlib
import json
import shlex
import time
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field, fields
from datetime import timedelta

import lance
import numpy as np

from lance_assets import paths, storage
from lance_assets.table import Table, is_version_gone, redact
from lance_assets.table.forget_files import (  # noqa: F401 - quotes, shingles: the helpers' API
    MATERIALIZE,
    artifacts,
    quotes,
    scrub_files,
    shingles,
    texts,
)
from lance_assets.table.forget_guard import (  # noqa: F401 - MAX_SHARE: the callers' default
    MAX_SHARE,
    ForgetError,
    made_by_hand,
    share_problem,
    unknown_release,
)
from lance_assets.table.forget_journal import DONE, Journal, Planned
from lance_assets.table.forget_log import LOG_NAME
from lance_assets.table.forget_scan import (
    Scanner,
    count,
    each_version,
    id_filters,
    largest_version,
    matching_ids,
    versions_on_disk,
)
from lance_assets.table.maintenance import (
    SNAPSHOT_PREFIX,
    MaintenanceReport,
    cleanup_versions,
    compact_table,
    rebuild_indexes,
)
from lance_assets.table.predicate import PredicateError, lance_problem, safe_predicate
from lance_assets.table.read_record import read_by
from lance_assets.table.redact import versions_of
from lance_assets.table.side import reset_side_folder
from lance_assets.table.snapshots import ABLATION_PREFIX

ROUNDS = 3  # rewrite, cleanup and verify rounds before a forget racing writers gives up
SAMPLE_URLS = 5


@dataclass
class Holder:
    """A tagged snapshot that held forgotten documents, and what stands behind it."""

    tag: str
    version: int
    rows: int  # forgotten documents that version reads
    in_files: int = 0  # of its fragments, those whose data files keep one behind a deletion
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
    by_hand: bool = False  # made or named by a user (redacted all the same, unless named)
    branch: str | None = None  # the branch its version is on (an earlier redaction's)


def predicate_digest(predicate: str) -> str:
    """What the log and the run's metadata keep of a predicate: it may quote the documents."""
    return "sha256:" + hashlib.sha256(predicate.encode()).hexdigest()


@dataclass
class ForgetReport:
    predicate: str  # the caller's own text: never written anywhere (``predicate_sha256`` is)
    ids: int = 0
    id_range: list[int] = field(default_factory=list)  # [smallest, largest]
    rows_deleted: int = 0
    live: int = 0  # of them, rows of the newest version when the forget started
    table_rows: int = 0  # rows of the newest version when the forget started
    largest_rows: int = 0  # the most live rows a version on disk holds: what shares are of
    largest_version: int = 0  # that version
    share: float = 0.0  # ids / largest_rows
    release: list[str] = field(default_factory=list)  # snapshots to release, not redact
    refused: list[str] = field(default_factory=list)  # dry run: why a forget would be refused
    holders: list[Holder] = field(default_factory=list)
    released: dict[str, int] = field(default_factory=dict)
    redacted: dict[str, dict] = field(default_factory=dict)  # tag -> its copy (``redact``)
    forced: bool = False
    dry_run: bool = False
    sample: list[str] = field(default_factory=list)  # dry run: a few urls (or ids) that go
    resumed: list[dict] = field(default_factory=list)  # interrupted forgets finished first
    pending: list[dict] = field(default_factory=list)  # dry run: interrupted forgets waiting
    rounds: int = 0
    versions_removed: int = 0
    removed_versions: list[list[int]] = field(default_factory=list)  # [first, last]: its cleanup's
    bytes_reclaimed: int = 0
    versions_checked: int = 0
    still_readable: int = 0  # forgotten ids readable from some version after the cleanup
    still_in_files: int = 0  # fragments of versions on disk whose data files keep one
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
        lines = [f"Finished an interrupted forget of {r['ids']:,} document(s) (journal `{r['op']}`"
                 f"): {r['still_readable']} readable, {r['still_in_files']} fragment(s) holding "
                 "them left." for r in self.resumed]
        lines += [f"An interrupted forget of {p['ids']:,} document(s) is pending (journal "
                  f"`{p['op']}`): the next forget finishes it." for p in self.pending]
        digest = f"({self.predicate_sha256[:19]}…)"
        if self.dry_run:
            lines.append(f"Dry run: **{self.ids:,} document(s)** match the predicate {digest} in "
                         f"the versions on disk, {self.share:.0%} of the {self.largest_rows:,} "
                         f"rows the largest version on disk holds (version "
                         f"{self.largest_version}); {self.live:,} of them in the newest "
                         f"version's {self.table_rows:,} rows. Nothing was changed. Would "
                         "redact: " + (", ".join(
                             f"`{h.tag}`" + (" (made or named by a user)" if h.by_hand else "")
                             for h in self.holders if h.tag not in self.release) or "no "
                                       "snapshot") + "; release: " + (", ".join(
                             f"`{t}`" for t in self.release) or "none")
                         + ". Sample: " + (", ".join(f"`{s}`" for s in self.sample) or "none"))
            lines += [f"A forget would be refused: {why}" for why in self.refused]
        elif not self.ids:
            lines.append(f"No document matches the predicate {digest} in any version on disk: "
                         f"nothing was deleted, released or cleaned up; version "
                         f"{self.version_after} and every version before it are as they were.")
            return "\n".join(lines)
        else:
            lines.append(
                f"Forgot **{self.ids:,} document(s)** matching the predicate {digest} "
                f"({self.rows_deleted:,} deleted from the newest version). "
                f"{len(self.redacted)} snapshot(s) redacted (each keeps every other row, "
                f"under its tag), {len(self.released)} released; cleanup removed "
                f"{self.versions_removed} version(s), {self.bytes_reclaimed / 1e6:,.1f} MB. "
                f"Checked {self.versions_checked} version(s) left on disk, their rows and "
                "data files: " + ("none holds a forgotten document." if not (
                    self.still_readable or self.still_in_files) else
                    f"**{self.still_readable} still readable, {self.still_in_files} "
                    "fragment(s) keep them**."))
        for i in self.indexes:
            lines.append(f"- index `{i['name']}` ({i['type']} on `{i['column']}`): rebuilt over "
                         f"{i['rows']:,} rows, none of them forgotten")
        for f in self.files_removed:
            lines.append(f"- removed `{f['path']}` (it quoted a forgotten document or held its "
                         f"vector); rebuild: `{f['rebuild']}`")
        for a in self.artifacts:
            lines.append(f"- `{a['path']}` was made from documents including forgotten ones and "
                         f"cannot be edited; rebuild: `{a['rebuild']}`")
        if self.holders:
            lines.append("\n| snapshot | version | held | in data files | kind | name | read by "
                         "it | kept by its filter | checkpoints |\n|---|---|---|---|---|---|---|"
                         "---|---|")
            lines += [f"| `{h.tag}` | {h.version} | {h.rows} | {h.in_files} | {h.kind} | {h.name}"
                      f" | {h.trained_on if h.read_record else '(no record)'} | "
                      f"{'' if h.kept_by_filter is None else h.kept_by_filter} | "
                      f"{len(h.checkpoints)} |" for h in self.holders]
            lines += [f"- `{h.name}`: its {len(h.checkpoints)} checkpoint(s) and "
                      f"{len(h.permutations)} stored shuffle(s) hold what it learned from or "
                      f"read; rebuild: `{h.rebuild}`" for h in self.holders if h.rebuild]
        return "\n".join(lines)


def _rm(folder) -> str:
    """The first half of a rebuild command: an old run folder goes first (a run would resume
    from its checkpoints, an ablation reuse its finished arms)."""
    return "" if storage.is_object_store(folder) else f"rm -rf {shlex.quote(str(folder))} && "


def _holder(table: Table, tag: str, version: int, rows: int) -> Holder:
    h = Holder(tag, version, rows)
    h.in_use = table.snapshots.in_use(tag)
    h.by_hand = made_by_hand(table.snapshots.get(tag))
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
        h.rebuild = _rm(folder) + MATERIALIZE.format("pretrained_model") + " --config-json '" + \
            json.dumps({"ops": {"pretrained_model": {"config": {"run_name": h.name}}}}) + "'"
    elif tag.startswith(ABLATION_PREFIX):
        h.kind, h.name = "ablation", tag[len(ABLATION_PREFIX):]
        folder = paths.ablation_dir(root, h.name)
        h.folder = str(folder)
        if folder.is_dir():  # every arm's runs: <arm>/<seed>/ckpt_*.pt
            h.checkpoints = sorted(str(p) for p in folder.rglob("ckpt_*.pt"))
        h.rebuild = _rm(folder) + MATERIALIZE.format("curation_ablation") + ("" if h.name.startswith(
            "data-") else " --config-json '" + json.dumps(
                {"ops": {"curation_ablation": {"config": {"name": h.name}}}}) + "'")
    else:
        return h
    if folder.is_dir():
        h.permutations = sorted(str(p.parent) for p in folder.rglob("permutation.json"))
    return h


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
    read = read_by(runs) if runs else None
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
                h.kept_by_filter = count(ds, filters, pred.lance if pred else None)
    if read is not None:
        held = ids[np.isin(ids, ds.to_table(columns=["id"], filter=" OR ".join(
            f"({f})" for f in filters)).column("id").to_numpy())]
        h.trained_on, h.read_record = int(np.isin(held, read).sum()), True
    else:
        h.trained_on = h.kept_by_filter


def _holders(table: Table, ids: np.ndarray, scanner: Scanner) -> list[Holder]:
    """Every tagged snapshot whose version reads one of ``ids`` or keeps one in its files."""
    filters = id_filters(ids)
    out = []
    for tag, snap in sorted(table.snapshots.list().items()):
        try:
            ds = table.open(tag)
            rows, kept = scanner.holds(ds, ids, snap.branch)
        except Exception as exc:  # noqa: BLE001 - released and cleaned up meanwhile: holds nothing
            if isinstance(exc, (OSError, ValueError)) or is_version_gone(exc):
                continue
            raise
        if rows or kept:
            holder = _holder(table, tag, snap.version, rows)
            holder.branch = snap.branch
            holder.in_files = len(kept)
            if rows:
                _trained_on(table, holder, ds, filters, ids)
            else:
                holder.trained_on, holder.kept_by_filter = 0, 0
            out.append(holder)
    return out


def _sample(table: Table, ids: np.ndarray) -> list[str]:
    """A few urls of the documents (their ids where the table has no url), for a dry run."""
    for ds in reversed(list(versions_on_disk(table))):
        col = "url" if "url" in ds.schema.names else "id"
        got = ds.to_table(columns=[col], filter=id_filters(ids[:SAMPLE_URLS])[0])
        if got.num_rows:
            return [str(v) for v in got.column(col).to_pylist()]
    return [str(int(i)) for i in ids[:SAMPLE_URLS]]


def forget(table: Table, where: str, *, force: bool = False, dry_run: bool = False,
           max_share: float = MAX_SHARE, allow_all: bool = False, release: Iterable[str] = (),
           log: Callable[[str], None] = print) -> ForgetReport:
    """Remove the documents ``where`` selects from every version on disk (module docstring).
    ``release``: snapshots made or named by a user that it may release (``forget_guard``)."""
    start = time.perf_counter()
    newest = table.newest()
    release = sorted(set(release))
    try:
        pred = safe_predicate(where, newest.schema.names)
    except PredicateError as e:
        raise ForgetError(f"forget --where: {e}") from None
    problem = lance_problem(newest, pred)
    if problem:
        raise ForgetError(f"forget --where {where!r}: {problem}")
    if not 0 < max_share <= 1:
        raise ForgetError(f"forget --max-share {max_share}: a share of the table's rows in (0, "
                          "1], e.g. 0.1")
    problem = unknown_release(newest.tags.list(), release)
    if problem:
        raise ForgetError(problem)
    report = ForgetReport(predicate=pred.source, forced=force, dry_run=dry_run, release=release)
    journal = Journal(table)
    for planned in journal.pending():
        if dry_run:
            report.pending.append({"op": planned.op, "ids": len(planned.ids)})
            continue
        log(f"forget: finishing an interrupted forget of {len(planned.ids):,} document(s) "
            f"(journal {planned.op})")
        done = _finish(table, journal, planned, force, log, release=release)
        report.resumed.append({"op": planned.op, "ids": done.ids,
                               "still_readable": done.still_readable,
                               "still_in_files": done.still_in_files})
    newest = table.newest()

    ids = matching_ids(table, pred.source)
    report.ids = len(ids)
    if len(ids):
        report.id_range = [int(ids[0]), int(ids[-1])]
    report.live, report.table_rows = count(newest, id_filters(ids)), newest.count_rows()
    report.largest_rows, report.largest_version = largest_version(table)
    report.share = report.ids / report.largest_rows if report.largest_rows else 0.0
    log(f"forget: {len(ids):,} document(s) match the predicate ({report.predicate_sha256[:19]}…) "
        f"in the versions on disk ({report.share:.0%} of the {report.largest_rows:,} rows of "
        f"the largest version), {report.live:,} of them in the newest version")
    refusals = [share_problem(report, max_share, allow_all)]
    if not dry_run and refusals[0]:  # a dry run reports; a forget refuses before any change
        raise ForgetError(refusals[0])
    scanner = Scanner(table)
    report.holders = _holders(table, ids, scanner) if len(ids) else []
    busy = [h.tag for h in report.holders if h.in_use]
    if busy and not force and not dry_run:
        raise ForgetError(
            f"forget ({report.predicate_sha256[:19]}…): snapshot(s) {', '.join(busy)} hold some "
            f"of the {len(ids):,} document(s) and a running training run still reads them. Wait "
            "for it to finish (or cancel it), or pass force to release them anyway (the run "
            "then fails on its next read of a removed file).")
    if dry_run or not len(ids):  # a dry run, or nothing matches: nothing changes
        if dry_run and len(ids):
            report.sample = _sample(table, ids)
            report.refused = [r for r in refusals if r]
        report.version_after = table.newest().version
        report.duration_s = time.perf_counter() - start
        if not dry_run:
            _log(table, report)
        log(report.markdown())
        return report
    planned = journal.plan(ids, {"predicate_sha256": report.predicate_sha256, "forced": force,
                                 "holders": [asdict(h) for h in report.holders],
                                 "release": release, "live": report.live,
                                 "table_rows": report.table_rows,
                                 "largest_rows": report.largest_rows})
    _finish(table, journal, planned, force, log, report, scanner)
    report.duration_s = time.perf_counter() - start
    log(report.markdown())
    return report


def _finish(table: Table, journal: Journal, planned: Planned, force: bool,
            log: Callable[[str], None], report: ForgetReport | None = None,
            scanner: Scanner | None = None, release: Iterable[str] = ()) -> ForgetReport:
    """Every phase of ``planned`` not finished yet (each one safe to run again), then the
    verification rounds; ``ForgetError`` when writers kept a data file holding one of the ids
    through every round, or a user's snapshot neither the plan nor ``release`` names holds one
    (the journal keeps the operation pending)."""
    ids, filters = planned.ids, id_filters(planned.ids)
    scanner = scanner or Scanner(table)
    force = force or bool(planned.detail.get("forced"))
    if report is None:
        report = ForgetReport(predicate="", forced=force, ids=len(ids),
                              id_range=[int(ids[0]), int(ids[-1])] if len(ids) else [])
        known = {f.name for f in fields(Holder)}
        report.holders = [Holder(**{k: v for k, v in h.items() if k in known})
                          for h in planned.detail.get("holders", [])]
    # what the plan allowed, and what the run finishing it names
    report.release = sorted(set(planned.detail.get("release", [])) | set(release))
    root = storage.location(table.root)
    if not planned.has("files"):  # while the texts are still in the table
        quoted = [t for got in each_version(table, lambda ds: texts(ds, filters)) for t in got]
        removed = scrub_files(root, shingles(list(dict.fromkeys(quoted))),
                              {str(int(i)) for i in ids}, log)
        journal.finish(planned, "files", {"removed": _rebuilds(removed, [
            h for h in report.holders if h.tag in report.release])})
    report.files_removed = list(planned.finished["files"]["removed"])
    if not planned.has("delete"):
        before = table.newest().count_rows()
        for f in filters:
            table.commit("forget: delete", lambda d, f=f: d.delete(f), log=log)
        journal.finish(planned, "delete", {"rows": before - table.newest().count_rows()})
    report.rows_deleted = int(planned.finished["delete"].get("rows", 0))
    maint, removed = MaintenanceReport(), set()
    for report.rounds in range(1, ROUNDS + 1):
        _release(table, report, log)
        holding = set(table.pinned(lambda ds: scanner.holds(ds, ids)[1], what="forget"))
        compact_table(table, include=holding, report=maint, log=log)
        _redact(table, journal, planned, report, scanner, log)  # branches of the clean newest
        if not planned.has("indexes"):  # before the cleanup: it removes the old index files
            journal.finish(planned, "indexes", {"indexes": rebuild_indexes(table, log)})
        on_disk = _versions(table)
        cleanup_versions(table, timedelta(0), maint, log)
        removed |= on_disk - _versions(table)
        report.removed_versions = _spans(removed)
        _side_stores(root, report, log)
        if not _verify(table, report, scanner, ids, force, planned.op, log):
            break
        log(f"forget: round {report.rounds}: {report.still_readable} readable, "
            f"{report.still_in_files} fragment(s) keep forgotten rows (writers changed them "
            "meanwhile); another round")
    else:
        raise ForgetError(
            f"forget (journal {planned.op}): after {ROUNDS} rounds, {report.still_readable} "
            f"forgotten row(s) are still readable and {report.still_in_files} fragment(s) keep "
            "some in their data files: concurrent writers kept changing those fragments. "
            "Nothing is lost; run forget again (it finishes this one) once they are done.")
    report.indexes = planned.finished["indexes"]["indexes"]
    rows = table.newest().count_rows()
    for i in report.indexes:
        i["indexed_rows_now"] = next((d.num_rows_indexed for d in table.newest().describe_indices()
                                      if d.name == i["name"]), 0)
        report.still_readable += max(0, i["indexed_rows_now"] - rows)
    report.artifacts = artifacts(root)
    report.versions_removed += maint.versions_removed
    report.bytes_reclaimed += maint.bytes_reclaimed
    report.version_after = table.newest().version
    _log(table, report)  # before the journal closes it: a kill in between logs it twice
    journal.finish(planned, DONE, {"still_readable": report.still_readable})
    return report


def _side_stores(root, report: ForgetReport, log: Callable[[str], None]) -> None:
    """``semantic_dup``'s store (document vectors: reset under its own state, so a run that
    read the old state fails its switch) and the saved row ranges of unwritten fragments (a
    cache of vectors): the next runs make them again from the columns."""
    store, partial = paths.semantic_dup_dir(root), paths.partials_dir(root)
    gone = [(store, "semantic_dup", reset_side_folder(storage.uri_of(store), log=log)),
            (partial, "embeddings` / `chunk_embeddings", storage.remove_tree(partial))]
    for path, writer, n in gone:
        if n and str(path) not in {f["path"] for f in report.files_removed}:
            report.files_removed.append({"path": str(path), "rebuild": f"the next run of "
                                         f"`{writer}` makes it again from the columns"})
            log(f"forget: removed {path} (it held their vectors)")


def _versions(table: Table) -> set[int]:
    return {int(v["version"]) for v in table.newest().versions()}


def _spans(versions: set[int]) -> list[list[int]]:
    """``{3, 4, 5, 9}`` as ``[[3, 5], [9, 9]]``."""
    out: list[list[int]] = []
    for v in sorted(versions):
        if out and out[-1][1] == v - 1:
            out[-1][1] = v
        else:
            out.append([v, v])
    return out


def _busy(table: Table, report: ForgetReport, tag: str) -> None:
    if not report.forced and table.snapshots.in_use(tag):  # a run started meanwhile
        raise ForgetError(f"forget: snapshot {tag} keeps forgotten rows and a running training "
                          "run reads it; wait for it (or cancel it), or pass force; then run "
                          "forget again (it finishes this one)")


def _redact(table: Table, journal: Journal, planned: Planned, report: ForgetReport,
            scanner: Scanner, log: Callable[[str], None]) -> None:
    """Every holder not released gets its redacted copy under its tag (``redact``), once."""
    ids, filters = planned.ids, id_filters(planned.ids)
    tags = table.newest().tags.list()
    for h in report.holders:
        info = tags.get(h.tag)
        if h.tag in report.release or info is None:
            continue
        if planned.has(f"redact:{h.tag}:clean"):
            report.redacted[h.tag] = planned.finished[f"redact:{h.tag}:tag"]
            continue
        if info.get("branch") != redact.branch_name(planned.op):
            _busy(table, report, h.tag)
        got = redact.redact(
            table, h.tag, planned.op, ids, filters,
            lambda phase, detail, h=h: journal.finish(planned, f"redact:{h.tag}:{phase}", detail),
            lambda ds, frag, b: bool(np.isin(scanner.file_ids(ds, frag, b), ids).any()),
            (planned.finished.get(f"redact:{h.tag}:held") or {}).get("ids"), log)
        if got is not None:
            report.redacted[h.tag] = got


def _release(table: Table, report: ForgetReport, log: Callable[[str], None]) -> None:
    """Release the holders the forget names (``release``): the others are redacted."""
    tags = table.snapshots.list()
    for h in report.holders:
        if h.tag in tags and h.tag in report.release and h.tag not in report.released:
            _busy(table, report, h.tag)
            try:
                report.released[h.tag] = table.snapshots.release(
                    h.tag, "forget: it held documents being forgotten")
            except ValueError:
                continue  # released meanwhile
            log(f"forget: released {h.tag} (version {h.version}, {h.rows} document(s))")


def _verify(table: Table, report: ForgetReport, scanner: Scanner, ids: np.ndarray,
            force: bool, op: str, log: Callable[[str], None]) -> bool:
    """Whether a version on disk, of any branch, still reads one of ``ids`` or references a data
    file that keeps one (a snapshot tagged meanwhile becomes a holder, redacted next round)."""
    holding = scanner.holding(ids)
    report.versions_checked = len(versions_of(table))
    report.still_readable = sum(holding.readable.values())
    report.still_in_files = sum(len(f) for f in holding.behind_deletions.values())
    known = {h.tag for h in report.holders}
    for tag, snap in table.snapshots.list().items():
        at = (snap.branch, snap.version)
        if at in holding.versions and tag not in known:
            h = _holder(table, tag, snap.version, holding.readable.get(at, 0))
            h.branch, h.in_files = snap.branch, len(holding.behind_deletions.get(at, []))
            if h.in_use and not force:
                raise ForgetError(f"forget: snapshot {tag} (tagged while this forget ran) keeps "
                                  "forgotten rows and a running training run reads it; wait for "
                                  "it, or pass force; then run forget again (it finishes this one)")
            report.holders.append(h)
            log(f"forget: {tag} (tagged while this forget ran) keeps forgotten rows; redacting it")
    return bool(holding)


def _rebuilds(removed: list[dict], holders: list[Holder]) -> list[dict]:
    """The forensics report pins the newest model's snapshot: when this forget releases a run's
    snapshot (``holders``: those it releases), only a new model makes the report again
    (``forensics`` alone would find its version gone); a redacted one it reads as it is."""
    if not any(h.kind == "run" for h in holders):
        return removed
    model = MATERIALIZE.format("'pretrained_model*'")
    return [{**f, "rebuild": model} if f["rebuild"].endswith("--select forensics") else f
            for f in removed]


def _log(table: Table, report: ForgetReport) -> None:
    """One line of ``forget.log.jsonl``: ids' count and range, the predicate's digest."""
    storage.append_text(storage.location(table.root) / LOG_NAME, json.dumps(
        {"at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), **report.to_dict()},
        sort_keys=True, default=str) + "\n")
