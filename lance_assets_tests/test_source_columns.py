"""Every column a source brings is kept next to the text, with its type; a value of the wrong
type costs its line (named by file, line, column and type), a column of another type in another
parquet file is refused naming both files, and a column named like one the table computes is
refused with the fix."""

import json
import re

import lance
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from lance_assets import paths
from lance_assets.ingest import sources
from lance_assets.ingest.raw_text import IngestConfigError, ingest
from lance_assets.table import Table
from lance_assets_tests.helpers import quiet, write_fineweb_parquet


def rows(root, columns):
    return lance.dataset(paths.table_uri(root)).to_table(columns=columns).to_pylist()


def test_a_sources_own_columns_are_kept_with_their_types_and_earlier_rows_get_null(tmp_path):
    """A FineWeb file first (no `domain`), then a parquet file with `domain`, `year` and a
    `file_path` the user drops: the table gains `domain` and `year` with their types, the
    earlier rows read null there, and nothing stored before changes."""
    root = tmp_path / "data"
    write_fineweb_parquet(tmp_path / "a.parquet", ["first document", "second document"])
    ingest(Table.of(root), str(tmp_path / "a.parquet"), log=quiet)
    before = rows(root, ["id", "text", "url"])
    pq.write_table(pa.table({"text": ["a news story", "some code"], "domain": ["news", "code"],
                             "year": pa.array([2020, 2021], pa.int32()),
                             "file_path": ["s3://x/1", "s3://x/2"]}), tmp_path / "b.parquet")
    report = ingest(Table.of(root), str(tmp_path / "b.parquet"), drop_columns=["file_path"],
                    log=quiet)
    assert report.rows_added == 2 and report.columns_added == ["domain", "year"]
    ds = lance.dataset(paths.table_uri(root))
    assert ds.schema.field("domain").type == pa.string()
    assert ds.schema.field("year").type == pa.int32()
    assert "file_path" not in ds.schema.names
    assert rows(root, ["id", "text", "url"])[:2] == before
    assert [(r["domain"], r["year"]) for r in rows(root, ["domain", "year"])] == [
        (None, None), (None, None), ("news", 2020), ("code", 2021)]
    # a JSON-lines file fills the same columns; a float where `year` holds integers costs
    # that line, named with the column, the value's type and the file that brought the column
    lines = [json.dumps({"text": f"json doc {i}", "domain": "web", "year": 2000 + i,
                         "published": f"2024-01-0{i % 9 + 1} 10:00:00"}) for i in range(200)]
    lines[149] = json.dumps({"text": "json doc 149", "domain": "web", "year": 2149.5})
    (tmp_path / "c.jsonl").write_text("\n".join(lines) + "\n")
    report = ingest(Table.of(root), str(tmp_path / "c.jsonl"), log=quiet)
    c = str((tmp_path / "c.jsonl").resolve())
    assert report.rows_added == 199 and not report.files_refused
    (reason,) = [k for k in report.rows_skipped if "line 150" in k]
    assert reason.startswith(f"wrong type: {c} line 150: column 'year' holds a float (2149.5) ")
    assert str((tmp_path / "b.parquet").resolve()) in reason and "int32" in reason
    published = {r["published"] for r in rows(root, ["published"]) if r["published"]}
    assert "2024-01-01 10:00:00" in published  # a JSON string stays the string it was
    assert lance.dataset(paths.table_uri(root)).schema.field("published").type == pa.string()


def test_a_column_of_another_type_in_another_parquet_file_is_refused_naming_both(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    pq.write_table(pa.table({"text": ["one", "two"], "year": [2020, 2021]}), src / "a.parquet")
    pq.write_table(pa.table({"text": ["three"], "year": ["MMXXII"]}), src / "b.parquet")
    pq.write_table(pa.table({"text": ["four"], "year": pa.array([2022], pa.int16())}),
                   src / "c.parquet")  # a narrower integer fits
    report = ingest(Table.of(tmp_path / "data"), str(src), log=quiet)
    a, b = (str((src / n).resolve()) for n in ("a.parquet", "b.parquet"))
    assert list(report.files_failed) == [b] and report.rows_added == 3
    why = report.files_failed[b]
    assert f"column 'year' is string in {b} but int64 in {a}" in why
    assert "drop_columns: ['year']" in why


@pytest.mark.parametrize("column", ["is_dup", "input_ids", "source", "n_chars", "_rowid"])
def test_a_source_column_named_like_one_the_table_computes_is_refused_with_the_fix(
        tmp_path, column):
    path = tmp_path / "a.parquet"
    pq.write_table(pa.table({"text": ["a document"], column: [True]}), path)
    report = ingest(Table.of(tmp_path / "data"), str(path), log=quiet)
    why = report.files_failed[str(path)]
    assert report.rows_added == 0 and f"column {column!r}" in why
    assert f"drop_columns: [{column!r}]" in why
    again = ingest(Table.of(tmp_path / "data"), str(path), drop_columns=[column], log=quiet)
    assert again.rows_added == 1 and not again.files_failed


def test_a_source_text_column_beside_the_one_ingested_is_refused_unless_dropped(tmp_path):
    """With `text_column: content`, a source's own `text` column would be stored over the
    document: refused with the fix, and dropping it (allowed: it is not the text) works."""
    path = tmp_path / "a.parquet"
    pq.write_table(pa.table({"content": ["the document"], "text": ["a title"]}), path)
    report = ingest(Table.of(tmp_path / "data"), str(path), text_column="content", log=quiet)
    assert "column 'text'" in report.files_failed[str(path)]
    again = ingest(Table.of(tmp_path / "data"), str(path), text_column="content",
                   drop_columns=["text"], log=quiet)
    assert again.rows_added == 1
    assert rows(tmp_path / "data", ["text"]) == [{"text": "the document"}]


def test_nested_values_are_kept_and_a_nested_value_of_another_type_costs_its_line(tmp_path):
    lines = [json.dumps({"text": f"doc {i}", "meta": {"tags": ["a", "b"], "n": i}})
             for i in range(300)]
    lines[41] = json.dumps({"text": "doc 41", "meta": {"tags": ["a"], "n": "forty-one"}})
    (tmp_path / "n.jsonl").write_text("\n".join(lines) + "\n")
    report = ingest(Table.of(tmp_path / "data"), str(tmp_path / "n.jsonl"), log=quiet)
    assert report.rows_added == 299
    (reason,) = report.rows_skipped
    assert reason.endswith("line 42: column 'meta/n' holds string where the column holds number")
    stored = rows(tmp_path / "data", ["meta"])
    assert stored[0]["meta"] == {"tags": ["a", "b"], "n": 0}


def test_a_file_that_loses_lines_after_a_commit_keeps_those_rows_and_fails_each_run(
        tmp_path, monkeypatch):
    """Judged before each commit: the first groups of a long file land, the group where the
    unreadable lines pass the share is not stored, the file is refused naming where its stored
    rows end, and a rerun refuses it again rather than succeeding quietly."""
    lines = [json.dumps({"text": f"doc {i}", "n": i}) for i in range(400)]
    for i in range(300, 340):
        lines[i] = json.dumps({"text": f"doc {i}", "n": "many"})
    (tmp_path / "l.jsonl").write_text("\n".join(lines) + "\n")
    monkeypatch.setattr(sources, "JSONL_PART_BYTES", 2048)  # parts of ~70 lines
    root = tmp_path / "data"
    with pytest.raises(IngestConfigError, match="max_bad_line_share 2: .* from 0 to 1"):
        ingest(Table.of(root), str(tmp_path / "l.jsonl"), max_bad_line_share=2, log=quiet)
    with pytest.raises(IngestConfigError, match=re.escape(
            "drop_columns ['text']: 'text' is the document (text_column)")):
        ingest(Table.of(root), str(tmp_path / "l.jsonl"), drop_columns=["text"], log=quiet)
    assert not (root / "lance").exists()  # refused before any side effect
    for _ in range(2):
        report = ingest(Table.of(root), str(tmp_path / "l.jsonl"), rows_per_commit=100,
                        log=quiet)
        (why,) = report.files_refused.values()
        assert "line 301: column 'n' holds a string" in why
    stored = lance.dataset(paths.table_uri(root)).count_rows()
    assert 100 <= stored < 300 and f"Its rows before line {stored + 1} are stored" in why
    assert f"put its lines from line {stored + 1} on, fixed, in a new file" in why
