"""The corpus BPE: trained on curated text only, reproducible, compresses, drives `token_ids`,
and `token_ids` survives SIGKILL mid-write."""

import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import lance
import pytest

from lance_assets import paths
from lance_assets.table import Table
from lance_assets.table.columns import fragments_missing
from lance_assets.table.producer import produce
from lance_assets.tokens import bpe, token_ids
from lance_assets.tokens.token_ids import TokenizerMismatchError
from lance_assets.tokens.tokenizers import load_tokenizer, table_tokenizer
from lance_assets_tests.helpers import quiet


def copy_root(src, tmp_path):
    dst = tmp_path / "data"
    shutil.copytree(src, dst)
    return dst


def test_bpe_compresses_3x_better_than_bytes_on_held_out_text(bpe_root):
    report = bpe.train_bpe(Table.of(bpe_root), log=quiet)  # the fixture's own training, reused
    assert report.nothing_to_do
    bpt = report.bytes_per_token
    assert bpt["byte"] == 1.0 and bpt["bpe"] >= 3 * bpt["byte"]
    assert bpt["cl100k_base"] > 3  # measured on the same held-out text
    assert report.heldout_docs > 0 and report.train_docs > 10 * report.heldout_docs
    # the synthetic corpus runs out of merges long before 8192 ids, and says so
    assert report.saturated and report.vocab_size < report.vocab_size_requested
    assert (report.eos_id, report.pad_id) == (report.vocab_size - 2, report.vocab_size - 1)


def test_trained_on_curated_non_held_out_text_only(bpe_root):
    report = bpe.train_bpe(Table.of(bpe_root), log=quiet)
    ds = lance.dataset(paths.table_uri(bpe_root))
    assert report.train_docs == ds.count_rows(filter="NOT is_dup AND id % 20 != 0")
    assert report.heldout_docs == ds.count_rows(filter="NOT is_dup AND id % 20 = 0")


def test_training_is_reproducible_named_by_sha256_and_a_rerun_is_a_no_op(bpe_root, tmp_path):
    first = bpe.train_bpe(Table.of(bpe_root), log=quiet)
    root = copy_root(bpe_root, tmp_path)
    shutil.rmtree(paths.tokenizers_dir(root))
    again = bpe.train_bpe(Table.of(root), compare_with=(), log=quiet)
    assert not again.nothing_to_do and again.sha256 == first.sha256
    path = paths.tokenizers_dir(root) / f"{again.sha256}.json"
    assert again.path == str(path) and bpe.latest_sha(root) == again.sha256
    assert bpe.train_bpe(Table.of(root), compare_with=(), log=quiet).nothing_to_do

    # a smaller vocabulary is another tokenizer, and becomes the latest
    small = bpe.train_bpe(Table.of(root), vocab_size=300, compare_with=(), log=quiet)
    assert small.vocab_size == 300 and small.merges == 42 and small.sha256 != first.sha256
    assert bpe.latest_sha(root) == small.sha256

    # the file is checked against its name
    data = json.loads(path.read_text())
    data["ranks"][300], data["ranks"][301] = data["ranks"][301], data["ranks"][300]
    path.write_text(json.dumps(data))
    with pytest.raises(ValueError, match="corrupt"):
        load_tokenizer(f"bpe:{first.sha256}", root)


def test_sample_is_bounded_and_spread_over_the_corpus(bpe_root, tmp_path):
    root = copy_root(bpe_root, tmp_path)
    report = bpe.train_bpe(Table.of(root), max_train_bytes=100_000, compare_with=(), log=quiet)
    assert 100_000 <= report.train_bytes < 100_000 + 10_000
    ds = lance.dataset(paths.table_uri(root))
    where = bpe.sample_filter(ds, "NOT is_dup", 100_000)
    assert "% 1000 <" in where
    ids = ds.to_table(columns=["id"], filter=where).column("id").to_pylist()
    assert max(ids) > 0.9 * ds.count_rows() and all(i % 20 for i in ids)


def test_bad_filter_and_missing_dedup_are_clear_errors(tmp_path):
    from lance_assets.ingest.raw_text import ingest

    root = tmp_path / "data"
    ingest(Table.of(root), "synthetic:100", log=quiet)
    with pytest.raises(ValueError, match="needs `dedup_flag` materialized first"):
        bpe.train_bpe(Table.of(root), log=quiet)
    with pytest.raises(FileNotFoundError, match="Materialize the `tokenizer` asset first"):
        load_tokenizer("bpe", root)


def test_token_ids_default_to_the_trained_bpe_and_sampler_can_decode(bpe_root, tmp_path):
    root = copy_root(bpe_root, tmp_path)
    report = produce(token_ids.PRODUCER, Table.of(root), log=quiet)  # tokenizer="auto"
    info = report.tokenizer
    tokens = report.tokens_written
    assert info.name == f"bpe:{bpe.latest_sha(root)}" and "trained BPE" in report.tokenizer_choice
    ds = lance.dataset(paths.table_uri(root))
    assert table_tokenizer(ds) == info
    rows = ds.to_table(columns=["text", "input_ids", "n_tokens", "n_bytes"]).to_pylist()
    assert sum(r["n_tokens"] for r in rows) == tokens
    assert sum(r["n_bytes"] for r in rows) == report.bytes_tokenized
    assert report.bytes_tokenized / tokens > 3
    tok = load_tokenizer(info.name, root)  # what the sampler does with the table's tokenizer
    for r in rows:
        assert r["n_bytes"] == len(r["text"].encode("utf-8"))
        assert tok.decode(r["input_ids"]) == r["text"]
        assert info.pad_id not in r["input_ids"] and info.eos_id not in r["input_ids"]

    # a retrained BPE does not silently change the column: auto keeps what input_ids hold ...
    bpe.train_bpe(Table.of(root), vocab_size=512, compare_with=(), log=quiet)
    report = produce(token_ids.PRODUCER, Table.of(root), log=quiet)
    again = report.tokenizer
    assert again == info and report.nothing_to_do
    # ... and asking for it explicitly is refused, with the way out
    with pytest.raises(TokenizerMismatchError, match="replace=True"):
        produce(token_ids.PRODUCER, Table.of(root), token_ids.TokenIdsSettings(tokenizer="bpe"), log=quiet)


def test_new_rows_do_not_mint_a_tokenizer_the_column_would_not_use(bpe_root, tmp_path):
    from lance_assets.curation import dedup_flag
    from lance_assets.ingest.raw_text import ingest

    root = copy_root(bpe_root, tmp_path)
    first = bpe.train_bpe(Table.of(root), compare_with=(), log=quiet)
    ingest(Table.of(root), "synthetic:2500", log=quiet)  # new rows before token_ids: train again
    produce(dedup_flag.PRODUCER, Table.of(root), log=quiet)
    second = bpe.train_bpe(Table.of(root), compare_with=(), log=quiet)
    assert not second.nothing_to_do and second.train_docs > first.train_docs
    report = produce(token_ids.PRODUCER, Table.of(root), log=quiet)
    info = report.tokenizer
    assert info.sha256 == second.sha256

    ingest(Table.of(root), "synthetic:2600", log=quiet)  # new rows after token_ids: input_ids use it
    produce(dedup_flag.PRODUCER, Table.of(root), log=quiet)
    assert bpe.train_bpe(Table.of(root), compare_with=(), log=quiet).nothing_to_do
    forced = bpe.train_bpe(Table.of(root), compare_with=(), retrain=True, log=quiet)
    assert not forced.nothing_to_do and forced.train_docs > second.train_docs
    report = produce(token_ids.PRODUCER, Table.of(root), log=quiet)  # the column keeps its tokenizer
    again = report.tokenizer
    assert again == info


def test_a_bpe_file_from_elsewhere_is_kept_next_to_the_table(bpe_root, tmp_path):
    src = Path(bpe.train_bpe(Table.of(bpe_root), log=quiet).path)
    outside = tmp_path / "my_tokenizer.json"
    shutil.copyfile(src, outside)
    root = copy_root(bpe_root, tmp_path)
    shutil.rmtree(paths.tokenizers_dir(root))
    report = produce(token_ids.PRODUCER, Table.of(root),
                     token_ids.TokenIdsSettings(tokenizer=str(outside)), log=quiet)
    info = report.tokenizer
    assert info.name == f"bpe:{src.stem}" and (paths.tokenizers_dir(root) / src.name).is_file()
    assert load_tokenizer(info.name, root).info == info


CHILD = textwrap.dedent("""
    import sys, time
    from lance_assets.table import Table
    from lance_assets.table.producer import produce
    from lance_assets.tokens import token_ids

    real_write, token_files = Table.write_fragments, []

    def write_then_hang(self, data, schema, **kw):
        new = real_write(self, data, schema, **kw)
        if "input_ids" in schema.names:
            token_files.append(new)
            if len(token_files) == 3:  # third fragment's file is on disk, not committed
                print("WROTE", flush=True)
                time.sleep(120)
        return new

    Table.write_fragments = write_then_hang
    produce(token_ids.PRODUCER, Table.of(sys.argv[1]), token_ids.TokenIdsSettings(tokenizer="bpe"),
            fragments_per_commit=1, log=lambda m: print(m, flush=True))
""")


def token_table(root):
    return lance.dataset(paths.table_uri(root)).to_table(
        columns=["id", "input_ids", "n_tokens", "n_bytes"]).sort_by("id")


def test_sigkill_mid_write_then_rerun_equals_an_uninterrupted_run(bpe_root, tmp_path):
    killed = copy_root(bpe_root, tmp_path / "killed")
    clean = copy_root(bpe_root, tmp_path / "clean")
    produce(token_ids.PRODUCER, Table.of(clean), token_ids.TokenIdsSettings(tokenizer="bpe"),
            fragments_per_commit=1, log=quiet)

    env = {**os.environ, "LANCE_LOG": "error"}
    child = subprocess.Popen([sys.executable, "-c", CHILD, str(killed)], stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True, env=env)
    try:
        for line in child.stdout:
            if line.startswith("WROTE"):
                break
        else:
            pytest.fail(f"child ended before the third write: {child.stderr.read()}")
        child.send_signal(signal.SIGKILL)
    finally:
        child.kill()
        child.wait(timeout=30)
    assert child.returncode == -signal.SIGKILL

    ds = lance.dataset(paths.table_uri(killed))
    missing = fragments_missing(ds, ["input_ids", "n_tokens"])
    assert len(missing) == 2 and len(ds.get_fragments()) == 4  # two commits survived
    referenced = {d.path for f in ds.get_fragments() for d in f.metadata.data_files()}
    on_disk = {p.name for p in (paths.db_dir(killed) / "corpus.lance" / "data").iterdir()}
    assert on_disk - referenced  # the killed write left an uncommitted file behind

    # auto: resumes with the column's tokenizer
    report = produce(token_ids.PRODUCER, Table.of(killed), log=quiet)
    info = report.tokenizer
    assert report.fragments_already_done == 2 and len(report.fragments_written) == 2
    assert info == table_tokenizer(lance.dataset(paths.table_uri(clean)))
    assert token_table(killed).equals(token_table(clean))

