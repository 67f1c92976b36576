"""One handle on the table, one version per step: column writers with cross-row state racing
an ingest (real processes, the writer stopped with SIGSTOP at a random point), an ingest whose
plan went stale behind a delete, compaction landing under back-to-back ingests, zero retention,
and no product code opening the dataset by path outside ``lance_assets/table``."""

from __future__ import annotations

import ast
import json
import os
import random
import signal
import subprocess
import sys
import time
from datetime import timedelta
from pathlib import Path

import lance
import numpy as np
import pyarrow as pa
import pytest

from lance_assets.ingest.raw_text import StalePlan, TableState, _append, ingest, normalise
from lance_assets.ingest.sources import SkipCounter
from lance_assets.table import RAW_SCHEMA, Table
from lance_assets.table.maintenance import maintain
from lance_assets.table.producer import produce
from lance_assets_tests.helpers import quiet, write_fineweb_parquet

PACKAGE = Path(__file__).resolve().parents[1] / "lance_assets"
ENV = {**os.environ, "PYTHONUNBUFFERED": "1", "LANCE_ASSETS_EXECUTOR": "local"}

RUN = ("from lance_assets.table import Table; from lance_assets.table.producer import produce; "
       "run = lambda m, s=None: produce(m.PRODUCER, Table.of(ROOT), s, fragments_per_commit=1, "
       "log=print); ")
WRITERS = {
    # writer: (call in a child process, the columns it writes)
    "dedup_flag": (RUN + "from lance_assets.curation import dedup_flag as m; run(m)",
                   ["text_hash", "is_dup"]),
    "near_dup": (RUN + "from lance_assets.curation import near_dup as m; run(m)",
                 ["near_dup", "near_dup_cluster", "minhash_bands"]),
    "paragraph_dups": (RUN + "from lance_assets.curation import paragraph_dups as m; run(m)",
                       ["dup_paragraph_frac", "paragraph_hashes"]),
    # EVAL: an evaluation set holding some of the base corpus's texts (written by the test)
    "contamination": (RUN + "from lance_assets.curation import contamination as m; "
                      "run(m, m.ContaminationSettings([m.EvalSetSpec('ev', EVAL, 'question')]))",
                      ["contaminated", "contaminated_with"]),
    # its input column first (a stand-in embedder), then the semantic duplicates, one cluster
    "semantic_dup": (RUN + "from lance_assets.embeddings import chunk_embeddings as c; "
                     "from lance_assets.testing.embedders import ClusteredEmbedder as E; "
                     "from lance_assets.curation import semantic_dup as m; "
                     "run(c, c.ChunkEmbeddingsSettings(chunk_tokens=32, overlap_tokens=8, "
                     "embedder=E())); run(m, m.SemanticDupSettings(languages=[]))",
                     ["semantic_cluster", "semantic_rep", "semantic_cos", "semantic_dup",
                      "semantic_vector"]),
}


def _texts(n: int, seed: int) -> list[str]:
    rng = random.Random(seed)
    words = [f"w{i}" for i in range(400)]
    return ["\n\n".join(" ".join(rng.choice(words) for _ in range(40)) for _ in range(3))
            for _ in range(n)]


def _sources(tmp_path: Path) -> tuple[Path, Path]:
    """A base corpus, and a second file of exact copies of a third of it (and new text)."""
    base = _texts(1200, 1)
    copies = base[::3] + _texts(200, 2)
    a, b = tmp_path / "src" / "a.parquet", tmp_path / "src2" / "b.parquet"
    a.parent.mkdir()
    b.parent.mkdir()
    write_fineweb_parquet(a, base)
    write_fineweb_parquet(b, copies, start_id=10_000)
    return a, b


def _ingest(root: Path, source: Path) -> None:
    ingest(Table.of(root), str(source), rows_per_fragment=100, rows_per_commit=400, log=quiet)


def _columns(root: Path, cols: list[str]) -> pa.Table:
    return lance.dataset(Table.of(root).uri).to_table(columns=["id", *cols]).sort_by("id")


def _run_here(call: str, root: Path) -> None:
    """A writer's call in this process (the runs that nothing interrupts)."""
    exec(compile(call.replace("ROOT", repr(str(root))), "<writer>", "exec"), {})


@pytest.mark.parametrize("writer", sorted(WRITERS))
def test_a_column_writer_racing_an_ingest_of_copies_ends_equal_to_a_clean_run(tmp_path, writer,
                                                                               monkeypatch):
    monkeypatch.setenv("LANCE_ASSETS_EXECUTOR", "local")
    call, cols = WRITERS[writer]
    a, b = _sources(tmp_path)
    evals = tmp_path / "eval.jsonl"
    evals.write_text("".join(json.dumps({"question": t}) + "\n" for t in _texts(1200, 1)[::50]))
    call = call.replace("EVAL", repr(str(evals)))
    clean = tmp_path / "clean"
    _ingest(clean, a)
    _ingest(clean, b)
    _run_here(call, clean)
    expected = _columns(clean, cols)

    raced = tmp_path / "raced"
    _ingest(raced, a)
    proc = subprocess.Popen([sys.executable, "-c", call.replace("ROOT", repr(str(raced)))],
                            env=ENV, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    time.sleep(random.Random(writer).uniform(1.0, 3.0))  # somewhere in pinning, state, writes
    stopped = proc.poll() is None
    if stopped:
        proc.send_signal(signal.SIGSTOP)  # a stall: GC, a frozen VM
    try:
        _ingest(raced, b)  # lands while the writer is stopped
    finally:
        if stopped:
            proc.send_signal(signal.SIGCONT)
    out, _ = proc.communicate(timeout=600)
    assert proc.returncode == 0, out
    # the run wrote its pinned version; the copies wait for the next run, which writes them
    _run_here(call, raced)
    got = _columns(raced, cols)
    assert got.num_rows == expected.num_rows == 1800
    assert got.equals(expected)
    if writer == "dedup_flag":  # every copy is flagged, under a true write marker
        flags = got.column("is_dup").to_pylist()
        assert sum(flags) >= 400 and all(v is not None for v in flags)
    if writer == "contamination":  # the copies of evaluation items are found too
        assert got.filter(pa.compute.field("id") >= 1200).column("contaminated").to_pylist().count(True) >= 8


def test_dedup_flag_with_an_ingest_landing_right_after_its_hashing(tmp_path, monkeypatch):
    """The issue's interleaving, made exact: `dedup_flag` hashes the table, an ingest of exact
    copies lands (another process), then `dedup_flag` writes. Its run writes the version it
    hashed; the copies stay pending (null markers, never `is_dup = false`); one more run flags
    them all, equal to a clean run."""
    from lance_assets.curation import dedup_flag as dedup

    a, b = _sources(tmp_path)
    clean = tmp_path / "clean"
    _ingest(clean, a)
    _ingest(clean, b)
    produce(dedup.PRODUCER, Table.of(clean), log=quiet)
    root = tmp_path / "raced"
    _ingest(root, a)
    hashed = dedup.duplicate_ids

    def hash_then_let_an_ingest_land(ds, log=print):
        out = hashed(ds, log)
        subprocess.run([sys.executable, "-c", "from lance_assets.ingest.raw_text import ingest; "
                        "from lance_assets.table import Table; "
                        f"ingest(Table.of({str(root)!r}), {str(b)!r}, rows_per_fragment=100, "
                        "rows_per_commit=400, log=lambda m: None)"], env=ENV, check=True)
        return out

    monkeypatch.setattr(dedup, "duplicate_ids", hash_then_let_an_ingest_land)
    report = produce(dedup.PRODUCER, Table.of(root), log=quiet)
    assert report.fragments_pending == 6 and report.pinned_rows_end == 1200
    ds = Table.of(root).newest()
    assert ds.count_rows(filter="_written_is_dup IS NULL") == 600  # pending, not false
    assert ds.count_rows(filter="id >= 1200 AND is_dup = false") == 0
    monkeypatch.setattr(dedup, "duplicate_ids", hashed)
    produce(dedup.PRODUCER, Table.of(root), log=quiet)
    assert _columns(root, ["is_dup"]).equals(_columns(clean, ["is_dup"]))


def test_quality_score_racing_an_ingest_trains_on_its_pinned_version_and_scores_every_row(tmp_path):
    """The model is trained on the labelled rows of the version `quality_score` pinned; rows
    ingested meanwhile (without embeddings yet) are pending, not a failure; after their
    embeddings and one more run, every row holds the stored model's score of its embedding."""
    from lance_assets.curation import quality_score as quality_model
    from lance_assets.embeddings import embeddings as embed
    from lance_assets.testing.embedders import FeatureEmbedder

    a, b = _sources(tmp_path)
    root = tmp_path / "raced"
    _ingest(root, a)
    produce(embed.PRODUCER, Table.of(root), embed.EmbeddingsSettings(embedder=FeatureEmbedder()),
            fragments_per_commit=4, log=quiet)
    table = Table.of(root)
    pinned_at = table.newest().version
    call = ("from lance_assets.curation import quality_score as m; "
            "from lance_assets.table import Table; from lance_assets.table.producer import produce; "
            f"produce(m.PRODUCER, Table.of({str(root)!r}), fragments_per_commit=1, log=print)")
    # the first run says when it has pinned its version (as it starts training), and is frozen
    # there while the ingest lands: however slow the machine, the ingest comes after the pin
    racing = ("import lance_assets.curation.quality_score as q; real = q.train_head\n"
              "def train_head(table, **kw):\n"
              "    print('pinned', kw['pinned'].version, flush=True)\n"
              "    return real(table, **kw)\n"
              "q.train_head = train_head\n" + call)
    proc = subprocess.Popen([sys.executable, "-c", racing], env=ENV, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    said = [proc.stdout.readline()]
    while said[-1] and not said[-1].startswith("pinned"):
        said.append(proc.stdout.readline())
    assert said[-1] == f"pinned {pinned_at}\n", "".join(said)
    proc.send_signal(signal.SIGSTOP)
    try:
        _ingest(root, b)
    finally:
        proc.send_signal(signal.SIGCONT)
    out, _ = proc.communicate(timeout=600)
    assert proc.returncode == 0, "".join(said) + out
    produce(embed.PRODUCER, Table.of(root), embed.EmbeddingsSettings(embedder=FeatureEmbedder()),
            fragments_per_commit=4, log=quiet)
    subprocess.run([sys.executable, "-c", call], env=ENV, check=True, capture_output=True)
    stored = table.get_config(quality_model.QUALITY_MODEL_KEY)
    # trained on exactly the labelled rows of the version it pinned (not the copies)
    again = quality_model.train_head(table, pinned=table.open(pinned_at))
    assert again.sha256 == stored["sha256"]
    head = quality_model.load_head(table, stored["sha256"])
    t = table.newest().to_table(columns=["id", "embedding", "quality_score"]).sort_by("id")
    x = t.column("embedding").combine_chunks().values.to_numpy().reshape(t.num_rows, -1)
    want = (x.astype(np.float64) @ head.weights + head.bias).astype(np.float32)
    assert t.num_rows == 1800 and t.column("quality_score").null_count == 0
    assert np.array_equal(t.column("quality_score").to_numpy(), want)


def test_an_ingest_planned_before_an_append_that_was_deleted_again_plans_anew(tmp_path):
    """Ingest A plans; ingest B lands and its rows are deleted again (the fragment set is back
    to what A read); A's commit must not take B's ids: the row-id counter moved."""
    root = tmp_path / "data"
    a, b = _sources(tmp_path)
    _ingest(root, a)
    table = Table.of(root)
    plan = TableState.of(table.newest())  # A's plan
    _ingest(root, b)  # B lands
    table.newest().delete("id >= 1200")  # and its rows go again (whole fragments)
    assert TableState.of(table.newest()).parts.get(f"file:{b}") is None
    batch = pa.RecordBatch.from_pydict({"text": ["A's row"] * 120})
    rows = normalise(batch, "file:/a-stale-plan", 0, plan.next_id, SkipCounter(), 10_000)
    before = set(os.listdir(Path(table.uri) / "data"))
    with pytest.raises(StalePlan):
        _append(table, pa.RecordBatchReader.from_batches(RAW_SCHEMA, [rows]), 100, quiet, plan,
                "file:/a-stale-plan")
    assert set(os.listdir(Path(table.uri) / "data")) == before  # its files removed again
    # the real ingest plans again: new ids above every id ever used, equal to Lance's row ids
    c = tmp_path / "src3" / "c.parquet"
    c.parent.mkdir()
    write_fineweb_parquet(c, _texts(120, 3), start_id=50_000)
    _ingest(root, c)
    t = lance.dataset(table.uri).to_table(columns=["id"], with_row_id=True)
    ids = t.column("id").to_numpy()
    assert len(np.unique(ids)) == len(ids)
    assert (ids == t.column("_rowid").to_numpy().astype(np.int64)).all()
    assert ids.max() == 1200 + 600 + 120 - 1  # B's 600 ids are never reused


def _ingest_loop_script(root: Path, folder: Path, seconds: float, stop: Path) -> str:
    """Ingests back to back for ``seconds``, or until the file ``stop`` exists (the test has
    seen what it waited for)."""
    return f"""
import os, time, random
from lance_assets.ingest.raw_text import ingest
from lance_assets.table import Table
from lance_assets_tests.helpers import write_fineweb_parquet
end, i = time.monotonic() + {seconds}, 0
while time.monotonic() < end and not os.path.exists({str(stop)!r}):
    rng = random.Random(i)
    texts = [' '.join(f'x{{rng.randrange(5000)}}' for _ in range(60)) for _ in range(300)]
    path = '{folder}/part-%05d.parquet' % i
    write_fineweb_parquet(path, texts, start_id=i * 1000)
    ingest(Table.of({str(root)!r}), '{folder}/*.parquet', rows_per_fragment=50, rows_per_commit=100,
           log=lambda m: None)
    i += 1
print('ingests', i)
"""


def _disk_bytes(uri: str) -> int:
    return sum(p.stat().st_size for p in Path(uri).rglob("*") if p.is_file())


def _live_bytes(ds: lance.LanceDataset) -> int:
    files = sum(f.file_size_bytes or 0 for frag in ds.get_fragments()
                for f in frag.metadata.data_files())
    return files + sum(p.stat().st_size for p in Path(ds.uri, "_versions").glob("*"))


def test_maintenance_lands_while_ingests_run_back_to_back_and_leaves_no_garbage(tmp_path):
    root, folder = tmp_path / "data", tmp_path / "parts"
    folder.mkdir()
    a, _ = _sources(tmp_path)
    _ingest(root, a)
    table = Table.of(root)
    stop = tmp_path / "stop"
    proc = subprocess.Popen([sys.executable, "-c", _ingest_loop_script(root, folder, 60, stop)],
                            env=ENV, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    reports = []
    try:
        time.sleep(3)
        # maintenance over and over while ingests land, until three ran and thirty ingests did
        while proc.poll() is None and (len(reports) < 3 or len(list(folder.glob("*"))) <= 30):
            reports.append(maintain(table, keep_versions_for=timedelta(0),
                                    target_rows_per_fragment=1000, log=quiet))
    finally:
        stop.touch()
        out, _ = proc.communicate(timeout=300)
    assert proc.returncode == 0, out
    assert int(out.split()[-1]) >= 30, out  # ingests landed back to back
    assert reports, "maintenance never ran while the ingests did"
    first = reports[0]
    assert first.fragments_removed > 0 and first.compaction_rounds <= 3, first
    final = maintain(table, keep_versions_for=timedelta(0), target_rows_per_fragment=1000,
                     log=quiet)
    ds = table.newest()
    assert final.versions_kept == 1
    assert _disk_bytes(ds.uri) <= 1.2 * _live_bytes(ds), (_disk_bytes(ds.uri), _live_bytes(ds))
    ids = ds.to_table(columns=["id"]).column("id").to_numpy()
    assert len(np.unique(ids)) == len(ids)


def test_zero_retention_next_to_ingests_and_column_writers_fails_no_run(tmp_path):
    root, folder = tmp_path / "data", tmp_path / "parts"
    folder.mkdir()
    a, _ = _sources(tmp_path)
    _ingest(root, a)
    stop = tmp_path / "stop"
    maintained = tmp_path / "maintained"
    maint = subprocess.Popen([sys.executable, "-c", f"""
import os, time
from datetime import timedelta
from pathlib import Path
from lance_assets.table import Table
from lance_assets.table.maintenance import maintain
end, i = time.monotonic() + 60, 0
while time.monotonic() < end and not os.path.exists({str(stop)!r}):
    maintain(Table.of({str(root)!r}), keep_versions_for=timedelta(0), target_rows_per_fragment=400,
             log=lambda m: None)
    i += 1
    Path({str(maintained)!r}).write_text(str(i))
"""], env=ENV, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    ingests = subprocess.Popen([sys.executable, "-c", _ingest_loop_script(root, folder, 60, stop)],
                               env=ENV, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        from lance_assets.curation import dedup_flag, near_dup

        # the writers go round until each of the three has done its share next to the others
        # (a count, not a time: a loaded machine gets the same races, a fast one stops sooner)
        rounds, end = 0, time.monotonic() + 60
        while time.monotonic() < end and maint.poll() is None and ingests.poll() is None and not (
                rounds >= 2 and len(list(folder.glob("*"))) >= 8
                and maintained.exists() and int(maintained.read_text() or 0) >= 3):
            produce(dedup_flag.PRODUCER, Table.of(root), log=quiet)
            produce(near_dup.PRODUCER, Table.of(root), log=quiet)
            rounds += 1
    finally:
        stop.touch()  # the writers are done: maintenance and ingests need not go on alone
        m_out, _ = maint.communicate(timeout=300)
        i_out, _ = ingests.communicate(timeout=300)
    assert ingests.returncode == 0, i_out
    assert maint.returncode == 0, m_out
    produce(dedup_flag.PRODUCER, Table.of(root), log=quiet)
    ds = Table.of(root).newest()
    assert ds.count_rows(filter="_written_is_dup IS NULL") == 0


PATH_OPENERS = {("lance", "dataset"), ("lance", "write_dataset"), ("lancedb", "connect"),
                ("LanceDataset", "commit"), ("paths", "table_uri"), ("paths", "db_dir")}


def test_no_product_code_outside_the_table_object_opens_the_dataset_by_path():
    offenders = []
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(PACKAGE.parent)
        if rel.parts[1] == "table" or rel.name == "paths.py":
            continue
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.Call):
                f = node.func
                name = None
                if isinstance(f, ast.Attribute):
                    base = f.value
                    owner = base.attr if isinstance(base, ast.Attribute) else getattr(base, "id", "")
                    name = (owner, f.attr)
                elif isinstance(f, ast.Name) and f.id == "write_fragments":
                    name = ("", "write_fragments")
                if name in PATH_OPENERS or (name and name[1] == "write_fragments"
                                            and name[0] in ("", "lance", "fragment")):
                    offenders.append(f"{rel}:{node.lineno} {'.'.join(name).strip('.')}")
            elif isinstance(node, ast.ImportFrom) and node.module in ("lance", "lance.fragment"):
                bad = [a.name for a in node.names if a.name in ("dataset", "write_dataset",
                                                                "write_fragments")]
                if bad:
                    offenders.append(f"{rel}:{node.lineno} from {node.module} import {bad}")
    assert not offenders, "open the table through lance_assets.table.Table:\n" + \
        "\n".join(offenders)


def _mixed_sources(tmp_path: Path) -> tuple[Path, Path]:
    texts = _texts(1000, 11)
    a, c = tmp_path / "srcA" / "a.parquet", tmp_path / "srcC" / "c.parquet"
    a.parent.mkdir()
    c.parent.mkdir()
    write_fineweb_parquet(a, texts + texts[:200])  # 200 exact copies inside the source
    write_fineweb_parquet(c, _texts(300, 12), start_id=20_000)
    return a, c


DELETED = [f"<urn:uuid:{20_000 + i:08d}>" for i in range(0, 300, 17)]
FORGOTTEN = [f"<urn:uuid:{20_000 + i:08d}>" for i in range(5, 300, 23)]


def _final_columns(root: Path) -> dict:
    t = lance.dataset(Table.of(root).uri).to_table(
        columns=["id", "source", "doc_id", "is_dup", "near_dup", "near_dup_cluster"])
    key = {i: (s.split("/")[-1], d) for i, s, d in zip(t.column("id").to_pylist(),
                                                        t.column("source").to_pylist(),
                                                        t.column("doc_id").to_pylist())}
    return {key[i]: (dup, near, key.get(cluster, cluster))
            for i, dup, near, cluster in zip(t.column("id").to_pylist(),
                                             t.column("is_dup").to_pylist(),
                                             t.column("near_dup").to_pylist(),
                                             t.column("near_dup_cluster").to_pylist())}


def _writers(root: Path) -> None:
    from lance_assets.curation import dedup_flag, near_dup

    produce(dedup_flag.PRODUCER, Table.of(root), log=quiet)
    produce(near_dup.PRODUCER, Table.of(root), log=quiet)


@pytest.mark.parametrize("seed", [0, 1])
def test_a_mixed_run_keeps_every_row_once_and_every_value_equal_to_a_clean_run(tmp_path, seed):
    """Two ingests of one source, a third source, column writers, maintenance with zero
    retention, a delete and a `forget`, all at once in separate processes (start times drawn
    from the seed): every expected row once, ids unique and equal to Lance's row ids (never
    reused), every marker true, every value equal to a clean sequential run's."""
    from lance_assets.table.forget import forget

    a, c = _mixed_sources(tmp_path)
    root = tmp_path / "mixed"
    rng = random.Random(seed)
    ing = ("import time; time.sleep({d}); from lance_assets.ingest.raw_text import ingest; "
           "from lance_assets.table import Table; ingest(Table.of({r!r}), {s!r}, "
           "rows_per_fragment=100, rows_per_commit=300, log=lambda m: None)")
    writers = ("import time; time.sleep({d}); from lance_assets.curation import dedup_flag, "
               "near_dup; from lance_assets.table import Table; "
               "from lance_assets.table.producer import produce\n"
               "for _ in range(3):\n    produce(dedup_flag.PRODUCER, Table.of({r!r}), "
               "log=lambda m: None); produce(near_dup.PRODUCER, Table.of({r!r}), log=lambda m: None)")
    maint = ("import time; time.sleep({d}); from datetime import timedelta; "
             "from lance_assets.table import Table; from lance_assets.table.maintenance import maintain\n"
             "for _ in range(4):\n    maintain(Table.of({r!r}), keep_versions_for=timedelta(0), "
             "target_rows_per_fragment=300, log=lambda m: None)")
    scripts = {"ingest A": ing.format(d=rng.uniform(0, 1), r=str(root), s=str(a)),
               "ingest A again": ing.format(d=rng.uniform(0, 3), r=str(root), s=str(a)),
               "ingest C": ing.format(d=rng.uniform(0, 2), r=str(root), s=str(c)),
               "writers": writers.format(d=rng.uniform(2, 5), r=str(root)),
               "maintenance": maint.format(d=rng.uniform(3, 6), r=str(root))}
    procs = {name: subprocess.Popen([sys.executable, "-c", code], env=ENV, text=True,
                                    stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
             for name, code in scripts.items()}
    outs = {"ingest C": procs["ingest C"].communicate(timeout=600)[0]}
    table = Table.of(root)
    listed = ",".join(f"'{d}'" for d in DELETED)
    table.commit("delete", lambda ds: ds.delete(f"doc_id IN ({listed})"))
    report = forget(table, "doc_id IN (" + ",".join(f"'{d}'" for d in FORGOTTEN) + ")", log=quiet)
    # the one deleted by hand first is found in the versions before that delete
    assert report.ids == len(set(FORGOTTEN)) and report.still_readable == 0
    for name, proc in procs.items():
        if name not in outs:
            outs[name] = proc.communicate(timeout=600)[0]
        assert proc.returncode == 0, f"{name} failed:\n{outs[name][-3000:]}"
    maintain(table, keep_versions_for=timedelta(0), target_rows_per_fragment=300, log=quiet)
    _writers(root)

    clean = tmp_path / "clean"  # the sources in the order the race committed them
    order = table.newest().to_table(columns=["id", "source"]).sort_by("id")
    first = order.column("source")[0].as_py()
    for source in ((c, a) if "srcC" in first else (a, c)):
        _ingest(clean, source)
    gone = ",".join(f"'{d}'" for d in DELETED + FORGOTTEN)
    lance.dataset(Table.of(clean).uri).delete(f"doc_id IN ({gone})")
    maintain(Table.of(clean), keep_versions_for=timedelta(0), target_rows_per_fragment=300, log=quiet)
    _writers(clean)

    ds = table.newest()
    t = ds.to_table(columns=["id", "source", "doc_id"], with_row_id=True)
    keys = list(zip(t.column("source").to_pylist(), t.column("doc_id").to_pylist()))
    assert len(keys) == len(set(keys)) == 1200 + 300 - len(set(DELETED + FORGOTTEN))
    ids = t.column("id").to_numpy()
    assert len(np.unique(ids)) == len(ids)
    assert (ids == t.column("_rowid").to_numpy().astype(np.int64)).all()
    for marker in ("_written_is_dup", "_written_near_dup_cluster"):
        assert ds.count_rows(filter=f"{marker} IS NULL OR NOT {marker}") == 0
    assert _final_columns(root) == _final_columns(clean)
