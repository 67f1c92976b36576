"""Quality signals: the vectorised batch computation against a plain per-document reference,
and the per-fragment column write (incremental, text files untouched)."""

import lance
import numpy as np
import pyarrow as pa
import pytest

from lance_assets import paths
from lance_assets.curation import quality_signals as quality
from lance_assets.ingest.raw_text import ingest
from lance_assets.ingest.synthetic import SyntheticSpec, generate
from lance_assets.table import Table, data_files_by_field
from lance_assets.table.producer import produce
from lance_assets.testing.curation_reference import reference_signals as reference
from lance_assets_tests.helpers import quiet

DOCS = [
    "The cat sat on the mat. It was happy!\nThe end.",
    "",
    "   \n\n  ",
    "Buy now!!!\nBuy now!!!\nBuy now!!!\nClick here...\n• one\n• two",
    "lorem Ipsum dolor {sit} amet #a #b #c ... …",
    "a b c d e a b c d e a b c d e a b c d e f g h i j k l a b c d e f g h i j k l",
    "Paragraph one is here.\n\nParagraph one is here.\n\nAnd a third, different one.",
    "Ünïcödé wörds — with “quotes” and 123 numbers, 4.5 and 7 % too?",
    "x" * 40 + "\n" + "short\n" * 5,
]


def test_signals_match_the_reference_per_document():
    texts = DOCS + generate(SyntheticSpec(rows=120, seed=3)).column("text").to_pylist()
    batch = quality.compute_signals(pa.array(texts))
    assert batch.schema == quality.SCHEMA
    for i, text in enumerate(texts):
        ref = reference(text)
        got = {name: batch.column(name)[i].as_py() for name in quality.COLUMNS}
        for name in quality.COLUMNS:
            assert got[name] == pytest.approx(ref[name], rel=1e-5, abs=1e-6), (name, text[:60])


def test_signals_separate_boilerplate_and_salad_from_prose():
    prose = ("The star and the planet orbit with the moon. " * 3 + "\n\n") * 2 + "Different ending."
    salad = "star planet orbit comet nebula moon asteroid galaxy " * 10
    boiler = "\n".join(["Click here to subscribe to our newsletter!", "All rights reserved."] * 4)
    b = quality.compute_signals(pa.array([prose, salad, boiler])).to_pydict()
    assert b["stop_word_count"][0] >= 2 and b["stop_word_count"][1] == 0
    assert b["terminal_punct_line_share"][1] == 0  # one line, no full stop
    assert b["dup_line_share"][2] == pytest.approx(0.75)
    assert b["dup_10gram_char_share"][1] > 0.8  # the same 8 words over and over


def test_quality_signals_column_write_is_incremental(tmp_path):
    root = tmp_path / "data"
    ingest(Table.of(root), "synthetic:300", rows_per_fragment=100, log=quiet)
    uri = paths.table_uri(root)
    text_files = data_files_by_field(lance.dataset(uri), "text")
    report = produce(quality.PRODUCER, Table.of(root), fragments_per_commit=2, log=quiet)
    assert report.rows_written == 300 and report.commits == 2
    ds = lance.dataset(uri)
    assert set(quality.COLUMNS) <= set(ds.schema.names)
    assert data_files_by_field(ds, "text") == text_files
    table = ds.to_table(columns=["text", *quality.COLUMNS])
    expected = quality.compute_signals(table.column("text").combine_chunks())
    assert table.select(quality.COLUMNS).to_pydict() == pa.Table.from_batches([expected]).to_pydict()

    again = produce(quality.PRODUCER, Table.of(root), log=quiet)
    assert again.nothing_to_do and lance.dataset(uri).version == ds.version
    ingest(Table.of(root), "synthetic:150", rows_per_fragment=100, log=quiet)  # a second source unit
    more = produce(quality.PRODUCER, Table.of(root), log=quiet)
    assert more.rows_written == 150 and more.fragments_already_done == 3
    assert np.all(lance.dataset(uri).to_table(columns=["word_count"]).column(0).to_numpy() > 0)
