"""Semantic duplicates from the table's own embeddings (SemDeDup, Abbas et al. 2023): the
``semantic_cluster``, ``semantic_rep``, ``semantic_cos``, ``semantic_dup`` and ``semantic_vector``
columns. MinHash (``near_dup``) finds copies that share word 5-grams; this finds copies that say
the same in other words.

A row's vector is the normalised mean of its ``chunk_embeddings``, kept as int8
(``semantic_vector``). Rows are clustered by k-means (``semantic_clusters``) and a row is flagged
when an earlier row (smaller ``id``) of its ``probes`` nearest clusters has cosine ``>=
threshold`` with it (``semantic_compare``); its ``semantic_rep`` is then that row's
representative. Rows whose ``lang`` is outside ``languages`` are not compared (``semantic_dup``
false, the rest null): the model is English. The clusters and the stored rows' vectors are the
side store (``semantic_store``: its state in a side Lance dataset, checked against the columns
on every run and appended to after each commit).

This module is the producer: one step on one pinned version, whose state checks the settings
and the inputs, reads, homes and compares the new rows, and whose ``after`` appends the committed
rows to the store and elects kept members after deletes (``kept.elect``). Values written never
change; settings that differ from the stored ones on written columns are refused. Any number of
runs may run at once (each switch of the store is a compare-and-swap: the loser rebases or
compares again); a run killed anywhere leaves rows the next run's check adds from the columns.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from lance_assets import keys
from lance_assets.curation import semantic_clusters as clusters
from lance_assets.curation import semantic_compare as cmp
from lance_assets.curation import semantic_store as ss
from lance_assets.curation.kept import elect
from lance_assets.embeddings.embeddings import DIM
from lance_assets.markdown import Json
from lance_assets.table import Table, get_json_config
from lance_assets.table import executor as executors
from lance_assets.table.columns import ColumnWriteReport, fragments_missing, rows_still_live
from lance_assets.table.producer import ColumnProducer, Run, Step, setting
from lance_assets.table.settings import InputError

SEMANTIC_CLUSTER = pa.field(keys.SEMANTIC_CLUSTER, pa.int64())
SEMANTIC_REP = pa.field(keys.SEMANTIC_REP, pa.int64())
SEMANTIC_COS = pa.field(keys.SEMANTIC_COS, pa.float32())
SEMANTIC_DUP = pa.field(keys.SEMANTIC_DUP, pa.bool_())
SEMANTIC_VECTOR = pa.field(keys.SEMANTIC_VECTOR, pa.list_(pa.int8(), DIM))
FIELDS = [SEMANTIC_CLUSTER, SEMANTIC_REP, SEMANTIC_COS, SEMANTIC_DUP, SEMANTIC_VECTOR]
COLUMNS = [f.name for f in FIELDS]
DESCRIPTIONS = {
    SEMANTIC_CLUSTER.name: "The k-means cluster (of `semantic_vector`) the row was homed in when "
                           "written; null when the row was not compared (no chunks, or a "
                           "language outside the setting `languages`).",
    SEMANTIC_REP.name: "Id of the kept representative of the row's semantic-duplicate group "
                       "(its own id when it is kept).",
    SEMANTIC_COS.name: "The row's highest cosine with an earlier row of its probed clusters "
                       "(0 when none): flagged at >= threshold.",
    SEMANTIC_DUP.name: "True when an earlier row (smaller id) of its probed clusters is within "
                       "cosine >= threshold: a semantic duplicate, dropped by `NOT semantic_dup`.",
    SEMANTIC_VECTOR.name: "The document vector: the normalised mean of `chunk_embeddings`, "
                          "scaled to +-127 and rounded to int8 (cosine = dot / norms).",
}
VECTOR = "int8 of the normalised mean of chunk_embeddings"


class SettingsMismatchError(InputError):
    pass


class MissingChunkEmbeddingsError(RuntimeError):
    pass


class MissingLanguageError(InputError, RuntimeError):
    pass


@dataclass(frozen=True)
class SemanticDupSettings:
    threshold: float = setting(
        0.94, "A row is a semantic duplicate when an earlier row of its probed clusters has "
        "cosine >= this with it (`semantic_vector`: the normalised mean of `chunk_embeddings`). "
        "Chosen on 3,500 real files with planted rewordings (docs/benchmarks.md): 0.94 flags "
        "0.94% of the distinct English files and 92.5% of the rewordings MinHash misses; 0.88 "
        "flags 5.3% of the distinct files. Lower it for heavier rewordings (or use a rule on "
        "`semantic_cos`).")
    rows_per_cluster: int = setting(
        5000, "k-means clusters: one per this many rows (retrained as the table grows). Fewer "
        "rows per cluster: less work per new row, more copies split from their original.")
    probes: int = setting(
        3, "A new row is compared with the rows of its this many nearest clusters (multi-probe): "
        "a copy and its original on two sides of a boundary still meet.")
    languages: list[str] = setting(
        default_factory=lambda: ["en"], help="Rows whose detected `lang` is one of these are "
        "compared; the others are never flagged (semantic_dup false, the other columns null; "
        "counted as other_languages): the "
        "embedding model (all-MiniLM-L6-v2) is English. [] compares every row (tables without "
        "`lang`, or a multilingual model).")
    seed: int = setting(0, "Seed of the k-means initialisation and of its training sample.")
    partitions: int = setting(
        0, "Groups of clusters, one task each (0: one per CPU of the Ray cluster under executor "
        "ray, up to 16 locally); the columns do not depend on it.", run_config=False)

    def __post_init__(self) -> None:
        if not 0.0 < self.threshold <= 1.0:
            raise ValueError(f"threshold={self.threshold}: a cosine in (0, 1], e.g. 0.9")
        if not 1 <= self.rows_per_cluster:
            raise ValueError(f"rows_per_cluster={self.rows_per_cluster}: at least 1, e.g. 5000")
        if not 1 <= self.probes <= 64:
            raise ValueError(f"probes={self.probes}: 1 to 64, e.g. 3")

    def to_dict(self) -> dict:
        """The settings the columns depend on (recorded in the table's config)."""
        out = asdict(self)
        out.pop("partitions")
        out["languages"] = sorted(set(self.languages))
        return out


@dataclass
class SemanticDupStats:
    documents: int = 0
    flagged: int = 0
    flagged_against_earlier_runs: int = 0
    not_computed: int = 0
    other_languages: int = 0
    earlier_rows: int = 0
    clusters: int = 0
    trained: bool = False
    retrained: str = ""  # why the clusters were trained in this run
    caught_up: int = 0  # rows written but missing from the store (a killed or raced run's)
    removed_from_store: int = 0  # rows the store held that were deleted (or held twice)
    side_rows_read: int = 0
    pairs_compared: int = 0
    groups: int = 1
    compare_s: float = 0.0
    read_s: float = 0.0
    train_s: float = 0.0
    kept_after_deletes: int = 0  # unflagged: their group's representative was deleted


@dataclass(frozen=True)
class SemanticColumns:
    """The write: a fragment's rows looked up in the resolved new rows. Small and picklable
    (references under Ray), so a Ray task can run it."""

    first_cluster: int
    payloads: dict  # fragment id -> Payload (or its reference)
    homes: dict  # fragment id -> probes (or its reference)
    resolved: object  # semantic_compare.resolve's result (or its reference)
    in_order = True

    def bind(self, fragment_id: int) -> SemanticColumns:
        keep = {fragment_id} & set(self.payloads)
        return SemanticColumns(self.first_cluster, {f: self.payloads[f] for f in keep},
                               {f: self.homes[f] for f in keep}, self.resolved)

    def __call__(self, frag) -> Iterator[pa.RecordBatch]:
        if frag.fragment_id not in self.payloads:
            raise RuntimeError(f"fragment {frag.fragment_id} was not planned by this "
                               "semantic_dup run (the table changed meanwhile); run again")
        ids, vecs, status = executors.value_of(self.payloads[frag.fragment_id])
        near = executors.value_of(self.homes[frag.fragment_id])
        r = executors.value_of(self.resolved)
        qid, rep, cos, dup = r.ids, r.rep, r.cos, r.dup
        at = rows_still_live(frag, ids)  # rows deleted since the plan are dropped
        if at is not None:
            ids, vecs, status, near = ids[at], vecs[at], status[at], near[at]
        n = len(ids)
        ok = status == cmp.COMPUTED
        pos = np.minimum(np.searchsorted(qid, ids), max(len(qid) - 1, 0))
        if ok.any() and not np.array_equal(qid[pos[ok]], ids[ok]):
            raise RuntimeError(f"fragment {frag.fragment_id}: rows missing from the comparison")
        z = np.zeros(n)
        cluster = np.where(ok, near[:, 0] + self.first_cluster, 0) if n else z
        vec = pa.FixedSizeListArray.from_arrays(pa.array(vecs.reshape(-1), pa.int8()), DIM)
        mask = ~ok
        yield pa.RecordBatch.from_arrays(
            [pa.array(cluster, pa.int64(), mask=mask),
             pa.array(np.where(ok, rep[pos] if len(qid) else z, 0), pa.int64(), mask=mask),
             pa.array(np.where(ok, cos[pos] if len(qid) else z, 0), pa.float32(), mask=mask),
             pa.array(np.where(ok, dup[pos] if len(qid) else z, False).astype(bool), pa.bool_(),
                      mask=mask & (status != cmp.OTHER_LANGUAGE)),  # not compared: not flagged
             pc.if_else(pa.array(ok), vec, pa.nulls(n, vec.type))],
            schema=pa.schema(FIELDS))


@dataclass
class SemanticDupReport(ColumnWriteReport):
    """The write's report, with the run's numbers and the settings the columns depend on."""

    stats: SemanticDupStats = field(default_factory=SemanticDupStats)
    settings: dict = field(default_factory=dict)


@dataclass
class Comparison:
    """The step's state: the write (``compute``), the numbers, the fragments that wait for
    their inputs, and the store append that follows the commit (None: nothing new)."""

    compute: SemanticColumns
    stats: SemanticDupStats
    lacking: set = field(default_factory=set)
    appending: ss.Appending | None = None


MAX_RESTARTS = 20  # comparisons started again because another run switched the store


def compare(run: Run, before: None) -> Comparison:
    """The step's state, on the pinned version: the settings checked and recorded, the store
    checked against the table (and repaired), the new rows read, homed (the clusters trained
    again when the table grew or drifted) and compared with the earlier rows of their probed
    clusters. Started again when another run switches the store meanwhile."""
    side = ss.side_store(run.table)
    for n in range(1, MAX_RESTARTS + 1):
        read = side.read()
        try:
            return _compare(run)
        except ss.StoreMoved:
            run.log("semantic_dup: another run switched the side store; comparing again")
        except Exception as exc:
            cause = _store_failure(exc, side)
            if cause is None or n == MAX_RESTARTS:
                _raise_task_failure(run.table, exc)
                raise
            now = side.read()
            if now.version == read.version:  # nobody moved it: a file is lost, make it again
                run.log(f"semantic_dup: the side store cannot be read ({cause}); making it "
                        "again from the table's columns")
                try:
                    side.switch(now, None)
                except ss.StoreMoved:
                    pass
    raise RuntimeError(f"semantic_dup of {run.table.uri}: the side store kept changing under "
                       f"{MAX_RESTARTS} comparisons (other runs); run again")


def _store_failure(exc: BaseException, side: ss.SideStore) -> str | None:
    """A store file missing or short (read while another run replaced it, or lost): what it
    says; None for any other error."""
    cause = getattr(exc, "cause", None) if type(exc).__module__.startswith("ray") else exc
    if isinstance(cause, FileNotFoundError) and side.uri in str(cause):
        return str(cause).splitlines()[0][:200]
    if isinstance(cause, RuntimeError) and "shorter than its" in str(cause):
        return str(cause).splitlines()[0][:200]
    return None


def _raise_task_failure(table: Table, exc: BaseException) -> None:
    """A Ray task's failure as one error that names the cause and the fix."""
    cause = getattr(exc, "cause", None)
    if type(exc).__module__.startswith("ray") and isinstance(cause, BaseException):
        raise RuntimeError(f"semantic_dup of {table.uri}: a task failed "
                           f"({type(cause).__name__}: {cause}); run again (committed "
                           "fragments are kept).") from exc


def _fragments_to_compare(run: Run, settings: SemanticDupSettings) -> tuple[list, set, bool]:
    """The settings checked against the table's record (and recorded on a table without
    values), the inputs checked: (the pinned version's fragments to compare, those that wait
    for their inputs, whether some row is written already)."""
    table, ds, log = run.table, run.pinned, run.log
    if keys.CHUNK_EMBEDDINGS not in ds.schema.names:
        raise MissingChunkEmbeddingsError(
            f"{table.uri} has no `chunk_embeddings` column: materialize `chunk_embeddings` "
            "first (semantic_dup compares the mean of each row's chunk vectors)")
    if settings.languages and "lang" not in ds.schema.names:
        raise MissingLanguageError(
            f"{table.uri} has no `lang` column, and semantic_dup compares only rows in "
            f"{settings.to_dict()['languages']}: materialize `detected_language` first, or "
            "set languages: [] to compare every row")
    chunking = get_json_config(ds, keys.CHUNK_EMBEDDING_KEY)
    stored = get_json_config(ds, keys.SEMANTIC_DUP_KEY)
    have = all(c in ds.schema.names for c in COLUMNS)
    if not have and any(c in ds.schema.names for c in COLUMNS):
        raise SettingsMismatchError(
            f"{table.uri}: semantic-duplicate columns from an earlier version of semantic_dup "
            f"(without `semantic_vector`); drop them first "
            f"(Table.of(DATA).newest().drop_columns({[c for c in COLUMNS if c in ds.schema.names]})) "
            "to compute them again.")
    todo = fragments_missing(ds, COLUMNS) if have else ds.get_fragments()
    written = have and len(todo) < len(ds.get_fragments())
    wanted = {"settings": settings.to_dict(), "chunking": chunking, "vector": VECTOR}
    if written and (stored is None or "vector" not in stored):
        raise SettingsMismatchError(
            f"{table.uri}: semantic-duplicate columns are written but the table's config has "
            f"no record of how ({keys.SEMANTIC_DUP_KEY}); drop the columns first "
            f"(Table.of(DATA).newest().drop_columns({COLUMNS})) to compute them again.")
    if written and (stored["settings"] != wanted["settings"] or
                    stored.get("chunking") != chunking):
        raise SettingsMismatchError(
            f"{table.uri}: semantic-duplicate columns were written with "
            f"{stored['settings']} on chunking {stored.get('chunking')}, not "
            f"{wanted['settings']} on {chunking}. Keep the stored settings, or drop the "
            f"columns first (Table.of(DATA).newest().drop_columns({COLUMNS})).")
    if not todo:
        return [], set(), written
    inputs = [keys.CHUNK_EMBEDDINGS] + (["lang"] if settings.languages else [])
    lacking = {f.fragment_id for c in inputs for f in fragments_missing(
        ds, [c], among=[f.fragment_id for f in todo])}
    ready = [f.fragment_id for f in todo if f.fragment_id not in lacking]
    if lacking and ready and min(lacking) > max(ready):
        # rows ingested after `chunk_embeddings` (or `detected_language`) ran: they wait,
        # for the next run (a row is compared with every earlier one: none may be skipped)
        log(f"semantic_dup: fragments {sorted(lacking)} have no `chunk_embeddings` or "
            "`lang` yet; they wait for the next run")
        todo = [f for f in todo if f.fragment_id not in lacking]
    elif lacking:
        raise MissingChunkEmbeddingsError(
            f"{table.uri}: fragments {sorted(lacking)} have no `chunk_embeddings` (or `lang`) "
            "yet; materialize `chunk_embeddings` and `detected_language` first, then "
            "semantic_dup")
    if stored != wanted and not written:
        table.set_config(keys.SEMANTIC_DUP_KEY, wanted, log=log)
    return todo, lacking, written


def _compare(run: Run) -> Comparison:
    """One attempt of ``compare`` (``StoreMoved`` when another run switches the store)."""
    table, ds, log, settings, where = run.table, run.pinned, run.log, run.settings, run.where
    parts = executors.resolve_partitions(settings.partitions, where, "semantic_dup partitions") \
        if settings.partitions or where == "ray" else cmp.LOCAL_GROUPS
    stats = SemanticDupStats(groups=parts)
    todo, lacking, written = _fragments_to_compare(run, settings)
    if not todo:
        return Comparison(SemanticColumns(0, {}, {}, None), stats)
    if where == "ray":
        executors.ensure_ray(log)
    tasks = executors.Tasks(where == "ray")
    side = ss.side_store(table)
    t0 = time.perf_counter()
    snap = side.read()
    if written:
        snap, stats.caught_up, stats.removed_from_store = ss.reconcile(side, ds, snap, log)
        state = snap.state
    else:  # a first run: a store another first run made meanwhile is this table's too
        state = ss.current(side, table, snap)
    stats.earlier_rows = 0 if state is None else int(state["rows"])
    scan = tasks.put(cmp.Scan(table, ds.version, tuple(settings.to_dict()["languages"])))
    rows = cmp.read_fragments(tasks, scan, [f.fragment_id for f in todo])
    stats.documents, stats.not_computed = rows.computed, rows.not_computed
    stats.other_languages = rows.other_languages
    stats.read_s = time.perf_counter() - t0

    t1 = time.perf_counter()
    homed = clusters.home(tasks, side, snap, state, rows, settings.probes,
                          settings.rows_per_cluster, settings.seed, parts, log)
    snap, state, homes = homed.snap, homed.snap.state, homed.homes
    stats.trained, stats.retrained = bool(homed.retrained), homed.retrained
    stats.train_s = time.perf_counter() - t1
    stats.clusters = int(state["clusters"])

    t2 = time.perf_counter()
    payloads = rows.payloads
    frags = list(payloads)
    batch = tasks(cmp.gather, len(frags), *[payloads[f] for f in frags],
                  *[homes[f] for f in frags])[0]
    state_ref = tasks.put(state)
    if not (settings.partitions or where == "ray"):
        parts = cmp.local_groups(state, [executors.value_of(homes[f]) for f in frags])
    groups = cmp.cut(stats.clusters, parts)
    stats.groups = len(groups)
    resolved, counts, flags = cmp.compare_all(tasks, side.files, state_ref, groups, batch,
                                              settings.threshold, log)
    stats.side_rows_read, stats.pairs_compared = int(counts[0]), int(counts[1])
    stats.flagged, stats.flagged_against_earlier_runs = int(flags[0]), int(flags[1])
    stats.compare_s = time.perf_counter() - t2
    log(f"semantic_dup: {stats.documents} rows against {stats.earlier_rows} earlier ones in "
        f"{stats.clusters} cluster(s), {settings.probes} probed each: {stats.flagged} "
        f"flagged; {stats.other_languages} in other languages, {stats.not_computed} without "
        "chunks")
    return Comparison(SemanticColumns(int(state["first_cluster"]), payloads, homes, resolved),
                      stats, lacking, ss.Appending(
                          tasks, side, snap, state_ref, settings.probes, groups, frags,
                          ss.table_entries(ds), {f.fragment_id: ss.deletion_of(f) for f in todo},
                          payloads, homes, resolved, homed.drift, batch))


def append_and_elect(run: Run, comparison: Comparison,
                     written: ColumnWriteReport) -> SemanticDupReport:
    """After the write: the committed rows appended to the side store (after the commit, so it
    never holds a row the table does not; a run killed before is caught up by the next), then
    groups whose kept member was deleted keep their smallest live id."""
    if comparison.appending is not None:
        try:
            ss.append(run.table, comparison.appending, written.fragments_written, run.log)
        except Exception as exc:
            _raise_task_failure(run.table, exc)
            raise
    comparison.stats.kept_after_deletes = elect(run.table, flag=SEMANTIC_DUP.name,
                                                cluster=SEMANTIC_REP.name,
                                                rows_end=run.rows_end, log=run.log)
    return SemanticDupReport(**asdict(written), stats=comparison.stats,
                             settings=run.settings.to_dict())


STEPS = (Step(fields=FIELDS, state=compare, compute=lambda settings, state: state.compute,
              waiting=lambda state: state.lacking, after=append_and_elect),)


def summary(table: Table, report: SemanticDupReport) -> dict:
    stats = report.stats
    state = ss.side_store(table).load_state() or {}
    rows, flagged = int(state.get("rows", 0)), int(state.get("flagged", 0))
    return {
        "new_rows_flagged": stats.flagged,
        "new_rows_flagged_against_earlier_runs": stats.flagged_against_earlier_runs,
        "not_computed": stats.not_computed,
        "other_languages": stats.other_languages,
        "semantic_dup_rate": round(flagged / rows, 4) if rows else 0.0,
        "clusters": stats.clusters,
        "clusters_trained_now": stats.trained,
        "retrained": stats.retrained,
        "kept_after_deletes": stats.kept_after_deletes,
        "stored_rows_read": stats.side_rows_read,
        "pairs_compared": stats.pairs_compared,
        "compare_us_per_doc": round(stats.compare_s / stats.documents * 1e6, 1)
        if stats.documents else 0.0,
        "settings": Json(report.settings),
    }


PRODUCER = ColumnProducer(
    name="semantic_dup",
    doc="`semantic_cluster`, `semantic_rep`, `semantic_cos`, `semantic_dup` and "
        "`semantic_vector`: semantic duplicates after SemDeDup. Document vectors (the normalised "
        "mean of `chunk_embeddings`, kept as int8) are clustered by k-means (one cluster per "
        "rows_per_cluster rows, retrained as the table grows or drifts; centroids and vectors in "
        "a side store under the data root); a row is flagged when an earlier row of its nearest "
        "clusters has cosine >= threshold with it. Rows outside `languages` (default English) "
        "are not compared. Finds rewordings MinHash misses. New rows are compared against old "
        "ones; old values are never rewritten. Opt-in rule: `NOT semantic_dup`.",
    descriptions=DESCRIPTIONS, steps=STEPS, summary=summary, settings=SemanticDupSettings,
    deps=("raw_text", "chunk_embeddings", "detected_language"), kinds=("lance", "numpy"),
    version="2",
    reads={c: [("chunk_embeddings", keys.CHUNK_EMBEDDINGS), ("detected_language", "lang"),
               ("raw_text", "id")] for c in COLUMNS})
