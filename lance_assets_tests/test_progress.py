"""Long work is never silent in the run's log: a line at least every ``LOG_EVERY_S`` seconds
(a heartbeat when nothing is counted), with rows done, the rate and the time left; the
embeddings, the column writer and the tokenizer count rows within a fragment; and
``scripts/log_gaps.py`` finds the longest silence of each step of a run."""

from __future__ import annotations

import importlib.util
import re
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest

from lance_assets import progress as progress_mod
from lance_assets.embeddings import chunk_embeddings as chunks
from lance_assets.embeddings import embeddings as embed
from lance_assets.ingest.raw_text import ingest
from lance_assets.progress import advance, phase, progress
from lance_assets.table import Table
from lance_assets.table.columns import write_columns
from lance_assets.table.producer import produce
from lance_assets.testing.embedders import ClusteredEmbedder
from lance_assets_tests.helpers import quiet

REPO = Path(__file__).resolve().parents[1]
LINE_RE = re.compile(r"(?P<done>[\d,]+)/(?P<total>[\d,]+) rows")


@pytest.fixture
def often(monkeypatch):
    """A line at least every 50 ms instead of every 20 s."""
    monkeypatch.setattr(progress_mod, "LOG_EVERY_S", 0.05)


class Lines(list):
    """A thread-safe log that keeps its lines (the heartbeat writes from its own thread)."""

    def __init__(self):
        super().__init__()
        self._lock = threading.Lock()

    def __call__(self, line: str) -> None:
        with self._lock:
            self.append(line)


def test_a_block_with_no_update_logs_a_heartbeat_and_stops_when_it_ends(often):
    lines = Lines()
    with progress(10, "slow stage", "fragment", lines):
        time.sleep(0.4)
    beats = [line for line in lines if line.startswith("slow stage: 0/10 fragments")]
    assert len(beats) >= 3, lines  # about one every 50 ms while nothing was counted
    after = len(lines)
    time.sleep(0.2)
    assert len(lines) == after  # the heartbeat ended with the block
    assert not [t for t in threading.enumerate() if t.name.startswith("progress:")]


def test_the_heartbeat_stops_when_the_block_raises(often):
    lines = Lines()
    with pytest.raises(RuntimeError), progress(None, "failing", "row", lines):
        time.sleep(0.12)
        raise RuntimeError("boom")
    after = len(lines)
    time.sleep(0.15)
    assert after >= 1 and len(lines) == after


def test_a_line_says_rows_done_the_rate_and_the_time_left(monkeypatch):
    clock = [100.0]
    monkeypatch.setattr(progress_mod, "_clock", lambda: clock[0])
    monkeypatch.setattr(progress_mod, "LOG_EVERY_S", 0)  # no heartbeat thread: a fixed clock
    lines = []
    with progress(4, "token_ids", "fragment", lines.append, rows_total=4000) as bar:
        clock[0] += 10
        bar.update(0, rows=500)  # rows within the first fragment
        bar.update(1, rows=500)
    assert lines[-1] == "token_ids: 1/4 fragments (25%), 1,000/4,000 rows, 100.0 rows/s, " \
                        "~30 s left, 10.0 s"
    lines.clear()
    with progress(1000, "embedding, fragment 3", "row", lines.append) as bar:
        clock[0] += 4
        bar.update(200)
    assert lines[-1] == "embedding, fragment 3: 200/1,000 rows (20%), 50.0 rows/s, ~16 s left, 4.0 s"


def test_a_phase_says_when_it_starts_that_it_is_still_running_and_how_long_it_took(often):
    lines = Lines()
    with phase("building the index", lines) as bar:
        time.sleep(0.12)
        bar.note("k-means")
        time.sleep(0.12)
    assert lines[0] == "building the index..."
    assert re.fullmatch(r"building the index: still running, [\d.]+ s", lines[1]), lines
    assert any(re.fullmatch(r"building the index: still running, k-means, [\d.]+ s", line)
               for line in lines), lines
    assert re.fullmatch(r"building the index: done in 0\.\d s", lines[-1]), lines


def test_an_outer_heartbeat_stays_quiet_while_a_nested_block_logs(often):
    lines = Lines()
    with progress(1, "outer", "fragment", lines):
        with progress(100, "inner", "row", lines) as inner:
            for _ in range(12):
                time.sleep(0.03)
                inner.update(1)
    assert any(line.startswith("inner: ") for line in lines)
    assert not any(line.startswith("outer: ") for line in lines), lines


def test_advance_counts_rows_on_the_innermost_block(often):
    lines = Lines()
    with progress(None, "outer", "fragment", lines) as outer:
        with progress(100, "inner", "row", lines) as inner:
            advance(30)
        advance(5)
    assert inner.n == 30 and outer.rows == 5
    advance(7)  # no block open: nothing to count, no error


class SlowEmbedder(ClusteredEmbedder):
    """The stand-in model, 20 ms a batch of 8, telling how far it is as the real one does."""

    batch_size = 8
    reports_batches = True

    def __init__(self):
        super().__init__()
        self.batches = []

    def encode(self, texts, done=None):
        out = []
        for i in range(0, len(texts), self.batch_size):
            time.sleep(0.02)
            batch = texts[i:i + self.batch_size]
            self.batches.append(len(batch))
            out.append(super().encode(batch))
            if done is not None:
                done(i + len(batch))
        return np.concatenate(out)


def test_the_real_model_tells_how_far_it_is_batch_by_batch():
    class Inner:  # where the ONNX session would be
        def encode(self, texts, batch_size):
            return np.ones((len(texts), embed.DIM), np.float32)

    model = object.__new__(embed.Embedder)
    model.backend, model.batch_size, model.model = "onnx-int8", 3, Inner()
    told = []
    out = model.encode([f"text {i}" for i in range(8)], done=told.append)
    assert out.shape == (8, embed.DIM) and told == [3, 6, 8]
    assert model.encode(["one"]).shape == (1, embed.DIM)  # no done: one call, as before


def rows_logged(lines, prefix: str) -> list[int]:
    return [int(m["done"].replace(",", "")) for line in lines if line.startswith(prefix)
            for m in [LINE_RE.search(line)] if m]


@pytest.mark.parametrize("column", ["embedding", "chunk_embeddings"])
def test_embeddings_log_rows_within_one_fragment_batch_by_batch(tmp_path, often, column):
    ingest(Table.of(tmp_path), "synthetic:120", rows_per_fragment=1000, log=quiet)  # one fragment
    lines, model = Lines(), SlowEmbedder()
    if column == "embedding":  # one range of the whole fragment: no count at a range's end
        produce(embed.PRODUCER, Table.of(tmp_path),
                embed.EmbeddingsSettings(embedder=model, range_seconds=1e6), log=lines)
    else:
        produce(chunks.PRODUCER, Table.of(tmp_path),
                chunks.ChunkEmbeddingsSettings(embedder=model, range_seconds=1e6), log=lines)
    prefix = f"{column}, fragment 0:"
    done = rows_logged(lines, prefix)
    assert any(0 < n < 64 for n in done), lines  # inside the first range (64 rows)
    assert done == sorted(done)
    assert all("/120 rows" in line for line in lines if line.startswith(prefix))
    assert any("rows/s" in line and "left" in line for line in lines if line.startswith(prefix))
    assert max(model.batches) <= SlowEmbedder.batch_size  # the model was fed batch by batch


def test_the_column_writer_counts_rows_as_a_fragment_yields_them(tmp_path, often):
    ingest(Table.of(tmp_path), "synthetic:200", rows_per_fragment=1000, log=quiet)
    field = pa.field("slow_len", pa.int32())

    def slow(frag):
        for batch in frag.to_batches(columns=["text"], batch_size=20):
            time.sleep(0.03)
            yield pa.RecordBatch.from_arrays(
                [pc.utf8_length(batch.column(0)).cast(pa.int32())], names=[field.name])

    lines = Lines()
    report = write_columns(Table.of(tmp_path), [field], slow, log=lines)
    assert report.rows_written == 200
    within = [line for line in lines if line.startswith("slow_len: 0/1 fragments")]
    counts = [int(m.group(1).replace(",", "")) for line in within
              for m in [re.search(r"([\d,]+)/200 rows", line)] if m]
    assert any(0 < n < 200 for n in counts), lines  # rows counted before the fragment ended
    assert any("rows/s" in line and "left" in line for line in within)


def test_training_the_tokenizer_logs_the_texts_read(tmp_path, often, monkeypatch):
    from lance_assets.tokens import bpe

    ingest(Table.of(tmp_path), "synthetic:300", rows_per_fragment=1000, log=quiet)
    real = bpe._texts

    def slow_texts(*args):
        for text in real(*args):
            time.sleep(0.002)
            yield text

    monkeypatch.setattr(bpe, "_texts", slow_texts)
    lines = Lines()
    bpe.train_bpe(Table.of(tmp_path), vocab_size=300, filter="id >= 0", compare_with=(), log=lines)
    reading = [line for line in lines if line.startswith("tokenizer: training the BPE: ")]
    assert any("texts/s" in line and "reading texts" in line for line in reading), lines


# ---- scripts/log_gaps.py

def load_log_gaps():
    spec = importlib.util.spec_from_file_location("log_gaps", REPO / "scripts" / "log_gaps.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module


RUN = "0a1b2c3d-0000-4000-8000-00000000beef"


def printed(at: str, *parts: str) -> str:
    """One line as ``dagster asset materialize`` prints it."""
    return f"2026-12-04 {at} +0000 - dagster - INFO - __ASSET_JOB - {RUN} - " + " - ".join(parts)


PRINTED = "\n".join([
    printed("10:00:00", "4242", "RUN_START", "Started execution of run"),
    printed("10:00:01", "4243", "raw_text", "STEP_START", 'Started execution of step "raw_text".'),
    printed("10:00:05", "raw_text", "raw_text: 1/1 source units (100%), 2,000 rows, 4.0 s"),
    printed("10:00:06", "4243", "raw_text", "STEP_SUCCESS", "Finished execution"),
    "a line printed by a subprocess, not Dagster's",
    printed("10:00:07", "4244", "embeddings", "STEP_START", "Started execution"),
    printed("10:00:08", "embeddings", "embedding 2000 rows - in 1 fragment"),
    printed("10:01:20", "embeddings", "embedding, fragment 0: 2,000/2,000 rows"),
    printed("10:01:21", "4244", "embeddings", "STEP_SUCCESS", "Finished execution"),
    printed("10:03:00", "4242", "ENGINE_EVENT", "Multiprocess executor: parent process exiting"),
]) + "\n"


def test_log_gaps_finds_the_longest_silence_of_each_step(tmp_path, capsys):
    log_gaps = load_log_gaps()
    steps = {s.step: s for s in log_gaps.gaps(log_gaps.parse_console(PRINTED.splitlines()))}
    assert set(steps) == {"raw_text", "embeddings"}  # run-level events belong to no stage
    assert steps["raw_text"].gap_s == 4 and steps["raw_text"].lines == 3
    assert steps["embeddings"].gap_s == 72
    assert steps["embeddings"].after == "embedding 2000 rows - in 1 fragment"
    log = tmp_path / "demo.log"
    log.write_text(PRINTED)
    assert log_gaps.main([str(log)]) == 1
    out = capsys.readouterr().out
    assert "embeddings (72 s)" in out and "raw_text (" not in out
    assert log_gaps.main([str(log), "--max-gap", "80"]) == 0
    empty = tmp_path / "empty.log"
    empty.write_text("nothing here\n")
    assert log_gaps.main([str(empty)]) == 2
