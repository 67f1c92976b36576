"""The data root on object storage: an S3 server (moto) on 127.0.0.1, started by the tests.

Credentials reach Lance, fsspec and the torchrun trainer only through the environment; the tests
use a recognisable secret and look for it everywhere something is stored.
"""

import logging
import os
import pickle
import secrets
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import boto3
import dagster as dg
import lance
import pyarrow as pa
import pytest
from moto.moto_server.werkzeug_app import MotoRequestHandler, create_backend_app
from werkzeug.serving import make_server

from lance_assets import paths, storage
from lance_assets.definitions import defs
from lance_assets.defs.curation.checks import CHECKS
from lance_assets.defs.resources import lance_store_from_env
from lance_assets.defs.training.torchrun import TorchrunPipesClient
from lance_assets.ingest.raw_text import ingest, ingest_lock
from lance_assets.table import Table
from lance_assets.train import checkpoint, data
from lance_assets_tests.helpers import quiet

REPO = str(Path(__file__).resolve().parents[1])  # the subprocesses import this checkout


@pytest.fixture(scope="session")
def s3_endpoint():
    """One S3 server per test process: fsspec keeps one filesystem per process, which keeps the
    endpoint it was made with (the timing group's tests run apart from the module's others)."""
    logging.getLogger("werkzeug").setLevel(logging.WARNING)  # one line per request otherwise
    # moto's S3 app alone: its usual dispatcher matches every request against the URL patterns
    # of every AWS service it mocks (a twentieth of the whole-graph test's CPU)
    server = make_server("127.0.0.1", 0, create_backend_app("s3"), threaded=True,
                         request_handler=MotoRequestHandler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    host, port = server.server_address[:2]
    yield f"http://{host}:{port}"
    server.shutdown()
    thread.join()


@pytest.fixture
def s3(s3_endpoint, monkeypatch):
    """A fresh bucket and the standard variables pointing at it; returns (bucket, secret, client)."""
    secret = "s3cr3t-" + secrets.token_hex(8)
    env = {"AWS_ENDPOINT_URL": s3_endpoint, "AWS_ACCESS_KEY_ID": "AKIDLANCEASSETSTEST",
           "AWS_SECRET_ACCESS_KEY": secret, "AWS_REGION": "us-east-1", "AWS_ALLOW_HTTP": "true"}
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    bucket = "lance-assets-" + secrets.token_hex(4)
    client = boto3.client("s3")
    client.create_bucket(Bucket=bucket)
    return bucket, secret, client


def keys(client, bucket, prefix=""):
    pages = client.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix)
    return [o["Key"] for page in pages for o in page.get("Contents", [])]


# ---------------------------------------------------------------------------------------------
# The whole graph


def test_whole_graph_on_s3_keeps_everything_in_the_bucket_and_no_secret_anywhere(
        s3, tmp_path, monkeypatch):
    bucket, secret, client = s3
    root = f"s3://{bucket}/prefix"
    monkeypatch.setenv("LANCE_ASSETS_DATA", root)
    monkeypatch.setenv("LANCE_ASSETS_SOURCE", "synthetic:200")
    monkeypatch.chdir(tmp_path)  # the default ./data would land here: it must stay empty
    run_config = {"ops": {
        "raw_text": {"config": {"rows_per_fragment": 100}},  # two fragments
        "pretrained_model": {"config": {"steps": 10, "seq_len": 64, "batch_size": 8,
                                        "eval_every": 10, "eval_blocks": 4, "ckpt_every": 5,
                                        "nproc_per_node": 1,
                                        "run_name": "s3run"}},
        "samples": {"config": {"prompts": ["The", ""], "max_new_tokens": 8}},
        "vector_index": {"config": {"recall_queries": 5}},
        "forensics": {"config": {"near_dup_sample": 100}},
        # one run per arm, one small validation pass each
        "curation_ablation": {"config": {"seeds": [0], "token_budget": 2048, "eval_blocks": 8,
                                         "evals_per_run": 1}},
    }}
    resources = {"lance_store": lance_store_from_env(),
                 "pipes_subprocess_client": TorchrunPipesClient()}
    result = dg.materialize([*defs.assets, *CHECKS], resources=resources, run_config=run_config)
    assert result.success

    # the table lives in the bucket, with every column an asset reported
    stored = keys(client, bucket)
    assert any(k.startswith("prefix/lance/corpus.lance/_versions/") for k in stored)
    assert any(k.startswith("prefix/lance/corpus.lance/data/") for k in stored)
    ds = lance.dataset(paths.table_uri(root))
    assert ds.uri.startswith(f"s3://{bucket}/prefix/")
    reported = set()
    for mat in result.get_asset_materialization_events():
        schema = mat.materialization.metadata.get("dagster/column_schema")
        if schema is not None:
            reported |= {c.name for c in schema.value.columns}
    assert {"text", "is_dup", "input_ids", "n_tokens", "near_dup", "embedding",
            "chunk_embeddings"} <= reported
    assert reported <= set(ds.schema.names)
    assert ds.count_rows() == 200

    # checkpoints, tokenizer, samples and reports under the same prefix
    assert "prefix/train/s3run/ckpt_0000010.pt" in stored
    assert "prefix/train/s3run/summary.json" in stored and "prefix/train/LATEST" in stored
    assert "prefix/tokenizers/LATEST" in stored
    sha = client.get_object(Bucket=bucket, Key="prefix/tokenizers/LATEST")["Body"].read().decode().strip()
    assert f"prefix/tokenizers/{sha}.json" in stored
    assert "prefix/samples/samples.json" in stored and "prefix/reports/forensics.md" in stored
    assert "prefix/reports/training_data_summary/s3run.json" in stored  # what the run read
    latest = paths.latest_checkpoint_pointer(root).read_text()
    assert latest == f"s3://{bucket}/prefix/train/s3run/ckpt_0000010.pt"
    assert checkpoint.load(latest)["step"] == 10  # weights-only, through fsspec
    assert not (tmp_path / "data").exists() and not any(tmp_path.iterdir())
    # every document's story reads the run records and reports from the bucket too
    story = next(m.materialization.metadata for m in result.get_asset_materialization_events()
                 if m.asset_key == dg.AssetKey("document_stories"))
    assert "s3run" in story["documents"].value
    assert any(k.startswith("prefix/reports/stories/") for k in keys(client, bucket))

    # no credential in any stored object (table files, manifests, checkpoints, reports) ...
    for key in stored:
        body = client.get_object(Bucket=bucket, Key=key)["Body"].read()
        assert secret.encode() not in body and b"AKIDLANCEASSETSTEST" not in body, key
    assert secret not in repr(ds.config())
    # ... nor in the run config or any materialization's metadata
    assert secret not in repr(result.dagster_run.run_config)
    for mat in result.get_asset_materialization_events():
        assert secret not in repr(mat.materialization.metadata)
    # ... nor in the loader state spawned DataLoader workers receive (its shared-memory
    # counters travel separately, through multiprocessing)
    snap = data.open_snapshot(Table.of(root))
    loader = data.train_dataset(snap, filter="n_tokens > 0", block_len=65, blocks_per_epoch=4,
                                num_splits=1, rank=0, world_size=1, seed=0, epoch=0)
    state = loader.__getstate__()
    reopen = pickle.dumps(state["_table"])
    assert f"{bucket}/prefix/lance".encode() in reopen and secret.encode() not in reopen
    for key, value in state.items():
        if "Array" not in type(value).__name__:
            assert secret.encode() not in pickle.dumps(value), key


# ---------------------------------------------------------------------------------------------
# Concurrency: Lance's commits and the ingest lease


def test_lance_commits_on_s3_let_exactly_one_racer_win_each_version(s3):
    """What the table's safety under concurrent writers rests on: the manifest is written with a
    create-if-absent PUT, so racing commits of one version cannot overwrite each other. Six
    appends planned on version 1 race with no retries: each one either lands on a version of
    its own (an append that finds a newer version may rebase onto it) or fails with a commit
    conflict, and the table holds exactly the rows of those that landed."""
    bucket, _, _ = s3
    uri = f"s3://{bucket}/race/t.lance"
    lance.write_dataset(pa.table({"a": [0]}), uri)
    frags = [lance.fragment.write_fragments(pa.table({"a": [i]}), uri) for i in range(1, 7)]
    start, errors, landed = threading.Barrier(len(frags)), [], []

    def commit(i, f):
        start.wait()
        try:
            ds = lance.LanceDataset.commit(uri, lance.LanceOperation.Append(f), read_version=1,
                                           max_retries=0)
            landed.append((ds.version, i))
        except Exception as e:  # noqa: BLE001 - collected and checked below
            errors.append(e)

    threads = [threading.Thread(target=commit, args=(i, f)) for i, f in enumerate(frags, 1)]
    [t.start() for t in threads]
    [t.join() for t in threads]
    from lance.commit import CommitConflictError

    assert all(isinstance(e, CommitConflictError) for e in errors), errors
    assert landed and len(landed) + len(errors) == len(frags)
    versions = sorted(v for v, _ in landed)
    assert versions == list(range(2, 2 + len(landed)))  # one version each, none written twice
    ds = lance.dataset(uri)
    assert ds.version == 1 + len(landed)
    # nothing overwritten, nothing from a failed commit
    assert sorted(ds.to_table().column("a").to_pylist()) == sorted([0, *(i for _, i in landed)])


def test_concurrent_ingests_into_s3_add_each_row_exactly_once(s3):
    bucket, _, _ = s3
    root = f"s3://{bucket}/twice"
    reports, errors = [], []

    def run():
        try:
            reports.append(ingest(Table.of(root), "synthetic:400", rows_per_fragment=100, rows_per_commit=100,
                                  log=quiet))
        except Exception as e:  # noqa: BLE001
            errors.append(e)

    threads = [threading.Thread(target=run) for _ in range(2)]
    with ingest_lock(Table.of(root), log=quiet):  # both start while a third ingest holds the lease
        [t.start() for t in threads]
        time.sleep(1.5)
        assert not Table.of(root).exists()  # neither wrote past the lease
    [t.join() for t in threads]
    assert not errors
    assert sorted(r.rows_added for r in reports) == [0, 400]
    ds = lance.dataset(paths.table_uri(root))
    assert ds.count_rows() == 400
    assert sorted(ds.to_table(columns=["id"])["id"].to_pylist()) == list(range(400))


# The tests' leases live in one process with the S3 server (one GIL) on a loaded machine: a
# renewal (every TTL / 4: two requests) can wait over a second, so a holder keeps its lease only
# with TTLs of several seconds.
LEASE_TTL_S = 6.0


@pytest.mark.xdist_group("timing")  # TTLs of seconds: not beside another timing test
def test_lease_waits_for_its_holder_and_takes_over_an_expired_one(s3):
    bucket, _, _ = s3
    folder = f"s3://{bucket}/lease/corpus.ingest.lock"
    ttl = LEASE_TTL_S
    a = storage.ObjectLease(folder, "a", ttl_s=ttl, poll_s=0.2, log=quiet)
    a.acquire()
    b = storage.ObjectLease(folder, "b", ttl_s=ttl, poll_s=0.2, log=quiet)
    got = threading.Event()
    waiter = threading.Thread(target=lambda: (b.acquire(), got.set()))
    waiter.start()
    assert not got.wait(ttl + 1)  # longer than the TTL: a keeps renewing, so b keeps waiting
    a.check()
    a.release()
    waiter.join(timeout=10 * ttl)
    assert got.is_set() and (a.generation, b.generation) == (None, 2)  # a's was 1

    # b dies without releasing (its renewals stop): after the TTL c takes over, and b, if it
    # was merely stalled, finds out before its next commit
    b._stop.set()
    b._thread.join()
    c = storage.ObjectLease(folder, "c", ttl_s=ttl, poll_s=0.2, log=quiet)
    t0 = time.monotonic()
    c.acquire()
    # c waits for what is left of b's TTL: b renewed at most TTL / 4 (and a request) before
    assert ttl / 4 < time.monotonic() - t0 < 3 * ttl and c.generation == b.generation + 1
    with pytest.raises(storage.LeaseLost):
        b.check()
    c.release()


@pytest.mark.xdist_group("timing")  # TTLs of seconds: not beside another timing test
def test_an_ingest_frozen_past_its_lease_adds_nothing_twice(s3, tmp_path, monkeypatch):
    """The clock-based lease cannot stop a holder frozen (SIGSTOP) between its lease check and
    its commit: a second ingest takes the lease over after the TTL and completes. Thawed, the
    frozen commit is rejected by the table (it was planned on an older version), and every
    document is in the table once, with the ids of a single uninterrupted ingest."""
    from lance_assets_tests.stall_driver import start_frozen, table_rows

    bucket, _, _ = s3
    root, source = f"s3://{bucket}/frozen", "synthetic:3000"
    monkeypatch.setenv(storage.LEASE_TTL_ENV, str(LEASE_TTL_S))  # the second ingest's too
    frozen = start_frozen(root, source, 2)
    time.sleep(LEASE_TTL_S + 0.5)  # its lease expires: the renewal thread is frozen with it
    second = ingest(Table.of(root), source, rows_per_commit=1000, rows_per_fragment=512, log=quiet)
    assert second.rows_added == 3000 - 1024 and second.lock_wait_s < 30
    os.kill(frozen.pid, signal.SIGCONT)
    out, err = frozen.communicate(timeout=300)
    # its stale commit conflicted; the retry then found the lease taken over and stopped
    assert frozen.returncode != 0 and "LeaseLost" in err, err[-3000:]
    reference = tmp_path / "reference"
    ingest(Table.of(reference), source, rows_per_commit=1000, rows_per_fragment=512, log=quiet)
    assert table_rows(root) == table_rows(reference)


GENERATION_REUSE_CONTENDER = """
import os, signal, sys, time
from lance_assets import storage
calls = {"n": 0}
holder = storage.ObjectLease._holder
def frozen_after_looking(self, gen):
    calls["n"] += 1
    if calls["n"] == 1:  # it has seen the newest generation; freeze before it takes the next
        os.kill(os.getpid(), signal.SIGSTOP)
    return holder(self, gen)
storage.ObjectLease._holder = frozen_after_looking
lease = storage.ObjectLease(sys.argv[1], "contender", ttl_s=float(sys.argv[2]), poll_s=0.05,
                            log=lambda m: None)
lease.acquire()
print(f"acquired {lease.generation} at {time.time()}", flush=True)
lease.release()
"""


@pytest.mark.xdist_group("timing")  # TTLs of seconds: not beside another timing test
def test_lease_contenders_under_the_generation_reuse_interleaving_never_both_hold(s3):
    """Contender B looks at the lease (generation 1, released) and freezes. Meanwhile A takes
    and releases generation 2, and D takes generation 3 and holds it. Thawed, B tries to create
    generation 2: it must not succeed (generations are never deleted, so none is created
    twice), and B waits for D instead of holding the lease next to it."""
    bucket, _, _ = s3
    folder = f"s3://{bucket}/reuse/corpus.ingest.lock"
    first = storage.ObjectLease(folder, "first", ttl_s=LEASE_TTL_S, poll_s=0.05, log=quiet)
    first.acquire()
    first.release()
    contender = subprocess.Popen([sys.executable, "-c", GENERATION_REUSE_CONTENDER, folder,
                                  str(LEASE_TTL_S)],
                                 env={**os.environ, "PYTHONPATH": REPO}, stdout=subprocess.PIPE,
                                 stderr=subprocess.PIPE, text=True)
    from lance_assets_tests.stall_driver import is_stopped

    deadline = time.monotonic() + 60
    while not is_stopped(contender.pid):
        assert contender.poll() is None and time.monotonic() < deadline, contender.stderr.read()
        time.sleep(0.05)
    a = storage.ObjectLease(folder, "a", ttl_s=LEASE_TTL_S, poll_s=0.05, log=quiet)
    a.acquire()
    a.release()
    d = storage.ObjectLease(folder, "d", ttl_s=LEASE_TTL_S, poll_s=0.05, log=quiet)
    d.acquire()
    assert (a.generation, d.generation) == (None, 3)
    os.kill(contender.pid, signal.SIGCONT)
    held_until = time.monotonic() + 3.0  # D renews; B must keep waiting
    while time.monotonic() < held_until:
        assert contender.poll() is None, f"the contender took the lease D holds: {contender.stdout.read()}"
        d.check()
        time.sleep(0.1)
    released_at = time.time()
    d.release()
    out, err = contender.communicate(timeout=60)
    assert contender.returncode == 0, err[-2000:]
    _, gen, _, at = out.split()
    assert int(gen) == 4 and float(at) >= released_at  # a new generation, after D let go


def test_object_lease_is_refused_where_exclusive_create_is_not_verified():
    with pytest.raises(storage.StorageConfigError, match="create-if-absent"):
        storage.ObjectLease("gs://bucket/lock", "x")


# ---------------------------------------------------------------------------------------------
# Atomic writes and the root's validation

KILL_BEFORE_RENAME = """
import os, signal, sys
from lance_assets import storage
os.replace = lambda *a: os.kill(os.getpid(), signal.SIGKILL)  # dies between fsync and rename
storage.write_atomic(sys.argv[1], b"new" * 100_000)
"""


def test_atomic_write_killed_before_the_rename_leaves_the_old_file(tmp_path):
    target = tmp_path / "run" / "LATEST"
    storage.write_atomic(target, b"old")
    proc = subprocess.run([sys.executable, "-c", KILL_BEFORE_RENAME, str(target)],
                          env={**os.environ, "PYTHONPATH": REPO}, check=False)
    assert proc.returncode == -signal.SIGKILL
    assert target.read_bytes() == b"old"
    leftovers = [p.name for p in target.parent.iterdir() if p.name != "LATEST"]
    assert len(leftovers) == 1 and leftovers[0].startswith(".LATEST.tmp-")
    assert storage.remove_partial_writes(target.parent, "LATEST") == 1
    storage.write_atomic(target, b"new")
    assert target.read_bytes() == b"new" and [p.name for p in target.parent.iterdir()] == ["LATEST"]


KILL_MID_UPLOAD = """
import functools, os, signal, sys
import s3fs
from lance_assets import storage
# a multipart upload (5 MiB parts), killed after its first part is on the server
s3fs.S3FileSystem._pipe_file = functools.partialmethod(s3fs.S3FileSystem._pipe_file,
                                                       chunksize=5 * 2**20, max_concurrency=1)
original, parts = s3fs.S3FileSystem._call_s3, []
async def call(self, method, *args, **kwargs):
    if method == "upload_part":
        parts.append(1)
        if len(parts) == 2:
            os.kill(os.getpid(), signal.SIGKILL)
    return await original(self, method, *args, **kwargs)
s3fs.S3FileSystem._call_s3 = call
storage.write_atomic(sys.argv[1], b"n" * (12 * 2**20))
"""


def test_atomic_write_on_s3_is_one_object_and_a_killed_upload_leaves_the_old_one(s3):
    bucket, _, client = s3
    uri = f"s3://{bucket}/w/train/LATEST"
    storage.write_atomic(uri, b"old")
    assert keys(client, bucket, "w/") == ["w/train/LATEST"]  # no temp objects, no folders
    proc = subprocess.run([sys.executable, "-c", KILL_MID_UPLOAD, uri],
                          env={**os.environ, "PYTHONPATH": REPO}, check=False)
    assert proc.returncode == -signal.SIGKILL
    assert storage.read_bytes(uri) == b"old"
    assert keys(client, bucket, "w/") == ["w/train/LATEST"]
    storage.write_atomic(uri, b"new")
    assert storage.read_bytes(uri) == b"new"


def test_checkpoints_on_s3_keep_the_newest_and_resume_skips_a_truncated_one(s3):
    import torch

    bucket, _, client = s3
    out = f"s3://{bucket}/ck/train/run"
    assert checkpoint.load_for_resume("auto", out) == (None, None)
    for step in (1, 2, 3):
        state = {**dict.fromkeys(checkpoint.RESUME_KEYS, 0), "step": step,
                 "model": {"w": torch.ones(2)}, "model_config": {}}  # every key a resume reads
        checkpoint.save_atomic(state, out, step, keep=2)
    assert keys(client, bucket, "ck/") == ["ck/train/run/ckpt_0000002.pt",
                                           "ck/train/run/ckpt_0000003.pt"]
    newest = f"{out}/ckpt_0000003.pt"
    storage.write_atomic(newest, storage.read_bytes(newest)[:100])  # a file that is not whole
    logged = []
    path, state = checkpoint.load_for_resume("auto", out, log=logged.append)
    assert path.name == "ckpt_0000002.pt" and state["step"] == 2 and "skipping" in logged[0]


@pytest.mark.parametrize("uri, fix", [
    ("s3://AKID:secret@bucket/prefix", "must not carry credentials"),
    ("s3://bucket/prefix?secret=x", "must not carry credentials"),
    ("ftp://host/prefix", "unsupported scheme"),
])
def test_a_root_uri_with_credentials_or_an_unknown_scheme_is_refused(uri, fix):
    with pytest.raises(storage.StorageConfigError, match=fix):
        paths.data_dir(uri)


def test_a_plain_http_endpoint_without_allow_http_is_refused_with_the_fix(monkeypatch):
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:9")
    monkeypatch.delenv("AWS_ALLOW_HTTP", raising=False)
    with pytest.raises(storage.StorageConfigError, match="AWS_ALLOW_HTTP=true"):
        paths.data_dir("s3://bucket/prefix")


def test_local_roots_keep_resolving_to_absolute_paths(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert paths.data_dir("data") == tmp_path / "data"
    assert paths.table_uri("data") == "data/lance/corpus.lance"
    assert storage.storage_options_for(str(tmp_path)) == {}


def test_ingest_where_no_lease_is_possible_is_refused_unless_one_ingest_is_promised(monkeypatch):
    from lance_assets.ingest.raw_text import SINGLE_INGEST_ENV, ingest_lock

    monkeypatch.delenv(SINGLE_INGEST_ENV, raising=False)
    with pytest.raises(storage.StorageConfigError, match=SINGLE_INGEST_ENV), \
            ingest_lock(Table.of("gs://bucket/prefix"), log=quiet):
        pass
    monkeypatch.setenv(SINGLE_INGEST_ENV, "1")
    with ingest_lock(Table.of("gs://bucket/prefix"), log=quiet) as held:
        held.check()  # no lock to lose


def test_semantic_dup_store_on_s3_reads_what_a_local_one_reads(s3, tmp_path):
    """The side store's ranged and scattered reads through fsspec: a cluster's file, the slices
    of run files, read for comparing and whole, equal the same store on local disk."""
    import numpy as np

    from lance_assets.embeddings import vector_files as vf

    bucket, _, _ = s3
    stores = [vf.Store(f"s3://{bucket}/semantic_dup"), vf.Store(str(tmp_path / "semantic_dup"))]
    rng = np.random.default_rng(11)
    first = rng.integers(-127, 128, (30, 384)).astype(np.int8)
    runs = [(np.arange(100 * r, 100 * r + 9), rng.integers(0, 2, 9),
             rng.integers(-127, 128, (9, 384)).astype(np.int8)) for r in (1, 2)]
    got = []
    for store in stores:
        state = {"generation": 0, "segments": {
            str(c): [store.write_segment(0, c, np.arange(c * 15, c * 15 + 15),
                                         np.arange(c * 15, c * 15 + 15), first[c * 15:c * 15 + 15])]
            for c in (0, 1)}}
        for ids, homes, vecs in runs:
            state["segments"].update(store.append_run(0, state["segments"], homes, ids, ids,
                                                      vecs))
        tails = store.tails(state, [0, 1])
        got.append([(p.ids.tolist(), p.reps.tolist(), p.inv.tolist(), p.vt.copy())
                    for c in (0, 1) for p in store.cluster(state, c, tails)]
                   + [store.read_cluster(state, c) for c in (0, 1)])
    s3_parts, local_parts = got
    assert len(s3_parts) == len(local_parts) == 4
    for a, b in zip(s3_parts, local_parts):
        for x, y in zip(a, b):
            assert np.array_equal(np.asarray(x), np.asarray(y))
