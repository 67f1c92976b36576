"""Training reads one table version, tagged for the run: every rank and node gets the same one,
and no maintenance removes it while the run, its resume, `samples` or the forensics need it."""

import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import dagster as dg
import lance
import pytest

from lance_assets import paths
from lance_assets_tests.helpers import build_table, processes_mentioning, steps_logged

REPO = Path(__file__).resolve().parents[1]
TRAIN = ["--seq-len", "32", "--batch-size", "4", "--num-splits", "8", "--warmup", "2",
         "--eval-every", "1000", "--eval-blocks", "4", "--log-every", "1000", "--filter", "NOT is_dup"]


@pytest.fixture
def root(tokenized_root, tmp_path):
    """A writable copy of the shared tokenized corpus, without the snapshot tags of the runs
    other tests trained on it."""
    copy = tmp_path / "data"
    shutil.copytree(tokenized_root, copy)
    ds = lance.dataset(paths.table_uri(copy))
    for tag in ds.tags.list():
        ds.tags.delete(tag)
    return copy


def new_commits(root) -> None:
    """What the hourly ingest and the backfills do meanwhile: new rows, their columns."""
    build_table(root, "synthetic:1800", rows_per_fragment=500, upto=["dedup_flag", "token_ids"])


def test_a_commit_landing_between_two_ranks_starts_leaves_both_on_one_version(root, tmp_path):
    """Rank 0 opens the table; a commit lands (new rows, so other block counts); only then
    does rank 1 start. Both read the version rank 0 resolved."""
    flags = tmp_path / "flags"
    flags.mkdir()
    before = lance.dataset(paths.table_uri(root)).version
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
           "-m", "lance_assets_tests.rank_start_driver", "--data", str(root),
           "--out", str(tmp_path / "run"), "--steps", "2", *TRAIN]
    proc = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env={**os.environ, "RANK_START_FLAGS": str(flags),
                                            "OMP_NUM_THREADS": "1"})
    try:
        deadline = time.monotonic() + 240
        while not (flags / "opened").exists():
            assert proc.poll() is None and time.monotonic() < deadline, proc.stderr.read()[-3000:]
            time.sleep(0.05)
        new_commits(root)
        assert lance.dataset(paths.table_uri(root)).version > before
        (flags / "committed").touch()
        _, err = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, err[-3000:]
    assert (flags / "rank0").read_text() == (flags / "rank1").read_text() == str(before)
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["table_version"] == before


CONFIG = {"steps": 60, "seq_len": 32, "batch_size": 4, "num_splits": 8, "warmup": 2,
          "eval_every": 1000, "eval_blocks": 4, "ckpt_every": 20, "log_every": 1000,
          "nproc_per_node": 2, "run_name": "snap", "filter": "NOT is_dup"}


def train(root, config) -> dict:
    """The `pretrained_model` asset (torchrun through Dagster Pipes), materialized in this
    process: the test's own Python already holds the definitions, and the ranks are torchrun's
    processes either way. Its metadata's plain values."""
    from lance_assets.definitions import defs
    from lance_assets.defs.resources import LanceStore
    from lance_assets.defs.training.torchrun import TorchrunPipesClient

    result = dg.materialize(
        [defs.get_assets_def("pretrained_model")],
        resources={"lance_store": LanceStore(data_dir=str(root)),
                   "pipes_subprocess_client": TorchrunPipesClient(termination_timeout_seconds=55)},
        run_config={"ops": {"pretrained_model": {"config": config}}})
    meta = result.asset_materializations_for_node("pretrained_model")[0].metadata
    return {k: v.value for k, v in meta.items() if isinstance(v.value, (int, str))}


class Background(threading.Thread):
    """``train`` in a thread (Dagster installs no signal handler off the main thread): the test
    freezes its ranks and moves the table meanwhile."""

    def __init__(self, *args):
        super().__init__(daemon=True)
        self.args, self.result, self.error = args, None, None
        self.start()

    def run(self):
        try:
            self.result = train(*self.args)
        except BaseException as e:  # handed to the test by finished()
            self.error = e

    def finished(self, timeout: float = 600) -> dict:
        self.join(timeout)
        assert not self.is_alive(), "the training run did not finish"
        if self.error is not None:
            raise self.error
        return self.result


def test_the_most_aggressive_maintenance_during_training_leaves_its_snapshot_readable(root):
    """A 2-rank run is frozen mid-run while the table moves on (new rows, deletes) and
    `table_maintenance` compacts and removes every version but the newest and the tagged ones.
    Thawed, the run finishes; it resumes from its checkpoint on the same snapshot (on one rank);
    `samples` and `forensics` read it."""
    from lance_assets.definitions import defs
    from lance_assets.defs.resources import LanceStore

    uri = paths.table_uri(root)
    out = root / "train" / "snap"
    run = Background(root, CONFIG)
    deadline = time.monotonic() + 300
    while not steps_logged(out):
        if not run.is_alive() or time.monotonic() > deadline:
            run.finished(timeout=0)
            raise AssertionError("the run logged no step")
        time.sleep(0.05)
    ranks = processes_mentioning(str(out))
    for pid in ranks:  # freeze the run: everything below happens in the middle of it
        os.kill(pid, signal.SIGSTOP)
    try:
        snapshot = lance.dataset(uri).tags.list()["train-snap"]["version"]
        new_commits(root)
        lance.dataset(uri).delete("id % 3 = 0")  # rows the run reads, gone from newer versions
        store = LanceStore(data_dir=str(root))
        result = dg.materialize([defs.get_assets_def("table_maintenance")],
                                resources={"lance_store": store},
                                run_config={"ops": {"table_maintenance": {"config": {
                                    "keep_versions_hours": 0}}}})
        meta = {k: v.value for k, v in
                result.asset_materializations_for_node("table_maintenance")[0].metadata.items()}
        assert meta["fragments_compacted"] > 0 and meta["versions_removed"] > 0
        assert meta["tags_kept"] == {"train-snap": snapshot} and meta["versions_kept"] == 2
        assert meta["bytes_reclaimed"] > 0
        assert max(steps_logged(out)) < CONFIG["steps"]  # the run is still in the middle
    finally:
        for pid in ranks:
            os.kill(pid, signal.SIGCONT)
    first = run.finished()
    assert first["step"] == CONFIG["steps"] and first["table_version"] == snapshot
    assert first["lance/snapshot_tag"] == "train-snap" and first["table_tag"] == "train-snap"

    # resumed on one rank with twice the accumulation (the same global batch): one torchrun
    # process less, and the checkpoint's snapshot is still the one the ranks read
    more = train(root, {**CONFIG, "steps": CONFIG["steps"] + 10, "resume": "auto",
                        "nproc_per_node": 1, "grad_accum": 2})
    assert more["step"] == CONFIG["steps"] + 10 and more["table_version"] == snapshot
    assert sorted(steps_logged(out)) == list(range(1, CONFIG["steps"] + 11))

    result = dg.materialize([defs.get_assets_def(k) for k in ("samples", "forensics")],
                            resources={"lance_store": store},
                            run_config={"ops": {
                                "samples": {"config": {"prompts": ["The"], "max_new_tokens": 8}},
                                "forensics": {"config": {"near_dup_sample": 50}}}})
    assert result.success
    meta = {k: v.value for k, v in
            result.asset_materializations_for_node("forensics")[0].metadata.items()}
    assert meta["lance/table_version"] == snapshot and "train-snap" in meta["pinned"]
