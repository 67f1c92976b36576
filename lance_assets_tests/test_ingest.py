import json
import os
import re
from pathlib import Path

import lance
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from lance_assets import paths
from lance_assets.curation import dedup_flag
from lance_assets.curation.dedup_flag import normalise
from lance_assets.ingest.raw_text import ingest
from lance_assets.ingest.sources import SourceError
from lance_assets.ingest.synthetic import SyntheticSpec, generate
from lance_assets.table import Table
from lance_assets.table.producer import produce
from lance_assets_tests.helpers import quiet, write_fineweb_parquet


def read(root, columns):
    return lance.dataset(paths.table_uri(root)).to_table(columns=columns).to_pylist()


def expected_dups(texts_in_id_order):
    seen, out = set(), []
    for t in texts_in_id_order:
        key = normalise(t)
        out.append(key in seen)
        seen.add(key)
    return out


def test_synthetic_is_reproducible_and_has_known_duplicates():
    a = generate(SyntheticSpec(rows=800, seed=3, dup_fraction=0.1))
    b = generate(SyntheticSpec(rows=800, seed=3, dup_fraction=0.1))
    assert a.equals(b)
    texts = a.column("text").to_pylist()
    dup_share = sum(expected_dups(texts)) / len(texts)
    assert 0.05 < dup_share < 0.15
    # some duplicates differ only in whitespace: raw equality misses them, normalisation finds them
    raw_dups = len(texts) - len(set(texts))
    assert raw_dups < sum(expected_dups(texts))
    scores = a.column("score").to_pylist()
    assert min(scores) >= 0 and max(scores) <= 5 and max(scores) - min(scores) > 3


def test_parquet_folder_ingest_and_dedup_flag_exact_duplicates(tmp_path, root):
    src = tmp_path / "fineweb"
    src.mkdir()
    base = [f"Document number {i} talks about topic {i % 13}.\nIt has two lines." for i in range(300)]
    f1 = base[:150] + [base[3], "  " + base[4].replace(" ", "\t  ")]          # dups inside file 1
    f2 = base[150:] + [base[10], base[10] + " ", base[200].replace("\n", " \n ")]  # across files
    write_fineweb_parquet(src / "000.parquet", f1)
    write_fineweb_parquet(src / "001.parquet", f2, start_id=1000)

    report = ingest(Table.of(root), str(src), rows_per_fragment=64, log=quiet)
    assert report.rows_added == len(f1) + len(f2)
    assert report.fragments_added > 2
    report = produce(dedup_flag.PRODUCER, Table.of(root), fragments_per_commit=2, log=quiet)
    assert report.commits > 1

    rows = sorted(read(root, ["id", "text", "is_dup", "doc_id", "url", "score", "n_chars", "source"]),
                  key=lambda r: r["id"])
    assert [r["text"] for r in rows] == f1 + f2  # every row, in file order
    assert [r["id"] for r in rows] == list(range(len(rows)))
    assert [r["is_dup"] for r in rows] == expected_dups(f1 + f2)
    assert sum(r["is_dup"] for r in rows) == 5
    assert rows[0]["doc_id"] == "<urn:uuid:00000000>" and rows[0]["url"].startswith("https://")
    assert all(r["n_chars"] == len(r["text"]) for r in rows)
    # the key names the file and fingerprints its content: file:PATH#FP
    assert {r["source"].rpartition("#")[0] for r in rows} == {
        f"file:{(src / n).resolve()}" for n in ("000.parquet", "001.parquet")}


def test_ingest_is_incremental_ids_unique_and_rerun_is_noop(tmp_path, root):
    src = tmp_path / "landing"
    src.mkdir()
    write_fineweb_parquet(src / "a.parquet", [f"alpha {i}" for i in range(50)])
    first = ingest(Table.of(root), str(src), log=quiet)
    ds = lance.dataset(paths.table_uri(root))
    assert ds.has_stable_row_ids
    again = ingest(Table.of(root), str(src), log=quiet)
    assert again.nothing_new and again.rows_added == 0
    assert lance.dataset(paths.table_uri(root)).version == first.version  # no new version

    write_fineweb_parquet(src / "b.parquet", [f"beta {i}" for i in range(30)])
    third = ingest(Table.of(root), str(src), log=quiet)
    assert third.rows_added == 30 and len(third.units_ingested) == 1
    ids = [r["id"] for r in read(root, ["id"])]
    assert sorted(ids) == list(range(80))


def test_null_and_empty_texts_are_skipped_and_counted(tmp_path, root):
    path = tmp_path / "x.parquet"
    pq.write_table(pa.table({"text": pa.array(["good one", None, "", "   \n", "good two"])}), path)
    report = ingest(Table.of(root), str(path), log=quiet)
    assert report.rows_added == 2
    assert report.rows_skipped == {"null_text": 1, "empty_text": 2}
    assert [r["text"] for r in read(root, ["text"])] == ["good one", "good two"]


def test_custom_text_column(tmp_path, root):
    path = tmp_path / "c.parquet"
    pq.write_table(pa.table({"content": ["one doc", "two doc"], "id": [7, 8]}), path)
    report = ingest(Table.of(root), str(path), log=quiet)
    assert report.rows_added == 0 and "'text'" in report.files_failed[str(path.resolve())]
    assert "content" in report.files_failed[str(path.resolve())]  # the columns it does have
    ingest(Table.of(root), str(path), text_column="content", log=quiet)
    assert [r["doc_id"] for r in read(root, ["doc_id"])] == ["7", "8"]


def test_bad_files_are_reported_others_ingest_and_nothing_stored_changes(tmp_path, root):
    good = write_fineweb_parquet(tmp_path / "good.parquet", ["kept text"])
    ingest(Table.of(root), str(good), log=quiet)
    before = read(root, ["id", "text"])

    with pytest.raises(SourceError, match="no such file or folder.*synthetic"):
        ingest(Table.of(root), str(tmp_path / "missing"), log=quiet)

    folder = tmp_path / "mixed"
    folder.mkdir()
    write_fineweb_parquet(folder / "a_ok.parquet", ["new text"])
    pq.write_table(pa.table({"body": ["no text column here"]}), folder / "b_wrong_schema.parquet")
    (folder / "c_corrupt.parquet").write_bytes(b"PAR1 this is not parquet")
    (folder / "d_bad.jsonl").write_text('{"text": "fine"}\n{"text": unquoted}\n')
    pq.write_table(pa.table({"text": pa.array([], pa.string())}), folder / "e_empty.parquet")
    (folder / "f_empty.jsonl").write_text("")
    (folder / "g_empty.txt").write_text("")
    pq.write_table(pa.table({"text": pa.array([b"caf\xc3\xa9 ok", b"bad \xff\xfe bytes"], pa.binary())}),
                   folder / "h_binary.parquet")
    pq.write_table(pa.table({"text": ["x" * 50_000_000, "a normal document"]}), folder / "i_huge.parquet")
    report = ingest(Table.of(root), str(folder), log=quiet)

    failed = {Path(k).name: v for k, v in report.files_failed.items()}
    assert set(failed) == {"b_wrong_schema.parquet", "c_corrupt.parquet"}
    assert "text_column" in failed["b_wrong_schema.parquet"]
    assert "replace or remove" in failed["c_corrupt.parquet"]
    # one unreadable line of two is more than the 1% a file may lose: those files are refused
    # whole (nothing of them stored, so a fixed file is read anew), the others land
    refused = {Path(k).name: v for k, v in report.files_refused.items()}
    assert set(refused) == {"d_bad.jsonl", "h_binary.parquet"}
    assert "1 of 2 lines" in refused["d_bad.jsonl"] and "line 2" in refused["d_bad.jsonl"]
    assert "not UTF-8: line 2" in refused["h_binary.parquet"]
    # the one non-UTF-8 row is counted once, under its own reason (not also as null text); the
    # malformed JSON line under its file and line
    bad_line = f"malformed JSON: {(folder / 'd_bad.jsonl').resolve()} line 2"
    assert report.rows_skipped == {"not_utf8": 1, "empty_text": 1,
                                   "longer_than_1000000_chars": 1, bad_line: 1}
    rows = read(root, ["id", "text"])
    assert rows[: len(before)] == before  # what was stored is untouched
    assert [r["text"] for r in rows[len(before):]] == ["new text", "a normal document"]
    # allowed to lose half their lines, the refused files land with their good lines
    again = ingest(Table.of(root), str(folder), max_bad_line_share=0.5, log=quiet)
    assert not again.files_refused and again.rows_added == 2
    rows = read(root, ["id", "text"])
    assert [r["text"] for r in rows[len(before):]] == ["new text", "a normal document", "fine",
                                                       "café ok"]
    assert [r["id"] for r in rows] == list(range(len(rows)))


def test_jsonl_and_txt_sources(tmp_path, root):
    folder = tmp_path / "mixed"
    folder.mkdir()
    (folder / "a.jsonl").write_text(
        "\n".join(json.dumps({"text": f"json doc {i}", "id": i}) for i in range(3)))
    (folder / "b.txt").write_text("a plain text document\nwith two lines")
    (folder / "c.txt").write_bytes(b"\xff\xfe not utf-8 \xc3")
    report = ingest(Table.of(root), str(folder), log=quiet)
    assert report.rows_added == 4
    assert report.rows_skipped == {"not_utf8": 1}
    texts = sorted(r["text"] for r in read(root, ["text"]))
    assert texts == ["a plain text document\nwith two lines", "json doc 0", "json doc 1", "json doc 2"]


def test_a_damaged_row_group_is_skipped_and_named_and_the_groups_after_it_land(tmp_path, root):
    """One row group of three has a damaged page (what a truncated copy or a bad disk leaves):
    the groups before and after it land, the damaged one is counted under a reason naming the
    file and the group, and a rerun adds nothing and says the same."""
    src = tmp_path / "src"
    src.mkdir()
    texts = [f"document {i} " + "words of its own " * 20 for i in range(300)]
    path = write_fineweb_parquet(src / "a.parquet", texts)
    pq.write_table(pq.read_table(path), path, row_group_size=100, compression="NONE")
    meta = pq.read_metadata(path)
    assert meta.num_row_groups == 3
    col = meta.row_group(1).column(meta.schema.names.index("text"))
    with open(path, "r+b") as fh:  # garbage over the text column's first page header
        fh.seek(col.data_page_offset)
        fh.write(b"\xff" * 64)
    # a third of the file unreadable is more than the 1% a file may lose: refused, named
    refused = ingest(Table.of(root), str(src), log=quiet)
    assert refused.rows_added == 0 and "100 of 300 lines" in refused.files_refused[str(path)]
    assert "row group 1" in refused.files_refused[str(path)]
    first = ingest(Table.of(root), str(src), max_bad_line_share=0.5, log=quiet)
    ds = lance.dataset(paths.table_uri(root))
    landed = sorted(int(t.split()[1]) for t in ds.to_table(columns=["text"]).column("text")
                    .to_pylist())
    assert landed == list(range(100)) + list(range(200, 300))
    (reason, n), = first.rows_skipped.items()
    assert n == 100 and str(path) in reason and "row group 1" in reason
    again = ingest(Table.of(root), str(src), max_bad_line_share=0.5, log=quiet)
    assert again.rows_added == 0 and ds.count_rows() == 200
    assert lance.dataset(paths.table_uri(root)).count_rows() == 200


@pytest.mark.parametrize("field, value", [("rows_per_fragment", 0), ("rows_per_fragment", -5),
                                          ("rows_per_commit", 0), ("max_doc_chars", -1),
                                          ("max_new_rows", 0), ("text_column", ""),
                                          ("max_bad_line_share", 1.5),
                                          ("drop_columns", ["text"])])
def test_raw_text_run_config_names_each_bad_field_and_its_range(tmp_path, field, value):
    """`rows_per_fragment: 0` was a Rust panic, `-5` an OverflowError, `max_new_rows: 0` on a
    fresh root said to materialize `raw_text` first: each bad field is refused before the run,
    named with its allowed range, and the library refuses it the same way."""
    import dagster as dg

    from lance_assets.definitions import defs
    from lance_assets.defs.resources import LanceStore
    from lance_assets.ingest.raw_text import IngestConfigError

    root = tmp_path / "data"
    with pytest.raises(Exception, match=re.escape(f"{field} {value!r}: ")) as refused:
        dg.materialize([defs.get_assets_def("raw_text")],
                       resources={"lance_store": LanceStore(data_dir=str(root))},
                       run_config={"ops": {"raw_text": {"config": {
                           "source": "synthetic:10", field: value}}}})
    assert field in ("text_column", "drop_columns") or "from 1 to" in str(refused.value) or \
        "from 0 to 1" in str(refused.value)
    with pytest.raises(IngestConfigError, match=re.escape(f"{field} {value!r}: ")):
        ingest(Table.of(root), "synthetic:10", **{field: value}, log=quiet)
    assert not (root / "lance").exists()  # nothing ran


def test_a_run_config_source_is_named_as_such_and_an_empty_one_is_refused(tmp_path):
    """A bad `source` in raw_text's run config is named as that field, not as the environment
    variable; `source: ""` was taken as "not set" and ingested LANCE_ASSETS_SOURCE: refused
    before the run, nothing ingested."""
    import dagster as dg

    from lance_assets.definitions import defs
    from lance_assets.defs.resources import LanceStore

    store = {"lance_store": LanceStore(data_dir=str(tmp_path / "data"), source="synthetic:10")}
    missing = str(tmp_path / "no-such-folder")
    run = dg.materialize([defs.get_assets_def("raw_text")], resources=store, raise_on_error=False,
                         run_config={"ops": {"raw_text": {"config": {"source": missing}}}})
    message = run.failure_data_for_node("raw_text").error.message
    assert f"raw_text's config source={missing!r}: no such file or folder" in message
    assert "LANCE_ASSETS_SOURCE=" not in message
    for blank in ("", "  "):
        with pytest.raises(Exception, match=f"source {blank!r}: names no source. Leave it out "
                                            "to read LANCE_ASSETS_SOURCE"):
            dg.materialize([defs.get_assets_def("raw_text")], resources=store,
                           run_config={"ops": {"raw_text": {"config": {"source": blank}}}})
    assert not Table.of(tmp_path / "data").exists()


def test_a_moved_or_renamed_file_is_not_ingested_again_and_an_older_table_stays_readable(
        tmp_path, monkeypatch):
    """Files are known by their content: a source folder moved, a file renamed, copied, or
    moved and grown (a JSON-lines file) adds only what is new. A table whose keys an earlier
    release wrote (the path and the size and edges) does not ingest everything again."""
    from lance_assets.ingest import sources

    def make(folder):
        folder.mkdir()
        write_fineweb_parquet(folder / "a.parquet", [f"parquet doc {i}" for i in range(30)])
        (folder / "b.jsonl").write_text("".join(
            json.dumps({"text": f"jsonl doc {i}"}) + "\n" for i in range(40)))
        (folder / "c.txt").write_text("one text document")

    for release in ("this", "earlier"):
        base = tmp_path / release
        base.mkdir()
        make(base / "src")
        root = base / "data"
        with monkeypatch.context() as m:
            if release == "earlier":  # its keys: the path and the size-and-edges fingerprint
                m.setattr(sources, "file_key", lambda path, fp, digest: f"file:{path}#{fp}")
                m.setattr(sources, "generation_key",
                          lambda path, start, end, fp, digest: f"file:{path}@{start}-{end}#{fp}")
                m.setattr(sources, "content_digest", lambda *a, **k: "")
            assert ingest(Table.of(root), str(base / "src"), log=quiet).rows_added == 71
        assert ingest(Table.of(root), str(base / "src"), log=quiet).rows_added == 0
        (base / "src").rename(base / "moved")
        (base / "moved" / "a.parquet").rename(base / "moved" / "renamed.parquet")
        again = ingest(Table.of(root), str(base / "moved"), log=quiet)
        assert again.rows_added == 0 and not again.files_failed, (release, again)
        (base / "copy").mkdir()
        (base / "copy" / "c2.txt").write_text("one text document")
        (base / "moved" / "b.jsonl").rename(base / "copy" / "b2.jsonl")
        with open(base / "copy" / "b2.jsonl", "a") as fh:  # moved, then grown
            fh.write(json.dumps({"text": "a new line"}) + "\n")
        grown = ingest(Table.of(root), str(base / "copy"), log=quiet)
        assert grown.rows_added == 1 and not grown.files_failed, (release, grown)
        texts = read(root, ["text"])
        assert sorted(r["text"] for r in texts).count("jsonl doc 0") == 1
        assert len(texts) == 72


def test_a_badly_typed_line_costs_that_line_and_a_file_that_loses_more_fails_the_cli_run(
        tmp_path):
    """One `dagster asset materialize` over a folder: a 900-line file whose line 500 holds
    `"score": "high"` where the others hold numbers lands 899 rows and names line 500 (it was
    refused whole, as "row 127", with exit 0); a 14-line file with one bad line and a file of
    only bad lines store nothing and fail the run (exit 1) naming each file, line, column and
    type; the parquet file's own columns are kept next to the text. Fixed, the refused file is
    read anew by the next run."""
    import subprocess
    import sys

    src = tmp_path / "src"
    src.mkdir()
    big = [json.dumps({"text": f"document {i + 1} of the big file", "score": i % 5 + 0.5,
                       "meta": {"lang": "en", "n": i}}) for i in range(900)]
    big[499] = json.dumps({"text": "line 500 is fine text", "score": "high"})
    big[99] = '{"text": unquoted}'  # line 100: not JSON
    (src / "a_big.jsonl").write_text("\n".join(big) + "\n")
    small = [json.dumps({"text": f"small {i + 1}", "n_links": i}) for i in range(14)]
    small[6] = json.dumps({"text": "small 7", "n_links": [1, 2]})
    (src / "b_small.jsonl").write_text("\n".join(small) + "\n")
    (src / "c_bad.jsonl").write_text('{"text": 5}\n[1, 2]\n')
    pq.write_table(pa.table({"text": ["a parquet document", "another one"],
                             "domain": ["news", "code"], "file_path": ["x/1", "x/2"]}),
                   src / "d_own.parquet")
    env = {k: v for k, v in os.environ.items() if k != "DAGSTER_HOME"}
    env.update(LANCE_ASSETS_DATA=str(tmp_path / "data"), LANCE_ASSETS_SOURCE=str(src),
               DAGSTER_HOME=str(tmp_path / "home"))
    (tmp_path / "home").mkdir()
    run = subprocess.run([str(Path(sys.executable).with_name("dagster")), "asset", "materialize",
                          "-m", "lance_assets.definitions", "--select", "raw_text"],
                         env=env, capture_output=True, text=True, timeout=300)
    out = run.stdout + run.stderr
    assert run.returncode != 0, out[-3000:]
    a, b, c = (str((src / n).resolve()) for n in ("a_big.jsonl", "b_small.jsonl", "c_bad.jsonl"))
    assert f"{b}: 1 of 14 lines read are unreadable" in out
    assert "line 7: column 'n_links' holds an array where the column holds numbers" in out
    assert f"{c}: 2 of 2 lines" in out and "line 1: column 'text' holds an integer" in out
    assert "line 2" in out and "row 127" not in out
    ds = lance.dataset(paths.table_uri(tmp_path / "data"))
    rows = ds.to_table(columns=["text", "score", "meta", "domain", "file_path", "source"]
                       ).to_pylist()
    assert len(rows) == 898 + 2  # every line but the two bad ones of the big file
    texts = {r["text"] for r in rows}
    assert "line 500 is fine text" not in texts and "document 501 of the big file" in texts
    assert not any(r["text"].startswith("small") for r in rows)
    assert {(r["text"], r["domain"], r["file_path"]) for r in rows if r["domain"]} == {
        ("a parquet document", "news", "x/1"), ("another one", "code", "x/2")}
    assert {r["meta"]["lang"] for r in rows if r["meta"]} == {"en"}
    assert ds.schema.field("domain").type == pa.string()
    assert "n_links" not in ds.schema.names  # the refused file's column went with it
    assert ds.schema.field("meta").type == pa.struct([("lang", pa.string()), ("n", pa.int64())])
    # the big file's two bad lines are named by line, column and type in the run's record
    from dagster import AssetKey, DagsterInstance

    with DagsterInstance.from_config(str(tmp_path / "home")) as instance:
        event = instance.get_latest_materialization_event(AssetKey("raw_text"))
    skipped = event.asset_materialization.metadata["rows_skipped_by_reason"].value
    assert skipped[f"malformed JSON: {a} line 100"] == 1
    assert skipped[f"wrong type: {a} line 500: column 'score' holds a string where the column "
                   "holds numbers"] == 1
    # fixed, the small file is read anew (it is another content); nothing else twice
    small[6] = json.dumps({"text": "small 7", "n_links": 6})
    (src / "b_small.jsonl").write_text("\n".join(small) + "\n")
    again = ingest(Table.of(tmp_path / "data"), str(src), log=quiet)
    assert again.rows_added == 14 and list(again.files_refused) == [c], again.files_refused
    assert again.columns_added == ["n_links"]
    assert ds.checkout_version(again.version).count_rows() == 914


def test_a_fresh_root_whose_only_file_is_broken_fails_naming_it(tmp_path):
    """A first ingest of nothing but a broken file says which file, not "materialize raw_text";
    so does a file that yields no row, and the run's `files_ingested` check fails."""
    import dagster as dg

    from lance_assets.definitions import defs
    from lance_assets.defs.resources import LanceStore

    (tmp_path / "b.parquet").write_bytes(b"PAR1 this is not parquet")
    (tmp_path / "c.jsonl").write_text('{"text": null, "id": 7}\n')
    for name, why in (("b.parquet", "replace or remove"), ("c.jsonl", "none of its 1 lines")):
        fresh = dg.materialize([defs.get_assets_def("raw_text")], raise_on_error=False,
                               resources={"lance_store": LanceStore(
                                   data_dir=str(tmp_path / "fresh"), source=str(tmp_path / name))})
        failure = fresh.failure_data_for_node("raw_text").error.message
        assert not fresh.success and name in failure and "Materialize" not in failure
        assert why in failure
    assert not Table.of(tmp_path / "fresh").exists()
