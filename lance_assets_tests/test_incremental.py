"""Incremental, exactly-once ingest: batches over time, kills at any moment, schedule and sensor."""

import json
import os
import signal
import subprocess
import sys
import textwrap
import time

import dagster as dg
import lance
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from lance_assets import paths
from lance_assets.curation import dedup_flag
from lance_assets.ingest.raw_text import ingest
from lance_assets.ingest.synthetic import SyntheticSpec, generate
from lance_assets.table import Table
from lance_assets.table.producer import produce
from lance_assets.tokens import token_ids
from lance_assets_tests.helpers import build_table, quiet

COLUMNS = ["id", "text", "source", "source_part", "is_dup", "input_ids", "n_tokens"]


def make_files(folder, n_files=4, rows=300, row_group=64):
    """FineWeb-shaped parquet files with duplicates inside and across files."""
    folder.mkdir(parents=True, exist_ok=True)
    texts = generate(SyntheticSpec(rows=n_files * rows, seed=7, dup_fraction=0.1)).column("text")
    for i in range(n_files):
        part = texts.slice(i * rows, rows)
        table = pa.table({"text": part, "id": [f"doc-{i}-{j}" for j in range(rows)],
                          "url": [f"https://x.example/{i}/{j}" for j in range(rows)],
                          "score": [3.0] * rows, "dump": ["CC-MAIN-2024-10"] * rows})
        pq.write_table(table, folder / f"{i:03d}.parquet", row_group_size=row_group)
    return sorted(folder.glob("*.parquet"))


def build(root, source, **kw):
    build_table(root, str(source), upto=["dedup_flag", "token_ids"], fragments_per_commit=1, **kw)


def content(root):
    rows = lance.dataset(paths.table_uri(root)).to_table(columns=COLUMNS).to_pylist()
    return sorted(rows, key=lambda r: r["id"])


def test_two_batches_equal_one(tmp_path):
    files = make_files(tmp_path / "all")
    landing = tmp_path / "landing"
    landing.mkdir()
    for f in files[:2]:
        (landing / f.name).write_bytes(f.read_bytes())
    build(tmp_path / "inc", landing, rows_per_commit=100, rows_per_fragment=128)
    for f in files[2:]:
        (landing / f.name).write_bytes(f.read_bytes())
    build(tmp_path / "inc", landing, rows_per_commit=100, rows_per_fragment=128)

    whole = tmp_path / "whole_copy"
    whole.mkdir()
    for f in files:
        (whole / f.name).write_bytes(f.read_bytes())
    build(tmp_path / "once", whole)

    inc, once = content(tmp_path / "inc"), content(tmp_path / "once")
    assert len(inc) == 1200 and sum(r["is_dup"] for r in inc) > 50
    strip = lambda rows: [{k: v for k, v in r.items() if k != "source"} for r in rows]  # noqa: E731
    assert strip(inc) == strip(once)  # same ids, texts, parts, flags and tokens
    # a document of batch 2 equal to one of batch 1 is flagged; batch 1 keeps its values
    batch2 = [r for r in inc if r["source"].rpartition("#")[0].endswith(("002.parquet", "003.parquet"))]
    assert any(r["is_dup"] for r in batch2)


def test_rerun_with_nothing_new_adds_nothing(tmp_path):
    src = tmp_path / "src"
    make_files(src, n_files=2, rows=100)
    first = ingest(Table.of(tmp_path / "d"), str(src), log=quiet)
    again = ingest(Table.of(tmp_path / "d"), str(src), log=quiet)
    assert again.nothing_new and again.commits == 0 and again.version == first.version
    assert again.units_already_present == first.units_ingested
    assert "0 rows" in again.markdown()


KILLER = textwrap.dedent("""
    import sys
    from lance_assets.ingest.raw_text import ingest
    from lance_assets.table import Table
    from lance_assets.table.producer import produce
    from lance_assets.tokens import token_ids
    root, src, what = sys.argv[1:4]
    if what == "ingest":
        ingest(Table.of(root), src, rows_per_commit=32, rows_per_fragment=64, log=lambda m: None)
    else:
        produce(token_ids.PRODUCER, Table.of(root), token_ids.TokenIdsSettings(tokenizer="byte"),
                fragments_per_commit=1, log=lambda m: None)
""")


def kill_when(script, root, src, what, ready):
    """Run the script and SIGKILL it as soon as ``ready(dataset)`` holds for the table."""
    proc = subprocess.Popen([sys.executable, str(script), str(root), str(src), what],
                            stderr=subprocess.PIPE)
    uri = paths.table_uri(root)
    deadline = time.time() + 120
    while time.time() < deadline and proc.poll() is None:
        try:
            if ready(lance.dataset(uri)):
                proc.send_signal(signal.SIGKILL)
                break
        except (OSError, ValueError):  # no table yet
            pass
        time.sleep(0.002)
    proc.wait(timeout=60)
    assert proc.returncode == -signal.SIGKILL, "finished before the kill: " + proc.stderr.read().decode()


def some_fragments_have(column):
    from lance_assets.table.columns import fragments_missing

    def ready(ds):
        if column not in ds.schema.names:
            return False
        missing = len(fragments_missing(ds, [column]))
        return 0 < missing < len(ds.get_fragments()) - 2
    return ready


def test_sigkill_during_ingest_and_token_ids_then_rerun_is_identical(tmp_path):
    src = tmp_path / "src"
    make_files(src, n_files=4, rows=300, row_group=32)
    script = tmp_path / "killer.py"
    script.write_text(KILLER)

    ref = tmp_path / "ref"
    build(ref, src, rows_per_commit=32, rows_per_fragment=64)

    root = tmp_path / "crash"
    kill_when(script, root, src, "ingest", lambda ds: ds.version >= 5)
    partial = lance.dataset(paths.table_uri(root)).count_rows()
    assert 0 < partial < 1200
    ingest(Table.of(root), str(src), rows_per_commit=32, rows_per_fragment=64, log=quiet)
    produce(dedup_flag.PRODUCER, Table.of(root), log=quiet, fragments_per_commit=1)
    kill_when(script, root, src, "token_ids", some_fragments_have("input_ids"))
    ds = lance.dataset(paths.table_uri(root))
    assert 0 < ds.count_rows(filter="input_ids IS NOT NULL") < ds.count_rows()
    produce(token_ids.PRODUCER, Table.of(root), token_ids.TokenIdsSettings(tokenizer="byte"), log=quiet,
            fragments_per_commit=1)
    assert content(root) == content(ref)


def test_hf_source_reads_through_datasets_offline(tmp_path, monkeypatch):
    """`hf:` goes through Hugging Face `datasets` streaming; here its local parquet builder."""
    pytest.importorskip("datasets")
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf_home"))
    files = make_files(tmp_path / "hf", n_files=2, rows=1500)
    data_files = [str(f) for f in files]
    report = ingest(Table.of(tmp_path / "d"), "hf:parquet", hf_data_files=data_files, log=quiet)
    assert report.rows_added == 3000 and len(report.units_ingested) == 1
    assert report.units_ingested[0].startswith("hf:parquet/train@local#")
    rows = content_raw(tmp_path / "d")
    assert [r["text"] for r in rows] == [t for f in files for t in pq.read_table(f)["text"].to_pylist()]
    assert [r["source_part"] for r in rows][::1024] == [0, 1, 2]
    again = ingest(Table.of(tmp_path / "d"), "hf:parquet", hf_data_files=data_files, log=quiet)
    assert again.rows_added == 0  # resumes after the last part: nothing left

    capped = tmp_path / "capped"
    first = ingest(Table.of(capped), "hf:parquet", hf_data_files=data_files, rows_per_commit=1000,
                   max_new_rows=1500, log=quiet)
    assert first.rows_added == 2048  # stops at the first commit boundary past 1,500
    rest = ingest(Table.of(capped), "hf:parquet", hf_data_files=data_files, rows_per_commit=1000, log=quiet)
    assert rest.rows_added == 952 and content_raw(capped) == rows


def test_hf_watermark_is_keyed_by_the_file_list(tmp_path, monkeypatch):
    """An `hf:` watermark is a row offset into one list of files. Another file list (a hub
    update, a new data file, a file rewritten) is another unit: its offset starts at 0 instead
    of skipping rows of files it never read."""
    pytest.importorskip("datasets")
    for var, value in {"HF_DATASETS_OFFLINE": "1", "HF_HUB_OFFLINE": "1",
                       "HF_HOME": str(tmp_path / "hf_home")}.items():
        monkeypatch.setenv(var, value)
    files = make_files(tmp_path / "hf", n_files=3, rows=600)
    root = tmp_path / "d"
    first = ingest(Table.of(root), "hf:parquet", hf_data_files=[str(files[0])], log=quiet)
    assert first.rows_added == 600
    # the list grows: a new unit, read from its start (the old offset of 600 would have
    # skipped the first 600 rows of the longer list, which are not the same rows)
    grown = ingest(Table.of(root), "hf:parquet", hf_data_files=[str(f) for f in files[:2]], log=quiet)
    assert grown.rows_added == 1200 and grown.units_ingested[0] != first.units_ingested[0]
    stored = lance.dataset(paths.table_uri(root)).to_table().to_pylist()
    from_second = [r["text"] for r in stored if r["source"] == grown.units_ingested[0]]
    assert from_second == [t for f in files[:2] for t in pq.read_table(f)["text"].to_pylist()]
    assert ingest(Table.of(root), "hf:parquet", hf_data_files=[str(f) for f in files[:2]],
                  log=quiet).rows_added == 0  # the same list again: nothing new
    # a file rewritten in place (new modification time) is another unit as well
    os.utime(files[0], (1_000_000_000, 1_000_000_000))
    again = ingest(Table.of(root), "hf:parquet", hf_data_files=[str(files[0])], log=quiet)
    assert again.rows_added == 600 and again.units_ingested[0] != first.units_ingested[0]


def content_raw(root):
    rows = lance.dataset(paths.table_uri(root)).to_table(columns=["id", "text", "source_part"]).to_pylist()
    return sorted(rows, key=lambda r: r["id"])


def test_schedule_and_sensor(tmp_path):
    from lance_assets.definitions import defs
    from lance_assets.defs.ingest.automation import landing_sensor
    from lance_assets.defs.resources import LanceStore

    schedule = defs.resolve_schedule_def("ingest_schedule")
    assert schedule.default_status == dg.DefaultScheduleStatus.STOPPED
    job = defs.resolve_job_def("ingest")
    selected = {k.to_user_string() for k in job.asset_layer.selected_asset_keys}
    assert selected == {"raw_text"}  # the columns follow by automation (test_automation.py)

    landing = tmp_path / "landing"
    landing.mkdir()
    store = LanceStore(data_dir=str(tmp_path / "data"), source=str(landing))
    with dg.instance_for_test() as instance:
        ctx = dg.build_schedule_context(instance=instance)
        runs = list(schedule.evaluate_tick(ctx).run_requests)
        assert len(runs) == 1 and schedule.job_name == "ingest"

        ctx = dg.build_sensor_context(instance=instance, resources={"lance_store": store})
        assert isinstance(landing_sensor(ctx), dg.SkipReason)
        make_files(landing, n_files=2, rows=10)
        ctx = dg.build_sensor_context(instance=instance, resources={"lance_store": store},
                                      cursor=ctx.cursor)
        request = landing_sensor(ctx)
        assert isinstance(request, dg.RunRequest)
        assert len(json.loads(ctx.cursor)) == 2
        again = dg.build_sensor_context(instance=instance, resources={"lance_store": store},
                                        cursor=ctx.cursor)
        assert isinstance(landing_sensor(again), dg.SkipReason)  # nothing new since
        make_files(landing / "more", n_files=1, rows=10)
        third = dg.build_sensor_context(instance=instance, resources={"lance_store": store},
                                        cursor=again.cursor)
        second_request = landing_sensor(third)
        assert isinstance(second_request, dg.RunRequest)
        assert second_request.run_key != request.run_key
