"""Source files that change after they were ingested are noticed, never skipped in silence."""

import os

import lance
import pyarrow as pa
import pyarrow.parquet as pq

from lance_assets import paths
from lance_assets.ingest.raw_text import ingest
from lance_assets.ingest.sources import JSONL_PART_BYTES
from lance_assets.table import Table
from lance_assets_tests.helpers import quiet


def lines(start: int, n: int) -> str:
    return "".join(f'{{"text": "line {i}: ' + "words " * 40 + f'", "id": "doc-{i}"}}\n'
                   for i in range(start, start + n))


def texts(root) -> list[str]:
    table = lance.dataset(paths.table_uri(root)).to_table(columns=["id", "doc_id"])
    return [d for _, d in sorted(zip(table.column("id").to_pylist(),
                                     table.column("doc_id").to_pylist()))]


def test_rows_appended_to_a_jsonl_are_ingested_by_the_next_run(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    feed = src / "feed.jsonl"
    feed.write_text(lines(0, 3000))  # several parts
    root = tmp_path / "data"
    first = ingest(Table.of(root), str(src), log=quiet)
    assert first.rows_added == 3000
    with open(feed, "a") as fh:
        fh.write(lines(3000, 500))
    second = ingest(Table.of(root), str(src), log=quiet)
    assert second.rows_added == 500 and not second.files_failed
    assert texts(root) == [f"doc-{i}" for i in range(3500)]  # each row once, in file order
    third = ingest(Table.of(root), str(src), log=quiet)
    assert third.rows_added == 0 and third.nothing_new and not third.files_failed


def test_appended_rows_equal_a_single_ingest_of_the_whole_file(tmp_path):
    """Growing a file in steps ends with the same documents as ingesting it once."""
    src, whole = tmp_path / "src", tmp_path / "whole"
    src.mkdir()
    whole.mkdir()
    body = lines(0, 2000)
    cuts = [0, 700, 1300, 2000]
    chunks = body.splitlines(keepends=True)
    for a, b in zip(cuts, cuts[1:]):
        with open(src / "f.jsonl", "a") as fh:
            fh.write("".join(chunks[a:b]))
        ingest(Table.of(tmp_path / "inc"), str(src), log=quiet)
    (whole / "f.jsonl").write_text(body)
    ingest(Table.of(tmp_path / "once"), str(whole), log=quiet)
    assert texts(tmp_path / "inc") == texts(tmp_path / "once")


def test_a_rewritten_file_is_refused_by_name_and_stored_rows_stay(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    pq.write_table(pa.table({"text": ["alpha doc", "beta doc"]}), src / "a.parquet")
    (src / "b.jsonl").write_text(lines(0, 10))
    root = tmp_path / "data"
    ingest(Table.of(root), str(src), log=quiet)
    pq.write_table(pa.table({"text": ["alpha doc", "beta doc", "gamma doc"]}), src / "a.parquet")
    (src / "b.jsonl").write_text(lines(100, 10))  # same size, other content
    report = ingest(Table.of(root), str(src), log=quiet)
    assert report.rows_added == 0
    assert set(report.files_failed) == {str((src / "a.parquet").resolve()),
                                        str((src / "b.jsonl").resolve())}
    assert all("changed since it was ingested" in why for why in report.files_failed.values())
    assert lance.dataset(paths.table_uri(root)).count_rows() == 12
    # the refused file under a new name is new data
    os.rename(src / "a.parquet", src / "a2.parquet")
    assert ingest(Table.of(root), str(src), log=quiet).rows_added == 3


def test_a_jsonl_line_longer_than_a_part_is_read_whole(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    big = "z" * (2 * JSONL_PART_BYTES)
    (src / "big.jsonl").write_text(lines(0, 5) + f'{{"text": "{big}"}}\n' + lines(5, 5))
    report = ingest(Table.of(tmp_path / "data"), str(src), max_doc_chars=3 * JSONL_PART_BYTES, log=quiet)
    assert report.rows_added == 11 and not report.files_failed


def test_a_folder_or_glob_with_no_files_warns_instead_of_saying_nothing_new(tmp_path):
    empty = tmp_path / "empty"
    empty.mkdir()
    for spec in (str(empty), str(tmp_path / "typo*/*.parquet")):
        report = ingest(Table.of(tmp_path / "data"), spec, log=quiet)
        assert report.nothing_new
        assert report.warnings and "matches no" in report.warnings[0] and spec in report.warnings[0]
        assert "Warning" in report.markdown()
