"""One shuffle permutation per run, stored once and read by every rank: the same blocks as a
StreamingDataset that builds its own, disjoint splits covering the filtered rows on every world
size, and a stored permutation that is half-written or built for something else is never used."""

import json
import shutil
import subprocess
import sys
from pathlib import Path

import lancedb
import numpy as np
import pyarrow as pa
import pytest
import torch
from lancedb import streaming
from lancedb.streaming import StreamingDataset

from lance_assets.train import data, streaming_adapter

FILTER = "NOT is_dup AND n_tokens > 0 AND id % 10 != 0"
NUM_SPLITS = 4
BLOCK_LEN = 17


def _rows(lo: int, n: int, rng) -> pa.Table:
    ids = np.arange(lo, lo + n)
    lengths = rng.integers(0, 30, n)
    return pa.table({
        "id": pa.array(ids, pa.int64()),
        "n_tokens": pa.array(lengths, pa.int32()),
        "is_dup": pa.array(rng.random(n) < 0.1),
        "input_ids": pa.array([[int(2 + (i * 7 + k) % 250) for k in range(n_)]
                               for i, n_ in zip(ids, lengths)], pa.list_(pa.int32())),
    })


def make_table(folder: Path):
    """A table of three fragments with deletions (row ids are not positions)."""
    rng = np.random.default_rng(0)
    table = lancedb.connect(folder).create_table("corpus", _rows(0, 200, rng))
    table.add(_rows(200, 150, rng))
    table.add(_rows(350, 90, rng))
    table.delete("id % 13 = 5")
    return table


def snapshot(table) -> data.TableSnapshot:
    return data.TableSnapshot(table=table, version=table.version,
                              tokenizer={"name": "test", "eos_id": 0, "pad_id": 1})


@pytest.fixture
def snap(tmp_path):
    return snapshot(make_table(tmp_path / "db"))


def key(snap, **changes) -> data.PermutationKey:
    kw = dict(table_version=snap.version, filter=FILTER, seed=7, epoch=0, num_splits=NUM_SPLITS)
    return data.PermutationKey(**(kw | changes))


def blocks(snap, permutations, *, world, rank, pack=True, epoch=0, state=None, take=None):
    bpe = (data.count_blocks(snap, FILTER, BLOCK_LEN, NUM_SPLITS) if pack
           else data.count_rows(snap, FILTER, NUM_SPLITS))
    ds = data.train_dataset(snap, filter=FILTER, block_len=BLOCK_LEN, blocks_per_epoch=bpe,
                            num_splits=NUM_SPLITS, rank=rank, world_size=world, seed=7,
                            epoch=epoch, pack=pack, read_batch_size=5, permutations=permutations)
    if state is not None:
        ds.load_state_dict(state)
    out = []
    for item in ds:
        out.append(item["input_ids"])
        if take is not None and len(out) == take:
            return out, ds.state_dict()
    return out, ds.state_dict()


@pytest.mark.parametrize("pack", [True, False])
@pytest.mark.parametrize("world", [1, 2, 4])
def test_stored_permutation_gives_the_blocks_of_a_per_rank_build(snap, tmp_path, world, pack):
    stored_root = tmp_path / "run" / "permutations"
    for epoch in (0, 1):
        for rank in range(world):
            own, _ = blocks(snap, None, world=world, rank=rank, pack=pack, epoch=epoch)
            shared, _ = blocks(snap, stored_root, world=world, rank=rank, pack=pack, epoch=epoch)
            assert own and len(shared) == len(own)
            assert all(torch.equal(a, b) for a, b in zip(own, shared))
    assert len(list(stored_root.glob("*/epoch-*/permutation.json"))) == 2  # one per epoch


def test_resume_from_a_state_on_another_world_size_matches_the_per_rank_build(snap, tmp_path):
    stored_root = tmp_path / "permutations"
    states, own_states = [], []
    for rank in range(2):
        _, state = blocks(snap, stored_root, world=2, rank=rank, take=6)
        _, own_state = blocks(snap, None, world=2, rank=rank, take=6)
        states.append(state)
        own_states.append(own_state)
    merged = StreamingDataset.merge_state_dicts(states)
    own_merged = StreamingDataset.merge_state_dicts(own_states)
    for rank in range(4):
        shared, _ = blocks(snap, stored_root, world=4, rank=rank, state=merged)
        own, _ = blocks(snap, None, world=4, rank=rank, state=own_merged)
        assert own and all(torch.equal(a, b) for a, b in zip(own, shared, strict=True))


@pytest.mark.parametrize("pack", [True, False])
def test_loader_workers_read_the_stored_permutation_in_the_order_of_no_workers(snap, tmp_path, pack):
    """The trainer's loader with worker processes and its default start method: the dataset
    pickles with the stored permutation as its location, not its rows, and the workers' blocks
    come out exactly as without workers, a batch size that cuts across cycles included."""
    stored_root = tmp_path / "permutations"
    bpe = (data.count_blocks(snap, FILTER, BLOCK_LEN, NUM_SPLITS) if pack
           else data.count_rows(snap, FILTER, NUM_SPLITS))
    kw = dict(filter=FILTER, block_len=BLOCK_LEN, blocks_per_epoch=bpe, num_splits=NUM_SPLITS,
              rank=0, world_size=1, seed=7, epoch=0, pack=pack, permutations=stored_root)

    def read(workers, cycles=1):
        loader = data.train_loader(data.train_dataset(snap, **kw), 7, workers,
                                   splits_per_rank=NUM_SPLITS, cycles=cycles)
        return [b for batch in loader for b in batch["input_ids"]], loader

    ds = data.train_dataset(snap, **kw)
    assert isinstance(ds, data.SharedPermutationDataset)
    state = ds.__getstate__()
    assert isinstance(state["_stored_permutation"], data.StoredPermutation)
    assert state["_perm_table"][1].num_rows == 0  # no permutation rows in the pickle
    alone, _ = read(0)
    assert len(alone) == bpe and len(alone) % 7  # the last batch is short
    # a cycle at a time, or a step's cycles at a time (the last round short too), 0 or 2 workers
    for workers, cycles in ((2, 3), (0, 5)):
        together, loader = read(workers, cycles)
        assert all(torch.equal(a, b) for a, b in zip(alone, together, strict=True)), (workers, cycles)
        assert loader.holding == 0


def test_an_epoch_ending_mid_step_leaves_every_step_checkpointable(snap, tmp_path):
    """The trainer's batches read a step at a time; when an epoch ends in the middle of a step,
    the next one reads the rest of that step first: every step boundary stays a checkpoint
    that resumes to the same blocks, with or without workers."""
    stored_root = tmp_path / "permutations"
    bpe = data.count_blocks(snap, FILTER, BLOCK_LEN, NUM_SPLITS)
    assert (bpe // NUM_SPLITS) % 8 == 3  # epoch 0 ends 12 blocks into a step of 32
    kw = dict(filter=FILTER, block_len=BLOCK_LEN, blocks_per_epoch=bpe, num_splits=NUM_SPLITS,
              rank=0, world_size=1, seed=7, permutations=stored_root)

    def steps(n, workers=0, state=None, epoch=0, accum=4):
        batches = data.TrainBatches(snap, epoch=epoch, state=state, batch_size=8,
                                    grad_accum=accum, num_workers=workers, **kw)
        out, states = [], []
        for _ in range(n):
            out.append(torch.cat([next(batches) for _ in range(accum)]))
            states.append((batches.epoch, batches.state_dict()))  # raises if not checkpointable
        batches.close()
        return out, states

    first_epoch = -(-bpe // 32)  # the step the epoch ends in
    plain, states = steps(first_epoch + 3)
    one_at_a_time, _ = steps(4 * (first_epoch + 3), accum=1)  # the same stream, 8 blocks a time
    assert torch.equal(torch.cat(plain), torch.cat(one_at_a_time))
    epoch, state = states[first_epoch - 1]  # after the step that began in epoch 0
    assert epoch == 1
    resumed, _ = steps(3, state=state, epoch=epoch)
    assert all(torch.equal(a, b) for a, b in zip(plain[first_epoch:], resumed, strict=True))
    with_workers, _ = steps(first_epoch + 3, workers=2)
    assert all(torch.equal(a, b) for a, b in zip(plain, with_workers, strict=True))


@pytest.mark.parametrize("world", [1, 2, 4])
def test_ranks_read_disjoint_splits_covering_every_filtered_row(snap, tmp_path, world):
    stored = data.shared_permutation(snap, key(snap), tmp_path / "p", build=True)
    seen = []
    for rank in range(world):
        ds = data.SharedPermutationDataset(
            snap.table, permutation=stored, columns=["id"], filter=FILTER, shuffle=True,
            shuffle_seed=7, epoch=0, num_splits=NUM_SPLITS, rank=rank, world_size=world)
        seen += [row["id"] for row in ds]
    wanted = snap.table.to_lance().to_table(columns=["id"], filter=FILTER).column(0).to_pylist()
    assert len(seen) == len(set(seen)) == len(wanted) - len(wanted) % NUM_SPLITS
    assert set(seen) <= set(wanted)
    assert seen != sorted(seen)  # shuffled


def test_a_dataset_asking_for_another_permutation_is_refused(snap, tmp_path):
    stored = data.shared_permutation(snap, key(snap), tmp_path / "p", build=True)
    with pytest.raises(data.PermutationError, match="asks for"):
        data.SharedPermutationDataset(snap.table, permutation=stored, columns=["id"],
                                      filter=FILTER, shuffle=True, shuffle_seed=8, epoch=0,
                                      num_splits=NUM_SPLITS, rank=0, world_size=1)


KILL_DURING_BUILD = """
import os, signal, sys
import lancedb
from lance_assets import storage
from lance_assets.train import data
from lance_assets_tests.test_shared_permutation import key, snapshot
table = lancedb.connect(sys.argv[1]).open_table("corpus")
snap = snapshot(table)
storage.write_atomic = lambda path, raw: os.kill(os.getpid(), signal.SIGKILL)
data.build_permutation(snap, key(snap), sys.argv[2])
"""


def test_a_build_killed_before_its_manifest_is_never_used_and_is_rebuilt(tmp_path):
    table = make_table(tmp_path / "db")
    snap, root = snapshot(table), tmp_path / "p"
    proc = subprocess.run([sys.executable, "-c", KILL_DURING_BUILD, str(tmp_path / "db"),
                           str(root)], capture_output=True, cwd=Path(__file__).parents[1])
    assert proc.returncode == -9, proc.stderr.decode()[-2000:]
    folder = key(snap).folder(root)
    assert list(folder.glob("rows-*.lance")) and not (folder / "permutation.json").exists()
    assert data.open_permutation(snap, key(snap), root) is None
    with pytest.raises(data.PermutationError, match="rank 0 stores it"):
        data.shared_permutation(snap, key(snap), root, build=False, wait_s=0.2)
    killed = {p.name for p in folder.glob("rows-*.lance")}
    stored = data.shared_permutation(snap, key(snap), root, build=True)
    assert Path(stored.uri).name not in killed  # rebuilt under a fresh name, the orphan unread
    own, _ = blocks(snap, None, world=1, rank=0)
    shared, _ = blocks(snap, root, world=1, rank=0)
    assert all(torch.equal(a, b) for a, b in zip(own, shared, strict=True))


def test_a_damaged_stored_permutation_is_refused(snap, tmp_path):
    root = tmp_path / "p"
    stored = data.shared_permutation(snap, key(snap), root, build=True)
    manifest = key(snap).folder(root) / "permutation.json"
    m = json.loads(manifest.read_text())
    m["split_sizes"][0] += 1
    manifest.write_text(json.dumps(m))
    with pytest.raises(data.PermutationError, match="permutation.json|rows in splits"):
        data.shared_permutation(snap, key(snap), root, build=True)
    shutil.rmtree(stored.uri)
    with pytest.raises(data.PermutationError, match="delete"):
        data.open_permutation(snap, key(snap), root)
    manifest.write_text("{")
    with pytest.raises(data.PermutationError, match="unreadable"):
        data.open_permutation(snap, key(snap), root)


def test_rows_that_are_not_a_permutation_of_the_filter_are_refused(snap, tmp_path):
    import lance

    root = tmp_path / "p"
    stored = data.shared_permutation(snap, key(snap), root, build=True)
    rows = lance.dataset(stored.uri).to_table()
    split = rows.column("split_id").to_numpy().copy()
    split[-1] = NUM_SPLITS  # a split id out of range
    lance.write_dataset(rows.set_column(1, "split_id", pa.array(split, pa.uint64())), stored.uri,
                        mode="overwrite")
    with pytest.raises(data.PermutationError, match="out of range"):
        data.open_permutation(snap, key(snap), root)


@pytest.mark.parametrize("change", ["filter", "seed", "version", "num_splits"])
def test_a_permutation_built_for_another_run_is_refused(snap, tmp_path, change):
    root = tmp_path / "p"
    built = key(snap)
    data.shared_permutation(snap, built, root, build=True)
    if change == "version":  # new rows land: the run now reads another version
        snap.table.add(_rows(1000, 40, np.random.default_rng(1)))
        snap = snapshot(snap.table)
    wanted = key(snap, **{"filter": dict(filter=FILTER + " AND n_tokens > 3"),
                          "seed": dict(seed=8), "version": {},
                          "num_splits": dict(num_splits=2)}[change])
    assert wanted != built and wanted.folder(root) != built.folder(root)
    # a copied or misplaced folder: the manifest still says what it was built for
    shutil.copytree(built.folder(root), wanted.folder(root))
    with pytest.raises(data.PermutationError, match="built for") as e:
        data.shared_permutation(snap, wanted, root, build=True)
    assert str(wanted.folder(root) / "permutation.json") in str(e.value)


def test_the_lancedb_internals_the_adapter_relies_on_are_the_installed_ones():
    """The day lancedb changes what ``streaming_adapter`` relies on, this fails (and so does
    every ``SharedPermutationDataset``, instead of silently building its own permutation)."""
    assert streaming_adapter.streaming_internals_problems() == []


def test_a_lancedb_that_reads_the_permutation_elsewhere_is_refused(snap, tmp_path, monkeypatch):
    stored = data.shared_permutation(snap, key(snap), tmp_path / "p", build=True)

    def another_reader(self):  # a new StreamingDataset method reading splits on its own
        return streaming.Permutation.from_tables(self._table, self._perm_table, split=0)

    monkeypatch.setattr(StreamingDataset, "_peek", another_reader, raising=False)
    problems = streaming_adapter.streaming_internals_problems()
    assert problems and "_peek" in problems[0]
    with pytest.raises(RuntimeError, match="lancedb .* changed what"):
        data.SharedPermutationDataset(snap.table, permutation=stored, columns=["id"],
                                      filter=FILTER, shuffle=True, shuffle_seed=7, epoch=0,
                                      num_splits=NUM_SPLITS, rank=0, world_size=1)


def test_a_worker_reads_the_pinned_version_after_the_table_moved_on(snap, tmp_path):
    """A DataLoader worker reopens the table at its newest version: the rows it reads are
    still those of the version the permutation was built on."""
    stored_root = tmp_path / "permutations"
    before, _ = blocks(snap, stored_root, world=1, rank=0)
    bpe = data.count_blocks(snap, FILTER, BLOCK_LEN, NUM_SPLITS)
    ds = data.train_dataset(snap, filter=FILTER, block_len=BLOCK_LEN, blocks_per_epoch=bpe,
                            num_splits=NUM_SPLITS, rank=0, world_size=1, seed=7, epoch=0,
                            read_batch_size=5, permutations=stored_root)
    other = lancedb.connect(tmp_path / "db").open_table("corpus")
    other.delete("id % 2 = 0")  # half the rows gone from the newest version
    other.add(_rows(2000, 50, np.random.default_rng(3)))
    worker = object.__new__(type(ds))  # what a spawned worker does with the pickled dataset
    worker.__setstate__(ds.__getstate__())
    after = [item["input_ids"] for item in worker]
    assert before and all(torch.equal(a, b) for a, b in zip(before, after, strict=True))
