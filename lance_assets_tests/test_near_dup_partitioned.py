"""``near_dup`` with no driver index: the partitioned steps give the columns of a plain reference
whatever the partitions and groups; on 1, 2 and 4 local Ray workers the columns equal the
single-process path's, on a planted corpus ingested in three increments; a worker killed
mid-run costs only its task, a failed write only its fragments; the driver holds references,
not the corpus."""

from __future__ import annotations

import os
import pickle
import shutil
from pathlib import Path

import lance
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lance_assets import paths
from lance_assets.curation import near_dup as nd
from lance_assets.ingest.raw_text import ingest
from lance_assets.ingest.synthetic import SyntheticSpec, generate
from lance_assets.keys import NEAR_DUP_KEY
from lance_assets.lsh import shuffle as lsh
from lance_assets.table import Table, data_files_by_field, get_json_config
from lance_assets.table.columns import fragments_missing
from lance_assets.table.producer import produce
from lance_assets.testing.curation_reference import plant_near_duplicates
from lance_assets_tests import near_dup_chain
from lance_assets_tests.helpers import quiet

# the worker's one Ray cluster (conftest.ray_cluster), shared with the other Ray modules
pytestmark = pytest.mark.xdist_group("ray")

COLUMNS = ["id", "near_dup_cluster", "near_dup", "minhash_bands"]


# ---------------------------------------------------------------------------- the steps alone

def reference(old: dict[int, tuple[list[int], int]], new: dict[int, list[int]], ok, bands: int,
              per_key: int = lsh.HOLDERS_PER_KEY,
              per_doc: int = lsh.CANDIDATES_PER_DOC) -> dict[int, tuple[int, bool]]:
    """Plain Python: a document's signature is its keys padded to ``bands``; a key's
    representatives are the first holder of each distinct signature, the first ``per_key`` by
    id; each new holder pairs with the representatives before it (rank: their place); a
    document keeps its pairs of rank 0 and the best others by (rank, id), ``per_doc`` in all;
    ``ok(d, f)`` confirms; union-find over new documents; a component takes the smallest older
    cluster it attaches to, else its smallest id."""
    def signature(keys):
        return tuple(keys) + (keys[0],) * (bands - len(keys))

    holders: dict[int, list[tuple[int, int | None, tuple]]] = {}
    for i, (keys, c) in old.items():
        for k in set(keys):
            holders.setdefault(k, []).append((i, c, signature(keys)))
    for i, keys in new.items():
        for k in set(keys):
            holders.setdefault(k, []).append((i, None, signature(keys)))
    best: dict[tuple[int, int], tuple[int, int | None]] = {}  # (d, f) -> (rank, f's cluster)
    for members in holders.values():
        reps: list[tuple[int, int | None]] = []
        seen = set()
        for i, c, sig in sorted(members, key=lambda m: m[0]):
            if c is None:
                for rank, (f, fc) in enumerate(reps):
                    if (i, f) not in best or rank < best[i, f][0]:
                        best[i, f] = (rank, fc)
            if sig not in seen and len(reps) < per_key:
                seen.add(sig)
                reps.append((i, c))
    by_doc: dict[int, list[tuple[int, int, int | None]]] = {}
    for (d, f), (rank, fc) in best.items():
        by_doc.setdefault(d, []).append((rank, f, fc))
    pairs = [(d, f, fc) for d, ps in by_doc.items()
             for n, (rank, f, fc) in enumerate(sorted(ps, key=lambda p: p[:2]))
             if rank == 0 or n < per_doc]
    parent = {i: i for i in new}

    def find(i):
        while parent[i] != i:
            i = parent[i]
        return i

    attach: dict[int, list[int]] = {}
    for d, f, fc in pairs:
        if ok(d, f):
            if fc is None:
                a, b = find(d), find(f)
                parent[max(a, b)] = min(a, b)
            else:
                attach.setdefault(d, []).append(fc)
    comp_old: dict[int, int] = {}
    for d, cs in attach.items():
        r = find(d)
        comp_old[r] = min(cs + [comp_old.get(r, lsh.NONE)])
    out = {}
    for d in new:
        r = find(d)
        out[d] = (comp_old[r], True) if r in comp_old else (r, r != d)
    return out


def bands_of(old, new) -> int:
    return max([len(k) for k, _ in old.values()] + [len(k) for k in new.values()] + [1])


def partitioned(old, new, ok, parts: int, groups: int, per_key: int = lsh.HOLDERS_PER_KEY,
                per_doc: int = lsh.CANDIDATES_PER_DOC) -> dict[int, tuple[int, bool]]:
    """The same through the steps near_dup runs as tasks, in ``parts`` key partitions and up to
    ``groups`` groups."""
    bands = bands_of(old, new)

    def arrays(items):
        ids = np.array(sorted(items), np.int64)
        keys = np.zeros((len(ids), bands), np.int64)
        for r, i in enumerate(ids):
            ks = items[int(i)][0] if isinstance(items[int(i)], tuple) else items[int(i)]
            keys[r, :len(ks)] = ks
            keys[r, len(ks):] = ks[0] if ks else 0
        return ids, keys

    pieces = []
    if old:
        ids, keys = arrays(old)
        clusters = np.array([old[int(i)][1] for i in ids], np.int64)
        has = np.array([bool(old[int(i)][0]) for i in ids])
        pieces.append(lsh.holders(ids, keys, has, clusters, parts, written=True,
                                  per_key=per_key))
    ids, keys = arrays(new)
    has = np.array([bool(new[int(i)]) for i in ids])
    pieces.append(lsh.holders(ids, keys, has, None, parts))
    starts = ids[np.linspace(0, len(ids), groups + 1).astype(int)[1:-1]]
    starts = np.unique(starts)
    n_groups = len(starts) + 1
    routed = [lsh.route_pairs(lsh.candidates(*[p[k] for p in pieces], per_key=per_key), starts)
              for k in range(parts)]
    confirmed = []
    for g in range(n_groups):
        d, f, fc = lsh.merge_pairs(*[r[g] for r in routed], per_doc=per_doc)
        good = np.array([ok(int(a), int(b)) for a, b in zip(d, f)], bool)
        confirmed.append(lsh.confirmed_edges(d, f, fc, good, starts))
    states, sent, inbox = [], 0, [[] for _ in range(n_groups)]
    for g in range(n_groups):
        state, n, msgs = lsh.step(lsh.init_group(confirmed[g][0],
                                                 *[c[1][g] for c in confirmed]), starts, True)
        states.append(state)
        sent += n
        for h, m in enumerate(msgs):
            inbox[h].append(m)
    rounds = 1
    while sent:
        sent, nxt = 0, [[] for _ in range(n_groups)]
        for g in range(n_groups):
            states[g], n, msgs = lsh.step(states[g], starts, False, *inbox[g])
            sent += n
            for h, m in enumerate(msgs):
                nxt[h].append(m)
        inbox, rounds = nxt, rounds + 1
        assert rounds < 100
    out = {}
    group = lsh.group_of(ids, starts)
    for g in range(n_groups):
        sel = ids[group == g]
        c, f = lsh.assign(sel, states[g])
        out.update({int(i): (int(a), bool(b)) for i, a, b in zip(sel, c, f)})
    return out


@settings(max_examples=120, deadline=None)
@given(st.data())
def test_the_partitioned_steps_equal_the_reference_for_any_partitions_and_groups(data):
    key = st.integers(0, 12).map(lambda k: k * 0x9E3779B97F4A7C15 % (1 << 63) - (1 << 62))
    n_old = data.draw(st.integers(0, 12))
    n_new = data.draw(st.integers(1, 30))
    old = {i: (data.draw(st.lists(key, max_size=3)), data.draw(st.integers(0, i)))
           for i in range(n_old)}
    new = {n_old + j: data.draw(st.lists(key, max_size=3)) for j in range(n_new)}
    salt = data.draw(st.integers(0, 6))
    caps = data.draw(st.sampled_from([(lsh.HOLDERS_PER_KEY, lsh.CANDIDATES_PER_DOC), (1, 1),
                                      (2, 3), (3, 2)]))

    def ok(d, f):  # a deterministic Jaccard stand-in that rejects some pairs
        return (d * 7 + f * 3 + salt) % 5 != 0

    want = reference(old, new, ok, bands_of(old, new), *caps)
    for parts in (1, 2, 5):
        for groups in (1, 3, 7):
            assert partitioned(old, new, ok, parts, groups, *caps) == want, (parts, groups)


def test_a_document_among_many_variants_meets_a_bounded_number_of_candidates():
    """200 written documents, each with its own signature; document i holds the new document's
    key of band i % 14, so each of those keys has 14 or 15 holders. The new document meets each
    key's first HOLDERS_PER_KEY of them, and keeps the first holders (0-13) and the next by rank
    then id: the first CANDIDATES_PER_DOC written documents."""
    bands, n_old = 14, 200
    shared = np.arange(1, bands + 1, dtype=np.int64) * 0x9E3779B97F4A7C1
    old_keys = np.arange(n_old * bands, dtype=np.int64).reshape(n_old, bands) * 7919 + (1 << 40)
    old_keys[np.arange(n_old), np.arange(n_old) % bands] = shared[np.arange(n_old) % bands]
    old_ids = np.arange(n_old, dtype=np.int64)
    pieces = [lsh.holders(old_ids, old_keys, np.ones(n_old, bool), old_ids, 1, written=True)[0],
              lsh.holders(np.array([n_old]), shared[None, :], np.ones(1, bool), None, 1)[0]]
    pairs = lsh.candidates(*pieces)
    assert len(pairs[0]) == bands * lsh.HOLDERS_PER_KEY < n_old
    d, f, fc = lsh.merge_pairs(pairs)
    assert lsh.CANDIDATES_PER_DOC < len(pairs[0])
    assert (d == n_old).all() and f.tolist() == list(range(lsh.CANDIDATES_PER_DOC))
    assert (fc == f).all()


# ---------------------------------------------------------------------------- on a table

def _increments(tmp: Path) -> list[Path]:
    """Three increments: fresh texts with near-duplicates planted of this increment's texts
    and of earlier increments' (edited copies, so MinHash and Jaccard decide)."""
    base = generate(SyntheticSpec(rows=700, seed=21, dup_fraction=0.0)).column("text").to_pylist()
    planted, _ = plant_near_duplicates(base, 0.3, seed=3, max_edits=2)
    copies = planted[700:]
    half = len(copies) // 2
    # copies of the first increment's texts and of the second's own, then copies of both
    parts = [base[:350], base[350:] + copies[:half], copies[half:]]
    out = []
    for i, texts in enumerate(parts):
        path = tmp / f"inc{i}.parquet"
        pq.write_table(pa.table({"text": texts}), path)
        out.append(path)
    return out


def _columns(root: Path) -> pa.Table:
    return lance.dataset(paths.table_uri(root)).to_table(columns=COLUMNS).sort_by("id")


def assert_same(got: pa.Table, want: pa.Table) -> None:
    """Equal tables; otherwise the first rows that differ, side by side."""
    if got.equals(want):
        return
    a, b = got.to_pylist(), want.to_pylist()
    diff = [(x["id"], {k: (x[k], y[k]) for k in x if x[k] != y[k]})
            for x, y in zip(a, b) if x != y]
    raise AssertionError(f"{len(diff)} row(s) differ (got, want): {diff[:8]}; rows "
                         f"{len(a)} vs {len(b)}")


@pytest.fixture(scope="module")
def sources(tmp_path_factory) -> list[Path]:
    return _increments(tmp_path_factory.mktemp("near-dup-src"))


def _ingest(root: Path, source: Path) -> None:
    ingest(Table.of(root), str(source), rows_per_fragment=70, log=quiet)


@pytest.fixture(scope="module")
def single_process(sources, tmp_path_factory) -> pa.Table:
    root = tmp_path_factory.mktemp("near-dup-local") / "data"
    for source in sources:
        _ingest(root, source)
        produce(nd.PRODUCER, Table.of(root), log=quiet)
    got = _columns(root)
    flags = got.column("near_dup").to_numpy(zero_copy_only=False)
    clusters = got.column("near_dup_cluster").to_numpy()
    assert 0.05 < flags.mean() < 0.5
    assert (clusters[flags] < got.column("id").to_numpy()[flags]).all()  # an earlier kept one
    return got


@pytest.mark.parametrize("parts", [2, 3])
def test_local_partitions_write_the_single_process_columns(sources, single_process, tmp_path,
                                                           parts):
    root = tmp_path / "data"
    for source in sources:
        _ingest(root, source)
        produce(nd.PRODUCER, Table.of(root), nd.NearDupSettings(partitions=parts), log=quiet)
    assert_same(_columns(root), single_process)


@pytest.mark.parametrize("workers", [1, 2, 4])
def test_ray_workers_write_the_single_process_columns_over_three_increments(
        ray_cluster, sources, single_process, tmp_path, workers):
    root = tmp_path / "data"
    for source in sources:
        _ingest(root, source)
        report = produce(nd.PRODUCER, Table.of(root), nd.NearDupSettings(partitions=workers),
                         executor="ray", log=quiet)
        stats = report.stats
        assert stats.partitions == workers
    assert_same(_columns(root), single_process)


@pytest.mark.parametrize("later", [False, True], ids=["one-run", "c-later"])
def test_ray_matches_a_chain_like_the_single_process_path(ray_cluster, tmp_path, later):
    """A -> B -> C (near_dup_chain: every key C shares with B is A's, C is no near-copy of A)
    among unrelated texts: C joins A's cluster on Ray as in one process, arriving with A and B
    or in a later run."""
    a, b, c = near_dup_chain.chain()
    filler = generate(SyntheticSpec(rows=60, seed=5, dup_fraction=0.0)).column("text").to_pylist()
    batches = ([filler[:30] + [a, b], [c] + filler[30:]] if later
               else [filler[:30] + [a, b, c] + filler[30:]])
    got = {}
    for where in ("local", "ray"):
        root = tmp_path / where / "data"
        for i, texts in enumerate(batches):
            path = tmp_path / f"{where}{i}.parquet"
            pq.write_table(pa.table({"text": texts}), path)
            ingest(Table.of(root), str(path), rows_per_fragment=20, log=quiet)
            produce(nd.PRODUCER, Table.of(root), nd.NearDupSettings(partitions=2), executor=where, log=quiet)
        got[where] = _columns(root)
    assert_same(got["ray"], got["local"])
    rows = got["ray"].to_pylist()
    assert [(r["id"], r["near_dup_cluster"], r["near_dup"]) for r in rows[30:33]] == \
        [(30, 30, False), (31, 30, True), (32, 30, True)]


class ExitOnce:
    """A step whose first call kills its Ray worker (as an OOM kill or a lost node would)."""

    def __init__(self, marker: str, inner) -> None:
        self.marker, self.inner = marker, inner
        self.__name__ = inner.__name__

    def __call__(self, *args):
        if not Path(self.marker).exists():
            Path(self.marker).touch()
            os._exit(1)
        return self.inner(*args)


@pytest.mark.parametrize("step", ["partition_pairs", "confirm_group", "next_round"])
def test_a_worker_killed_mid_run_costs_its_task_only(ray_cluster, sources, single_process,
                                                     tmp_path, monkeypatch, step):
    root = tmp_path / "data"
    _ingest(root, sources[0])
    produce(nd.PRODUCER, Table.of(root), nd.NearDupSettings(partitions=2), executor="ray", log=quiet)
    _ingest(root, sources[1])
    _ingest(root, sources[2])
    marker = tmp_path / "exited-once"
    monkeypatch.setattr(nd, step, ExitOnce(str(marker), getattr(nd, step)))
    report = produce(nd.PRODUCER, Table.of(root), nd.NearDupSettings(partitions=2), executor="ray",
                     log=quiet)
    stats = report.stats
    assert marker.exists()  # the worker did die, and its task alone ran again
    assert stats.rounds >= 2 or step != "next_round"
    assert_same(_columns(root), single_process)


class FailOnWrite:
    """The write of one fragment raises; the others are committed."""

    def __init__(self, inner, fragment_id: int) -> None:
        self.inner, self.fragment_id = inner, fragment_id

    def __call__(self, frag):
        if frag.fragment_id == self.fragment_id:
            raise ValueError("injected")
        return self.inner(frag)


def test_a_failed_write_keeps_the_committed_fragments_and_the_rerun_equals_a_clean_run(
        sources, single_process, tmp_path, monkeypatch):
    root = tmp_path / "data"
    for source in sources:
        _ingest(root, source)
    real = nd.clusters
    monkeypatch.setattr(nd, "clusters", lambda *a, **k: FailOnWrite(real(*a, **k), 9))
    with pytest.raises(ValueError, match="injected"):
        produce(nd.PRODUCER, Table.of(root), nd.NearDupSettings(partitions=2), fragments_per_commit=1,
                log=quiet)
    ds = Table.of(root).newest()
    assert [f.fragment_id for f in fragments_missing(ds, ["near_dup"])][0] == 9
    kept = {f: files for f, files in data_files_by_field(ds, "near_dup").items() if files}
    assert sorted(kept) == list(range(9))
    monkeypatch.setattr(nd, "clusters", real)
    # the rerun: earlier rows are old now
    report = produce(nd.PRODUCER, Table.of(root), nd.NearDupSettings(partitions=2), log=quiet)
    assert report.fragments_written[0] == 9
    after = data_files_by_field(Table.of(root).newest(), "near_dup")
    assert {f: after[f] for f in kept} == kept  # committed files untouched
    assert_same(_columns(root), single_process)


def test_the_driver_holds_references_not_the_corpus(ray_cluster, tmp_path, monkeypatch):
    """What the driver keeps for the write (the compute every write task receives) does not
    grow with the rows: four times the corpus, the same size."""
    sizes = {}
    real = nd.clusters
    for rows in (1500, 6000):
        root = tmp_path / f"d{rows}"
        texts = generate(SyntheticSpec(rows=rows, seed=2, dup_fraction=0.05)).column("text")
        pq.write_table(pa.table({"text": texts}), tmp_path / f"{rows}.parquet")
        ingest(Table.of(root), str(tmp_path / f"{rows}.parquet"), rows_per_fragment=rows // 6, log=quiet)
        kept = {}
        monkeypatch.setattr(nd, "clusters",
                            lambda *a, _k=kept, **k: _k.setdefault("c", real(*a, **k)))
        produce(nd.PRODUCER, Table.of(root), nd.NearDupSettings(partitions=2), executor="ray", log=quiet)
        sizes[rows] = len(pickle.dumps(kept["c"]))
        assert all(type(v).__name__ == "ObjectRef" for v in kept["c"].payloads.values())
        shutil.rmtree(root)
    assert sizes[6000] < 1.2 * sizes[1500] + 512, sizes


def test_a_table_keeps_the_minhash_version_its_keys_were_written_with(sources, tmp_path):
    """Keys made by version 1 only match keys made by version 1: a table written before the
    compiled version keeps hashing new rows the old way (and says so), equal to a table run
    with version 1 throughout; a fresh table gets the current version."""
    old = nd.MinHashSettings(version=1)
    assert nd.MinHashSettings().version != old.version
    kept, pinned = tmp_path / "kept", tmp_path / "v1"
    said: list[str] = []
    for i, source in enumerate(sources):
        _ingest(kept, source)
        _ingest(pinned, source)
        produce(nd.PRODUCER, Table.of(kept),
                nd.NearDupSettings(minhash=old if i == 0 else nd.MinHashSettings()), log=said.append)
        produce(nd.PRODUCER, Table.of(pinned), nd.NearDupSettings(minhash=old), log=quiet)
    assert any("holds MinHash version 1" in m for m in said)
    assert_same(_columns(kept), _columns(pinned))
    assert get_json_config(lance.dataset(paths.table_uri(kept)), NEAR_DUP_KEY)["version"] == 1
