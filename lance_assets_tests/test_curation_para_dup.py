"""Paragraphs repeated across documents (`dup_paragraph_frac`): the vectorised, order-dependent
computation against a plain per-document reference, hostile inputs, and incremental runs that
end equal to one run over everything."""

import re
import shutil

import lance
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from lance_assets import paths
from lance_assets.curation import paragraph_dups as para_dup
from lance_assets.ingest.raw_text import ingest
from lance_assets.ingest.synthetic import SyntheticSpec, generate
from lance_assets.table import Table
from lance_assets.table.producer import produce
from lance_assets_tests.helpers import quiet


def reference(texts: list[str | None]) -> list[float]:
    """Per document, in order: characters of paragraphs seen in an earlier document / all."""
    seen: set[str] = set()
    out = []
    for text in texts:
        paras = [re.sub(r"\s+", " ", p.lower()).strip()
                 for p in re.split(r"\n[ \t\r\f\v]*\n", text or "")]
        paras = [p for p in paras if p]
        total = sum(len(p) for p in paras)
        repeated = sum(len(p) for p in paras if p in seen)
        out.append(repeated / total if total else 0.0)
        seen.update(paras)
    return out


HOSTILE = [None, "", "\n\n\n", "  \t ", "\x00\x01\x02\n\n\xff\ufffd",
           "Same paragraph.\n\nSame paragraph.",  # a repeat inside one document does not count
           "SAME   paragraph.\n \nother one",  # ... but case and spacing do not hide an earlier one
           "Первый абзац.\n\n第二段。\n\nmixed سطر",
           "Первый абзац.\n\nnew",
           ("x" * 200_000 + "\n\n") * 5]


def _write(tmp_path, name, texts):
    src = tmp_path / f"src-{name}"
    src.mkdir()
    pq.write_table(pa.table({"text": pa.array(texts, pa.string())}), src / "part.parquet")
    return src


def test_matches_the_reference_including_hostile_inputs(tmp_path):
    texts = HOSTILE + generate(SyntheticSpec(rows=400, seed=5)).column("text").to_pylist()
    root = tmp_path / "data"
    ingest(Table.of(root), str(_write(tmp_path, "a", texts)), rows_per_fragment=64, log=quiet)
    report = produce(para_dup.PRODUCER, Table.of(root), fragments_per_commit=3, log=quiet)
    stats = report.stats
    table = lance.dataset(paths.table_uri(root)).to_table(
        columns=["id", "text", "dup_paragraph_frac"]).sort_by("id")
    stored = table.column("text").to_pylist()  # ingest skips rows without text
    assert report.rows_written == len(stored) == stats["documents"] > 400
    got = table.column("dup_paragraph_frac").to_pylist()
    assert got == pytest.approx(reference(stored), abs=1e-6)
    first = stored.index("Same paragraph.\n\nSame paragraph.")
    assert got[first] == 0.0 and got[first + 1] == pytest.approx(len("same paragraph.") / len(
        "same paragraph.other one"))
    assert got[first + 3] == pytest.approx(len("первый абзац.") / len("первый абзац.new"))
    assert sum(v == 1.0 for v in got) > 10  # the synthetic corpus's exact copies
    # documents without paragraph text (what ingest would skip) have none
    doc, hashes, chars = para_dup.paragraphs(pa.array(HOSTILE[:5], pa.string()))
    assert doc.tolist() == [4, 4]  # the control characters and the invalid bytes, each a paragraph
    assert chars.tolist() == [len("\x00\x01\x02"), len("\xff\ufffd")]
    assert hashes[0] != hashes[1]


def test_incremental_runs_equal_one_run(tmp_path):
    texts = generate(SyntheticSpec(rows=500, seed=9)).column("text").to_pylist()
    first, second = texts[:300], texts[300:] + texts[:20]  # later copies of earlier documents
    whole = tmp_path / "whole"
    ingest(Table.of(whole), str(_write(tmp_path, "1", first)), rows_per_fragment=100, log=quiet)
    split = tmp_path / "split"
    shutil.copytree(whole, split)
    produce(para_dup.PRODUCER, Table.of(split), log=quiet)
    src2 = _write(tmp_path, "2", second)
    for root in (whole, split):
        ingest(Table.of(root), str(src2), rows_per_fragment=100, log=quiet)
    more = produce(para_dup.PRODUCER, Table.of(split), log=quiet)
    assert more.rows_written == len(second) and more.fragments_already_done == 3
    produce(para_dup.PRODUCER, Table.of(whole), log=quiet)

    def content(root):
        return lance.dataset(paths.table_uri(root)).to_table(
            columns=["id", "dup_paragraph_frac", "paragraph_hashes"]).sort_by("id").to_pylist()

    assert content(split) == content(whole)
    assert [r["dup_paragraph_frac"] for r in content(whole)][-20:] == [1.0] * 20
    assert produce(para_dup.PRODUCER, Table.of(split), log=quiet).nothing_to_do
