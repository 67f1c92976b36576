"""Column backfills as Ray tasks (``executor="ray"``) on a local 2-CPU Ray shared by the module:
the same values as the local executor for every column writer, a failed task that leaves the
other fragments committed, and a driver killed mid-backfill that resumes to the same table.
"""

import os
import shutil
import signal
import subprocess
import sys
from dataclasses import dataclass

import lance
import pytest

from lance_assets import paths
from lance_assets.curation import dedup_flag, near_dup, quality_signals
from lance_assets.curation import near_dup as nd
from lance_assets.curation.quality_signals import FIELDS as SIGNAL_FIELDS
from lance_assets.curation.quality_signals import fragment_signals
from lance_assets.embeddings import chunk_embeddings, embeddings
from lance_assets.ingest.raw_text import ingest
from lance_assets.table import Table, columns, executor
from lance_assets.table.producer import produce
from lance_assets.testing.embedders import ClusteredEmbedder
from lance_assets.tokens import token_ids
from lance_assets.tokens.bpe import train_bpe
from lance_assets.tokens.tokenizers import BPE_PREFIX, table_tokenizer
from lance_assets_tests.helpers import quiet

ray = pytest.importorskip("ray")

# the worker's one Ray cluster (conftest.ray_cluster), shared with the other Ray modules
pytestmark = pytest.mark.xdist_group("ray")

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FRAGMENTS = 6


@pytest.fixture(scope="module")
def raw(tmp_path_factory):
    """A raw table of 6 fragments (with exact and near duplicates) to copy and backfill."""
    root = tmp_path_factory.mktemp("ray") / "raw"
    ingest(Table.of(root), "synthetic:600", rows_per_fragment=100, log=quiet)
    assert len(lance.dataset(paths.table_uri(root)).get_fragments()) == FRAGMENTS
    return root


def copy(raw, tmp_path, name):
    shutil.copytree(raw, tmp_path / name)
    return tmp_path / name


def content(root):
    return lance.dataset(paths.table_uri(root)).to_table().sort_by("id").to_pylist()


def backfill_all(root, where, tokenizer):
    produce(dedup_flag.PRODUCER, Table.of(root), fragments_per_commit=2, executor=where, log=quiet)
    produce(quality_signals.PRODUCER, Table.of(root), fragments_per_commit=2, executor=where, log=quiet)
    produce(near_dup.PRODUCER, Table.of(root), fragments_per_commit=2, executor=where, log=quiet)
    produce(token_ids.PRODUCER, Table.of(root), token_ids.TokenIdsSettings(tokenizer=tokenizer),
            fragments_per_commit=2, executor=where, log=quiet)
    produce(embeddings.PRODUCER, Table.of(root), embeddings.EmbeddingsSettings(embedder=ClusteredEmbedder()),
            executor=where, log=quiet)
    produce(chunk_embeddings.PRODUCER, Table.of(root),
            chunk_embeddings.ChunkEmbeddingsSettings(embedder=ClusteredEmbedder()), executor=where, log=quiet)


def trained_bpe(raw, tmp_path) -> tuple[str, object]:
    """A small BPE trained on the corpus (name, folder): Ray workers load it by name from the
    data root, as the driver does."""
    root = copy(raw, tmp_path, "bpe")
    produce(dedup_flag.PRODUCER, Table.of(root), log=quiet)
    report = train_bpe(Table.of(root), vocab_size=512, compare_with=(), log=quiet)
    return BPE_PREFIX + report.sha256, paths.tokenizers_dir(root)


@dataclass(frozen=True)
class FailOn:
    """A compute that raises on one fragment, in whichever process runs it."""

    fragment_id: int
    inner: object

    def __call__(self, frag):
        if frag.fragment_id == self.fragment_id:
            raise ValueError(f"injected failure on fragment {frag.fragment_id} (pid {os.getpid()})")
        return self.inner(frag)


def test_every_column_writer_on_ray_equals_the_local_one(ray_cluster, raw, tmp_path,
                                                         monkeypatch):
    local, on_ray = copy(raw, tmp_path, "local"), copy(raw, tmp_path, "ray")
    bpe, tokenizers = trained_bpe(raw, tmp_path)
    for root in (local, on_ray):
        shutil.copytree(tokenizers, paths.tokenizers_dir(root))
    backfill_all(local, "local", bpe)

    fanned_out = []
    real_map = executor.ray_map

    def counting_map(fn, shared, keys, **kw):
        keys = list(keys)
        fanned_out.append((fn.__name__, len(keys)))
        return real_map(fn, shared, keys, **kw)

    monkeypatch.setattr(executor, "ray_map", counting_map)
    steps = []
    real_call = executor.Tasks.__call__

    def counting_call(self, fn, *args, **kw):
        if self.ray:
            steps.append(fn.__name__)
        return real_call(self, fn, *args, **kw)

    monkeypatch.setattr(executor.Tasks, "__call__", counting_call)
    backfill_all(on_ray, "ray", bpe)
    # text_hash, is_dup, quality, near_dup, n_bytes, token_ids, embeddings, chunk_embeddings:
    # all eight column groups were written by Ray tasks, every fragment each
    assert [n for _, n in fanned_out] == [FRAGMENTS] * 8
    # and near_dup's keys, candidates, confirmation and components were Ray tasks too
    assert steps.count("new_keys") == FRAGMENTS
    assert {"partition_pairs", "confirm_group", "first_round", "tally"} <= set(steps)

    got, want = content(on_ray), content(local)
    assert len(got) == 600 and got == want
    assert sum(r["is_dup"] for r in got) > 0 and sum(r["near_dup"] for r in got) > 0
    assert table_tokenizer(lance.dataset(paths.table_uri(on_ray))).name == bpe


def test_a_failed_task_leaves_the_other_fragments_committed_and_the_rerun_redoes_it(
        ray_cluster, raw, tmp_path):
    root = copy(raw, tmp_path, "fail")
    uri = paths.table_uri(root)
    with pytest.raises(columns.FragmentsFailedError, match=r"fragment 3: ValueError: injected"):
        columns.write_columns(Table.of(root), SIGNAL_FIELDS, FailOn(3, fragment_signals),
                              fragments_per_commit=1, executor="ray", log=quiet)
    ds = lance.dataset(uri)
    missing = [f.fragment_id for f in columns.fragments_missing(ds, ["word_count"])]
    assert missing == [3]  # every other fragment was committed
    report = columns.write_columns(Table.of(root), SIGNAL_FIELDS, fragment_signals, executor="ray",
                                   log=quiet)
    assert report.fragments_written == [3] and report.fragments_already_done == FRAGMENTS - 1

    reference = copy(raw, tmp_path, "reference")
    produce(quality_signals.PRODUCER, Table.of(reference), executor="local", log=quiet)
    assert content(root) == content(reference)


def test_near_dup_on_ray_stops_at_a_failed_fragment_and_the_rerun_finishes_the_rest(
        ray_cluster, raw, tmp_path, monkeypatch):
    """Clusters link a fragment to those before it: after a failed write, the fragments before
    it are committed and none after it, and the rerun writes what a clean run writes."""
    root = copy(raw, tmp_path, "near-dup-fail")
    uri = paths.table_uri(root)
    real = nd.clusters
    monkeypatch.setattr(nd, "clusters", lambda *a, **k: FailOnInOrder(2, real(*a, **k)))
    with pytest.raises(columns.FragmentsFailedError, match="fragment 2: ValueError"):
        produce(near_dup.PRODUCER, Table.of(root), fragments_per_commit=1, executor="ray", log=quiet)
    ds = lance.dataset(uri)
    assert [f.fragment_id for f in columns.fragments_missing(ds, ["near_dup"])] == [2, 3, 4, 5]
    monkeypatch.setattr(nd, "clusters", real)
    report = produce(near_dup.PRODUCER, Table.of(root), executor="ray", log=quiet)
    assert report.fragments_written == [2, 3, 4, 5]

    reference = copy(raw, tmp_path, "near-dup-reference")
    produce(near_dup.PRODUCER, Table.of(reference), executor="local", log=quiet)
    assert content(root) == content(reference)


@dataclass(frozen=True)
class FailOnInOrder(FailOn):
    in_order = True


def test_the_failure_ran_in_a_ray_worker_not_in_the_driver(ray_cluster, raw, tmp_path):
    root = copy(raw, tmp_path, "pid")
    with pytest.raises(columns.FragmentsFailedError) as failed:
        columns.write_columns(Table.of(root), SIGNAL_FIELDS, FailOn(0, fragment_signals),
                        executor="ray", log=quiet)
    assert f"(pid {os.getpid()})" not in str(failed.value)
    assert "(pid " in str(failed.value)


def test_a_killed_driver_resumes_and_ends_equal_to_an_uninterrupted_run(ray_cluster, raw,
                                                                          tmp_path):
    root = copy(raw, tmp_path, "killed")
    env = {**os.environ, "PYTHONPATH": REPO, "LANCE_ASSETS_EXECUTOR": "ray",
           "RAY_ADDRESS": ray_cluster, "LANCE_LOG": "error"}
    # token_ids commits: tokenizer config, add n_bytes, 6 n_bytes fragments, add input_ids,
    # then 6 token fragments: the 11th is the second token fragment
    proc = subprocess.run(
        [sys.executable, "-m", "lance_assets_tests.fault_driver", "token_ids", str(root),
         "after-commit", "11"], env=env, cwd=REPO, capture_output=True, text=True, timeout=120)
    assert proc.returncode == -signal.SIGKILL, proc.stderr[-2000:]
    ds = lance.dataset(paths.table_uri(root))
    left = {f.fragment_id for f in columns.fragments_missing(ds, ["input_ids", "n_tokens"])}
    assert 0 < len(left) < FRAGMENTS  # killed mid-backfill: some fragments done, some not

    report = produce(token_ids.PRODUCER, Table.of(root), token_ids.TokenIdsSettings(tokenizer="byte"),
                     executor="ray", log=quiet)
    assert set(report.fragments_written) == left

    reference = copy(raw, tmp_path, "uninterrupted")
    produce(token_ids.PRODUCER, Table.of(reference), token_ids.TokenIdsSettings(tokenizer="byte"),
            executor="local", log=quiet)
    assert content(root) == content(reference)


def test_an_unknown_executor_is_refused_with_the_fix(raw, tmp_path, monkeypatch):
    monkeypatch.setenv(executor.EXECUTOR_ENV, "spark")
    with pytest.raises(ValueError, match=r"LANCE_ASSETS_EXECUTOR.*local, ray"):
        produce(quality_signals.PRODUCER, Table.of(copy(raw, tmp_path, "bad")), log=quiet)


DAGSTER_RUN = """
import sys
import dagster as dg
import lance
import ray
from lance_assets import paths
from lance_assets.definitions import defs
from lance_assets.defs.resources import LanceStore

store = LanceStore(data_dir=sys.argv[1])
local = dg.materialize([defs.get_assets_def("quality_signals")], resources={"lance_store": store},
                       run_config={"ops": {"quality_signals": {"config": {"executor": "local"}}}})
assert local.success
print("after local: ray initialized =", ray.is_initialized())
on_ray = dg.materialize([defs.get_assets_def("dedup_flag")], resources={"lance_store": store},
                        run_config={"ops": {"dedup_flag": {"config": {"executor": "ray"}}}})
assert on_ray.success
print("after ray: ray initialized =", ray.is_initialized())
"""


def test_dagster_assets_start_ray_only_for_executor_ray(ray_cluster, raw, tmp_path):
    root = copy(raw, tmp_path, "dagster")
    env = {**os.environ, "PYTHONPATH": REPO, "RAY_ADDRESS": ray_cluster, "LANCE_LOG": "error",
           "DAGSTER_HOME": str(tmp_path)}
    env.pop(executor.EXECUTOR_ENV, None)
    proc = subprocess.run([sys.executable, "-c", DAGSTER_RUN, str(root)], env=env, cwd=REPO,
                          capture_output=True, text=True, timeout=180, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "after local: ray initialized = False" in proc.stdout
    assert "executor: local" in proc.stderr
    assert "executor: ray (2 CPUs" in proc.stderr  # connected through the dagster-ray resource
    assert "after ray: ray initialized = False" in proc.stdout  # and disconnected after the step
    reference = copy(raw, tmp_path, "dagster-reference")
    produce(quality_signals.PRODUCER, Table.of(reference), executor="local", log=quiet)
    produce(dedup_flag.PRODUCER, Table.of(reference), executor="local", log=quiet)
    assert content(root) == content(reference)


def test_the_curation_taggers_on_ray_equal_the_local_ones(ray_cluster, raw, tmp_path):
    """Language, personal data, paragraph duplicates (a Staged compute), contamination (per-set
    columns, then the union) and the quality score, as Ray tasks: the same table as locally."""
    import json

    from lance_assets.curation import contamination
    from lance_assets.curation import detected_language as language
    from lance_assets.curation import paragraph_dups as para_dup
    from lance_assets.curation import personal_data as pii
    from lance_assets.curation import quality_score as quality_model

    texts = lance.dataset(paths.table_uri(raw)).to_table(columns=["text"]).column(0).to_pylist()
    evals = tmp_path / "evals.jsonl"
    evals.write_text("".join(json.dumps({"text": t}) + "\n" for t in texts[5:600:150]))
    spec = contamination.EvalSetSpec("planted", str(evals))
    local, on_ray = copy(raw, tmp_path, "tag-local"), copy(raw, tmp_path, "tag-ray")
    for root, where in ((local, "local"), (on_ray, "ray")):
        produce(language.PRODUCER, Table.of(root), fragments_per_commit=2, executor=where, log=quiet)
        produce(pii.PRODUCER, Table.of(root), fragments_per_commit=2, executor=where, log=quiet)
        produce(para_dup.PRODUCER, Table.of(root), fragments_per_commit=2, executor=where, log=quiet)
        produce(contamination.PRODUCER, Table.of(root), contamination.ContaminationSettings(eval_sets=[spec]),
                fragments_per_commit=2, executor=where, log=quiet)
        produce(embeddings.PRODUCER, Table.of(root),
                embeddings.EmbeddingsSettings(embedder=ClusteredEmbedder()), log=quiet)
        produce(quality_model.PRODUCER, Table.of(root), executor=where, log=quiet)
    got, want = content(on_ray), content(local)
    assert len(got) == 600 and got == want
    assert sum(r["contaminated"] for r in got) >= 4 and any(r["dup_paragraph_frac"] for r in got)
