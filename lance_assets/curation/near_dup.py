"""Near-duplicates with MinHash LSH: the ``near_dup_cluster``, ``near_dup`` and ``minhash_bands``
columns.

Candidates come from :mod:`lance_assets.curation.minhash` (FineWeb's settings: word 5-grams,
112 MinHash values in 14 bands of 8). For each band key, a new document is a candidate with the
key's *representatives* of smaller id (the first holder of each distinct signature holding it,
the first :data:`~lance_assets.lsh.shuffle.HOLDERS_PER_KEY`), at most
:data:`~lance_assets.lsh.shuffle.CANDIDATES_PER_DOC` in all; not the first holder alone, so a
chain A -> B -> C (C a near-copy of B, not of A) still flags C. A pair is confirmed when the
exact Jaccard of the two 5-gram sets reaches ``min_jaccard``; confirmed pairs form clusters.
``near_dup_cluster`` is the smallest id of the cluster when the row was written, ``near_dup``
true for every member but that first one, ``minhash_bands`` the row's band keys: the state later
runs match new rows against, kept in the table itself.

No process holds the corpus: keys per fragment, candidates per key partition, confirmation and
components (label propagation) per group of new rows, the write per fragment, as tasks
(:mod:`lance_assets.lsh.shuffle`; Ray tasks under ``executor: ray``, the same functions locally).
Incremental like ``is_dup``: values written never change (but ``kept.elect`` after deletes), so a
new row that bridges two older clusters joins the smaller; a run interrupted between commits and
run again writes what an uninterrupted run writes. The MinHash settings are stored in the
table's config and mixing them in one column is refused.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field, replace
from functools import lru_cache

import lance
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from lance_assets.curation.kept import elect
from lance_assets.curation.minhash import (
    MinHashSettings,
    jaccard,
    minhash_batch,
    per_doc_sets,
    shingles,
)
from lance_assets.keys import NEAR_DUP as NEAR_DUP_COLUMN
from lance_assets.keys import NEAR_DUP_KEY
from lance_assets.lsh import shuffle as lsh
from lance_assets.markdown import Json
from lance_assets.progress import phase
from lance_assets.table import Table, get_json_config
from lance_assets.table import executor as executors
from lance_assets.table.columns import ColumnWriteReport, fragments_missing, rows_still_live
from lance_assets.table.producer import ColumnProducer, Run, Step, setting

NEAR_DUP_CLUSTER = pa.field("near_dup_cluster", pa.int64())
NEAR_DUP = pa.field(NEAR_DUP_COLUMN, pa.bool_())
DESCRIPTIONS = {
    NEAR_DUP_CLUSTER.name: "Near-duplicate cluster: rows with equal values are MinHash LSH "
                           "near-duplicates (word 5-grams, Jaccard confirmed).",
    NEAR_DUP.name: "True for every row of a cluster but its first (smallest id).",
    "minhash_bands": "The row's LSH band keys (one int64 per band); later runs match new rows "
                     "against them.",
}
BATCH_ROWS = 2048
TAKE_ROWS = 4096  # texts read per take when confirming
CONFIRM_PAIRS = 2048  # candidate pairs confirmed per block


def bands_field(settings: MinHashSettings) -> pa.Field:
    return pa.field("minhash_bands", pa.list_(pa.int64(), settings.bands))


def fields(settings: MinHashSettings) -> list[pa.Field]:
    return [NEAR_DUP_CLUSTER, NEAR_DUP, bands_field(settings)]


class SettingsMismatchError(ValueError):
    pass


@dataclass
class NearDupStats:
    documents: int = 0
    candidate_pairs: int = 0
    confirmed_pairs: int = 0
    flagged: int = 0
    joined_old_clusters: int = 0
    partitions: int = 1
    groups: int = 1
    rounds: int = 0
    kept_after_deletes: int = 0  # unflagged: their cluster's kept member was deleted


# ---------------------------------------------------------------------------- the tasks

@dataclass(frozen=True)
class Scan:
    """What every task shares: the table at the version planned on, where the pinned version's
    rows end (later rows wait for the next run), the settings and the partition count."""

    table: Table
    version: int
    rows_end: int
    settings: MinHashSettings
    partitions: int


@lru_cache(maxsize=4)
def _open(table: Table, version: int) -> lance.LanceDataset:
    return table.open(version)


Payload = tuple[np.ndarray, np.ndarray, np.ndarray]  # a new fragment's (ids, keys, has words)


def new_keys(scan: Scan, fragment_id: int) -> tuple:
    """A new fragment: its text hashed into band keys. Returns its (first id, last id, rows),
    its payload for the write (~121 bytes a row; no text or shingle leaves the task) and one
    holders piece per key partition."""
    frag = _open(scan.table, scan.version).get_fragment(fragment_id)
    ids, keys, has_words = [], [], []
    for batch in frag.to_batches(columns=["id", "text"], batch_size=BATCH_ROWS):
        k, w = minhash_batch(batch.column("text"), scan.settings)
        ids.append(batch.column("id").to_numpy(zero_copy_only=False))
        keys.append(k)
        has_words.append(w)
    bands = scan.settings.bands
    i = np.concatenate(ids) if ids else np.zeros(0, np.int64)
    k = np.concatenate(keys) if keys else np.zeros((0, bands), np.int64)
    w = np.concatenate(has_words) if has_words else np.zeros(0, bool)
    if len(i) > 1 and not np.all(np.diff(i) > 0):
        raise RuntimeError(f"fragment {fragment_id}: ids are not ascending")
    span = np.array([i[0], i[-1], len(i)] if len(i) else [0, -1, 0], dtype=np.int64)
    return (span, (i, k, w), *lsh.holders(i, k, w, None, scan.partitions))


def old_keys(scan: Scan, fragment_id: int) -> tuple:
    """A written fragment: its representatives of each of its stored keys (the first holder of
    each distinct signature, the first few), per key partition (rows of the pinned version
    only)."""
    frag = _open(scan.table, scan.version).get_fragment(fragment_id)
    bands = scan.settings.bands
    where = f"minhash_bands IS NOT NULL AND id < {int(scan.rows_end)}"
    parts = [(b.column("id").to_numpy(), b.column("near_dup_cluster").to_numpy(),
              b.column("minhash_bands").values.to_numpy().reshape(b.num_rows, bands))
             for b in frag.to_batches(columns=["id", "near_dup_cluster", "minhash_bands"],
                                      filter=where, batch_size=1 << 16) if b.num_rows]
    if not parts:
        return tuple(lsh.empty_holders() for _ in range(scan.partitions))
    ids = np.concatenate([p[0] for p in parts])
    clusters = np.concatenate([p[1] for p in parts])
    keys = np.concatenate([p[2] for p in parts])
    return tuple(lsh.holders(ids, keys, np.ones(len(ids), bool), clusters, scan.partitions,
                             written=True))


def partition_pairs(starts: np.ndarray, *pieces: lsh.Holders) -> tuple:
    """One key partition: its candidate pairs, one piece per group of new documents."""
    return tuple(lsh.route_pairs(lsh.candidates(*pieces), starts))


def _texts(scan: Scan, wanted: np.ndarray) -> pa.Table:
    """``id`` and ``text`` of ``wanted`` (sorted ids), read by row id (lancedb's public
    ``take_row_ids``: the table's stable row ids equal ``id``), or with an ``id IN (...)``
    filter on a table where they do not. When a cleanup removed the version's manifest since
    this process opened it (zero retention), the dataset opened then still reads its files."""
    try:
        handle = scan.table.lancedb_table(scan.version)
    except Exception:  # noqa: BLE001 - the manifest is gone: read through the open dataset
        handle = None
    ds = None
    parts = []
    for lo in range(0, len(wanted), TAKE_ROWS):
        chunk = wanted[lo:lo + TAKE_ROWS]
        got = None
        try:
            if handle is not None:
                got = handle.take_row_ids(chunk.tolist()).select(["id", "text"]).to_arrow()
                got = got.sort_by("id")  # no order is promised
                if not np.array_equal(got.column("id").to_numpy(), chunk):
                    got = None
        except Exception:  # noqa: BLE001 - a table without stable row ids: filter instead
            got = None
        if got is None:
            ds = ds or _open(scan.table, scan.version)
            got = ds.to_table(columns=["id", "text"],
                              filter=f"id IN ({','.join(map(str, chunk.tolist()))})").sort_by("id")
        parts.append(got.select(["id", "text"]))
    return pa.concat_tables(parts) if parts else pa.table({"id": pa.array([], pa.int64()),
                                                          "text": pa.array([], pa.string())})


def confirm_group(scan: Scan, starts: np.ndarray, *pieces: lsh.Pairs) -> tuple:
    """One group of new documents: its candidate pairs confirmed by exact Jaccard of the two
    texts' shingle sets (read here, for the candidates alone). Returns its own edges and
    attachments, the counts (candidates, confirmed) and the reverse edges for every group."""
    d, f, fc = lsh.merge_pairs(*pieces)
    settings = scan.settings
    ok = np.ones(len(d), bool)
    if settings.min_jaccard > 0:
        # a block of pairs at a time: the texts and shingle sets of ~2 x CONFIRM_PAIRS
        # documents in memory, whatever the group's size
        for lo in range(0, len(d), CONFIRM_PAIRS):
            bd, bf = d[lo:lo + CONFIRM_PAIRS], f[lo:lo + CONFIRM_PAIRS]
            wanted = np.unique(np.concatenate([bd, bf]))
            t = _texts(scan, wanted)
            got = t.column("id").to_numpy()
            if not np.array_equal(got, wanted):
                raise RuntimeError(f"{scan.table.uri}: {len(wanted) - len(got)} candidate "
                                   f"row(s) could not be read at version {scan.version}")
            doc, sh = shingles(t.column("text"), settings.ngram, version=settings.version)
            sets = per_doc_sets(doc, sh, t.num_rows)
            pd, pf = np.searchsorted(wanted, bd), np.searchsorted(wanted, bf)
            ok[lo:lo + len(bd)] = [jaccard(sets[a], sets[b]) >= settings.min_jaccard
                                   for a, b in zip(pd.tolist(), pf.tolist())]
    own, reverse = lsh.confirmed_edges(d, f, fc, ok, starts)
    return (own, np.array([len(d), int(ok.sum())], np.int64), *reverse)


def first_round(starts: np.ndarray, own: tuple, *reverse) -> tuple:
    state, sent, messages = lsh.step(lsh.init_group(own, *reverse), starts, True)
    return (state, sent, *messages)


def next_round(starts: np.ndarray, state: lsh.GroupState, *incoming) -> tuple:
    state, sent, messages = lsh.step(state, starts, False, *incoming)
    return (state, sent, *messages)


def tally(state: lsh.GroupState) -> np.ndarray:
    """(flagged, joined an older cluster) among a group's new documents."""
    _, flag = lsh.assign(state.nodes, state)
    return np.array([int(flag.sum()), int((state.oldc != lsh.NONE).sum())], np.int64)


@dataclass(frozen=True)
class NearDupColumns:
    """The write: a fragment's ids looked up in its groups' settled labels, its keys from its
    payload. Small and picklable (references under Ray), so a Ray task can run it."""

    settings: MinHashSettings
    payloads: dict  # fragment id -> Payload (or its reference)
    states: tuple  # group -> GroupState (or its reference)
    starts: np.ndarray
    spans: dict = field(default_factory=dict)  # fragment id -> (first id, last id, rows)
    # committed in fragment order, stopping at a failure: a rerun then sees a prefix of this
    # run's values as written, and writes what this run would have
    in_order = True

    def bind(self, fragment_id: int) -> NearDupColumns:
        """The compute of one fragment: its payload and its groups' states only (a Ray task
        then borrows a few references, not every fragment's)."""
        span = self.spans.get(fragment_id)
        touched = (set(executors.group_of(span[:2], self.starts).tolist())
                   if span is not None and span[2] else set())
        states = tuple(s if g in touched else None for g, s in enumerate(self.states))
        payload = {fragment_id: self.payloads[fragment_id]} if fragment_id in self.payloads \
            else {}
        return NearDupColumns(self.settings, payload, states, self.starts)

    def __call__(self, frag) -> Iterator[pa.RecordBatch]:
        if frag.fragment_id not in self.payloads:
            raise RuntimeError(f"fragment {frag.fragment_id} was not planned by this near_dup "
                               "run (the table changed meanwhile); run again")
        ids, keys, has_words = executors.value_of(self.payloads[frag.fragment_id])
        at = rows_still_live(frag, ids)  # rows deleted since the keys were made are dropped
        if at is not None:
            ids, keys, has_words = ids[at], keys[at], has_words[at]
        n = len(ids)
        cluster, flag = ids.copy(), np.zeros(n, bool)
        groups = lsh.group_of(ids, self.starts)
        for g in np.unique(groups):
            sel = groups == g
            cluster[sel], flag[sel] = lsh.assign(ids[sel], executors.value_of(self.states[g]))
        bands = pa.FixedSizeListArray.from_arrays(pa.array(keys.reshape(-1)), self.settings.bands)
        bands = pc.if_else(pa.array(has_words), bands, pa.nulls(n, bands.type))
        yield pa.RecordBatch.from_arrays(
            [pa.array(cluster, pa.int64()), pa.array(flag), bands],
            schema=pa.schema(fields(self.settings)))


# ---------------------------------------------------------------------------- the run

def clusters(scan: Scan, new: list[int], old: list[int], tasks: executors.Tasks,
             log: Callable[[str], None], stats: NearDupStats) -> NearDupColumns:
    """Steps 1-4 (keys, candidates, confirmation, components) over the fragments; the write's
    compute. The driver holds references and counts only (under Ray)."""
    parts = scan.partitions
    scan_ref = tasks.put(scan)
    new_out = {f: tasks(new_keys, scan_ref, f, returns=2 + parts) for f in new}
    old_out = [tasks(old_keys, scan_ref, f, returns=parts) for f in old]
    spans = dict(zip(new, tasks.get([o[0] for o in new_out.values()])))
    stats.documents = int(sum(s[2] for s in spans.values()))
    starts = executors.contiguous_groups(spans, parts)
    n_groups = len(starts) + 1
    stats.groups = n_groups
    log(f"near_dup: band keys of {len(new)} new fragment(s) ({stats.documents} rows) and "
        f"{len(old)} written one(s), in {parts} key partition(s) and {n_groups} group(s)")
    holders = [o[2:] for o in new_out.values()] + old_out
    reduced = [tasks(partition_pairs, starts, *[h[p] for h in holders], returns=n_groups)
               for p in range(parts)]
    # keep only the payloads: the holders' objects are freed once the reduces have read them
    payloads = {f: o[1] for f, o in new_out.items()}
    del holders, old_out, new_out
    confirmed = [tasks(confirm_group, scan_ref, starts, *[r[g] for r in reduced],
                       returns=2 + n_groups) for g in range(n_groups)]
    del reduced
    counts = np.sum(tasks.get([c[1] for c in confirmed]), axis=0)
    stats.candidate_pairs, stats.confirmed_pairs = int(counts[0]), int(counts[1])
    log(f"near_dup: {stats.candidate_pairs} candidate pair(s), {stats.confirmed_pairs} "
        "confirmed")
    rounds = [tasks(first_round, starts, confirmed[g][0], *[c[2 + g] for c in confirmed],
                    returns=2 + n_groups) for g in range(n_groups)]
    del confirmed
    stats.rounds = 1
    while sum(int(s) for s in tasks.get([r[1] for r in rounds])):
        rounds = [tasks(next_round, starts, rounds[g][0], *[r[2 + g] for r in rounds],
                        returns=2 + n_groups) for g in range(n_groups)]
        stats.rounds += 1
    states = tuple(r[0] for r in rounds)
    tallies = np.sum(tasks.get([tasks(tally, s)[0] for s in states]), axis=0)
    stats.flagged, stats.joined_old_clusters = int(tallies[0]), int(tallies[1])
    log(f"near_dup: components settled in {stats.rounds} round(s); {stats.flagged} new "
        f"row(s) flagged, {stats.joined_old_clusters} joining older clusters")
    return NearDupColumns(scan.settings, payloads, states, starts, spans)


def _settings_for(table: Table, ds: lance.LanceDataset,
                  settings: MinHashSettings, log: Callable[[str], None]) -> MinHashSettings:
    """``settings``, or the stored MinHash version when the columns were written with another
    one and nothing else differs (old keys only match keys made the same way); anything else
    that differs on written columns is refused."""
    current = get_json_config(ds, NEAR_DUP_KEY)
    cols = [f.name for f in fields(settings)]
    written = current is not None and all(c in ds.schema.names for c in cols) and \
        len(fragments_missing(ds, cols)) < len(ds.get_fragments())
    if written and current != settings.to_dict():
        stored_version = current.get("version", 1)
        if {**current, "version": settings.version} == settings.to_dict():
            log(f"near_dup: {table.uri} holds MinHash version {stored_version} keys; new rows "
                "are hashed the same way")
            return replace(settings, version=stored_version)
        raise SettingsMismatchError(
            f"{table.uri}: near-duplicate columns were written with {current}, not "
            f"{settings.to_dict()}. Keep the stored settings, or drop the columns first "
            "(lance.dataset(uri).drop_columns(['near_dup_cluster', 'near_dup', "
            "'minhash_bands'])).")
    return settings


@dataclass(frozen=True)
class NearDupSettings:
    min_jaccard: float = setting(
        0.8, "A candidate pair (a shared LSH band) is confirmed when the exact Jaccard similarity "
        "of its word 5-gram sets reaches this; 0 confirms every candidate (FineWeb's behaviour).")
    partitions: int = setting(
        0, "Partitions of the band keys (one candidate task each) and groups of new rows (one "
        "confirmation and components task each): 0 means one per CPU of the Ray cluster under "
        "executor ray, 1 locally. The columns do not depend on it.")
    minhash: MinHashSettings | None = setting(
        None, "All of MinHash's settings (min_jaccard included); default: FineWeb's with "
        "min_jaccard.", run_config=False)

    def minhash_settings(self) -> MinHashSettings:
        return self.minhash or MinHashSettings(min_jaccard=self.min_jaccard)


@dataclass
class NearDupReport(ColumnWriteReport):
    """The write's report, with the run's numbers and the MinHash settings asked for."""

    stats: NearDupStats = field(default_factory=NearDupStats)
    settings: dict = field(default_factory=dict)


@dataclass
class Clusters:
    """The step's state: the MinHash settings used, the components of the new rows (the
    compute) and the numbers."""

    used: MinHashSettings
    compute: NearDupColumns
    stats: NearDupStats


def find_clusters(run: Run, before: None) -> Clusters:
    """The state, on the pinned version: the settings checked against the stored ones and
    recorded, then the keys, candidates, confirmations and components of its new rows."""
    table, pin, log = run.table, run.pinned, run.log
    settings: NearDupSettings = run.settings
    parts = executors.resolve_partitions(settings.partitions, run.where,
                                         "near_dup setting partitions")
    used = _settings_for(table, pin, settings.minhash_settings(), log)
    if get_json_config(pin, NEAR_DUP_KEY) != used.to_dict():
        table.set_config(NEAR_DUP_KEY, used.to_dict())
    cols = [f.name for f in fields(used)]
    view = table.newest()
    have = all(c in view.schema.names for c in cols)
    missing = {f.fragment_id: f for f in
               (fragments_missing(view, cols) if have else view.get_fragments())}
    pin_rows = {f.fragment_id: f.physical_rows for f in pin.get_fragments()}
    new = sorted(i for i, f in missing.items() if pin_rows.get(i) == f.physical_rows)
    old = [f.fragment_id for f in view.get_fragments() if f.fragment_id not in missing]
    stats = NearDupStats(partitions=parts)
    if not new:
        return Clusters(used, NearDupColumns(used, {}, (), np.zeros(0, np.int64)), stats)
    if run.where == "ray":
        executors.ensure_ray(log)
    scan = Scan(table, view.version, run.rows_end, used, parts)
    try:
        with phase("near_dup: band keys, candidate pairs and clusters", log):
            compute = clusters(scan, new, old, executors.Tasks(run.where == "ray"), log, stats)
    except Exception as exc:
        cause = getattr(exc, "cause", None)
        if type(exc).__module__.startswith("ray") and isinstance(cause, BaseException):
            raise RuntimeError(f"near_dup of {table.uri}: a task failed ({type(cause).__name__}: "
                               f"{cause}); nothing of this step was written; run again "
                               "(committed fragments are kept).") from exc
        raise
    return Clusters(used, compute, stats)


def elect_kept(run: Run, state: Clusters, written: ColumnWriteReport) -> NearDupReport:
    """After the write: a cluster whose kept member was deleted keeps its smallest live id."""
    state.stats.kept_after_deletes = elect(run.table, flag=NEAR_DUP.name,
                                           cluster=NEAR_DUP_CLUSTER.name, rows_end=run.rows_end,
                                           log=run.log)
    return NearDupReport(**asdict(written), stats=state.stats,
                         settings=run.settings.minhash_settings().to_dict())


STEPS = (Step(fields=lambda settings, state: fields(settings.minhash_settings()),
              state=find_clusters, compute=lambda settings, state: state.compute,
              after=elect_kept),)


def summary(table: Table, report: NearDupReport) -> dict:
    from lance_assets.curation.profile import flag_rate

    stats = report.stats
    return {
        "candidate_pairs": stats.candidate_pairs,
        "confirmed_pairs": stats.confirmed_pairs,
        "new_rows_flagged": stats.flagged,
        "new_rows_joining_old_clusters": stats.joined_old_clusters,
        "kept_after_deletes": stats.kept_after_deletes,
        "near_dup_rate": round(flag_rate(table, NEAR_DUP.name), 4),
        "partitions": stats.partitions,
        "groups": stats.groups,
        "component_rounds": stats.rounds,
        "settings": Json(report.settings),
    }


PRODUCER = ColumnProducer(
    name="near_dup",
    doc="`near_dup_cluster` (int64: equal ids form a cluster), `near_dup` (bool: true for all but "
        "the first document of a cluster) and `minhash_bands` (the LSH keys later runs match new "
        "documents against). MinHash LSH with FineWeb's settings: word 5-grams, 14 bands x 8 "
        "hashes; candidates confirmed by exact Jaccard. Keys shuffled by partition, pairs "
        "confirmed and components settled per group (Ray tasks under executor ray, no corpus "
        "in the driver). New documents are matched against old ones; old values are never "
        "rewritten.",
    descriptions=DESCRIPTIONS, steps=STEPS, summary=summary,
    settings=NearDupSettings, kinds=("lance", "numpy"), version="3",
    reads={NEAR_DUP_CLUSTER.name: [("raw_text", "text"), ("raw_text", "id")],
           NEAR_DUP.name: [("raw_text", "text"), ("raw_text", "id")],
           "minhash_bands": [("raw_text", "text")]})
