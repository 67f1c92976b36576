"""Benchmark contamination: planted copies of evaluation items found, near misses not, new sets
and new rows computed incrementally (nothing written is rewritten), registrations checked with
clear errors, and the blocking check that stops training on a contaminated kept row."""

import gzip
import json
import random

import lance
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from lance_assets import paths
from lance_assets.curation import contamination as cont
from lance_assets.curation import guards, rules
from lance_assets.ingest.raw_text import ingest
from lance_assets.table import Table, data_files_by_field
from lance_assets.table.producer import produce
from lance_assets_tests.helpers import quiet

WORDS = ("river mountain teacher lantern quiet orange window seven silver market yellow winter "
         "garden copper island letter morning engine forest simple bridge honest pocket").split()
FILLER = ("the of and a to in is was it for on with as by at from this that were which an "
          "be or are has have had not but").split()


def passage(rng: random.Random, n: int, words=WORDS) -> str:
    return " ".join(rng.choice(words) for _ in range(n))


def corpus_and_evals(seed: int = 0):
    """Evaluation items (40 words), and documents: filler prose with a whole item, a 13-word
    piece of one (re-cased, re-punctuated), a 12-word piece (too short to count), or nothing."""
    rng = random.Random(seed)
    items_a = [passage(rng, 40) for _ in range(20)]
    items_b = [passage(rng, 40) for _ in range(20)]
    docs, truth = [], []
    for i in range(300):
        # filler words are never item words, so no 13-gram spans filler and item by chance
        before, after = passage(rng, 60, FILLER), passage(rng, 60, FILLER)
        kind = i % 5
        item = (items_a if i % 2 else items_b)[rng.randrange(20)]
        words = item.split()
        if kind == 0:
            middle, hit = item, True
        elif kind == 1:
            start = rng.randrange(0, 27)
            piece = words[start:start + 13]
            middle, hit = ", ".join(w.upper() if j % 3 == 0 else w for j, w in enumerate(piece)) \
                + "!", True
        elif kind == 2:
            middle, hit = " ".join(words[:12]), False
        else:
            middle, hit = "", False
        docs.append(f"{before} {middle} {after}")
        truth.append(("a" if i % 2 else "b") if hit else None)
    return items_a, items_b, docs, truth


def write_jsonl(path, items, field="question"):
    path.write_text("".join(json.dumps({field: t, "answer": "x"}) + "\n" for t in items))
    return str(path)


@pytest.fixture
def world(tmp_path):
    items_a, items_b, docs, truth = corpus_and_evals()
    src = tmp_path / "src"
    src.mkdir()
    pq.write_table(pa.table({"text": docs[:200]}), src / "1.parquet")
    root = tmp_path / "data"
    ingest(Table.of(root), str(src), rows_per_fragment=50, log=quiet)
    a = cont.EvalSetSpec("set_a", write_jsonl(tmp_path / "a.jsonl", items_a), "question")
    b_path = tmp_path / "b.parquet"
    pq.write_table(pa.table({"prompt": items_b}), b_path)
    b = cont.EvalSetSpec("set_b", str(b_path), "prompt")
    return {"root": root, "src": src, "docs": docs, "truth": truth, "a": a, "b": b}


def flags(root):
    t = lance.dataset(paths.table_uri(root)).to_table(
        columns=["id", "contaminated", "contaminated_with"]).sort_by("id")
    return t.column("contaminated").to_pylist(), t.column("contaminated_with").to_pylist()


def test_planted_copies_are_found_and_new_sets_and_rows_are_incremental(world):
    root, truth, a, b = world["root"], world["truth"], world["a"], world["b"]
    uri = paths.table_uri(root)
    first = produce(cont.PRODUCER, Table.of(root), cont.ContaminationSettings(eval_sets=[a]),
                    fragments_per_commit=2, log=quiet)
    assert [s["items_too_short"] for s in first.sets] == [0]
    got, with_ = flags(root)
    assert with_ == [["set_a"] if t == "a" else [] for t in truth[:200]]  # recall 1, no false hit
    assert got == [t == "a" for t in truth[:200]]
    a_column = first.sets[0]["column"]
    a_files = data_files_by_field(lance.dataset(uri), a_column)

    # a second set: only its column is computed over the table, set_a's data files stay
    second = produce(cont.PRODUCER, Table.of(root), cont.ContaminationSettings(eval_sets=[a, b]),
                     log=quiet)
    assert second.registry_changed and second.new_columns == [second.sets[1]["column"]]
    assert data_files_by_field(lance.dataset(uri), a_column) == a_files
    got, with_ = flags(root)
    assert with_ == [[f"set_{t}"] if t else [] for t in truth[:200]]
    assert second.rows_by_set == {"set_a": truth[:200].count("a"), "set_b": truth[:200].count("b")}

    # new rows: every set, only on the new fragments
    pq.write_table(pa.table({"text": world["docs"][200:]}), world["src"] / "2.parquet")
    ingest(Table.of(root), str(world["src"]), rows_per_fragment=50, log=quiet)
    third = produce(cont.PRODUCER, Table.of(root), cont.ContaminationSettings(eval_sets=[a, b]),
                    log=quiet)
    assert not third.registry_changed
    # each set its own group (its own write marker): both compute only the new fragments
    assert [r.fragments_already_done for r in third.per_set] == [4, 4]
    assert [len(r.fragments_written) for r in third.per_set] == [2, 2]
    assert third.rows_written == 100  # the union's write: the run's report
    assert flags(root)[1] == [[f"set_{t}"] if t else [] for t in truth]
    assert produce(cont.PRODUCER, Table.of(root), cont.ContaminationSettings(eval_sets=[a, b]),
                   log=quiet).nothing_to_do

    # dropping a set from the registry re-derives the union without it
    produce(cont.PRODUCER, Table.of(root), cont.ContaminationSettings(eval_sets=[b]), log=quiet)
    assert flags(root)[1] == [["set_b"] if t == "b" else [] for t in truth]


def test_the_blocking_check_fails_while_a_kept_row_is_contaminated(world):
    root, a = world["root"], world["a"]
    ds = lance.dataset(paths.table_uri(root))
    assert guards.contamination_not_kept(ds).passed  # nothing registered yet
    produce(cont.PRODUCER, Table.of(root), cont.ContaminationSettings(eval_sets=[a]), log=quiet)
    ds = lance.dataset(paths.table_uri(root))
    rules.store_curation(Table.of(root), rules.Curation(rules={"long": "length(text) > 10"}))
    verdict = guards.contamination_not_kept(lance.dataset(paths.table_uri(root)))
    contaminated = ds.count_rows(filter="contaminated = true")
    assert not verdict.passed and verdict.numbers["kept_rows_contaminated_or_unchecked"] == \
        contaminated > 0
    assert "not_contaminated" in verdict.message
    added, _ = rules.tagger_rules(ds, keep_languages=[])
    assert added == {"not_contaminated": "NOT contaminated"}
    rules.store_curation(Table.of(root), rules.Curation(rules={"long": "length(text) > 10", **added}))
    assert guards.contamination_not_kept(lance.dataset(paths.table_uri(root))).passed


@pytest.mark.parametrize("make,message", [
    (lambda d: cont.EvalSetSpec("x", str(d / "missing.jsonl")), "no such file"),
    (lambda d: cont.EvalSetSpec("x", str(d / "a.csv")), "unsupported file type"),
    (lambda d: cont.EvalSetSpec("Bad Name", str(d / "a.jsonl")), "lowercase identifier"),
    (lambda d: cont.EvalSetSpec("x", str(d / "a.jsonl"), "answer; DROP"), "not a field name"),
    (lambda d: cont.EvalSetSpec("x", str(d / "a.jsonl"), "text"), "line 1 has no field 'text'"),
    (lambda d: cont.EvalSetSpec("x", str(d / "broken.jsonl")), "line 2 is not valid JSON"),
    (lambda d: cont.EvalSetSpec("x", str(d / "numbers.jsonl")), "holds int, not text"),
    (lambda d: cont.EvalSetSpec("x", str(d / "empty.jsonl")), "holds no items"),
    (lambda d: cont.EvalSetSpec("x", str(d / "nofield.parquet"), "q"), "no field 'q'"),
    (lambda d: cont.EvalSetSpec("x", str(d / "notparquet.parquet")), "not a readable parquet"),
    (lambda d: cont.EvalSetSpec("x", str(d / "bad.jsonl.gz")), "not a readable gzip"),
])
def test_bad_registrations_name_the_set_and_the_fix(tmp_path, make, message):
    write_jsonl(tmp_path / "a.jsonl", ["one two three"])
    (tmp_path / "a.csv").write_text("text\nx\n")
    (tmp_path / "broken.jsonl").write_text('{"text": "ok"}\n{"text": \n')
    (tmp_path / "numbers.jsonl").write_text('{"text": 5}\n')
    (tmp_path / "empty.jsonl").write_text("\n")
    pq.write_table(pa.table({"text": ["x"]}), tmp_path / "nofield.parquet")
    (tmp_path / "notparquet.parquet").write_bytes(b"PAR1 not really")
    (tmp_path / "bad.jsonl.gz").write_bytes(b"not gzip")
    with pytest.raises(cont.EvalSetError, match="evaluation set") as err:
        cont.load_eval_sets([make(tmp_path)])
    assert message in str(err.value)


def test_a_set_registered_twice_and_gzip_sets(tmp_path):
    path = tmp_path / "s.jsonl.gz"
    path.write_bytes(gzip.compress(json.dumps({"text": " ".join(WORDS)}).encode()))
    (loaded,) = cont.load_eval_sets([cont.EvalSetSpec("s", str(path))])
    assert loaded.items == 1 and len(loaded.hashes) == len(WORDS) - 12
    with pytest.raises(cont.EvalSetError, match="more than once"):
        cont.load_eval_sets([cont.EvalSetSpec("s", str(path)), cont.EvalSetSpec("s", str(path))])


def test_hostile_documents_and_items():
    texts = pa.array([None, "", "\x00\x01\xff" * 1000, "word " * 200_000,
                      "слово " * 20 + "詞" * 50, ". , ; ! ?" * 100], pa.string())
    doc, h = cont.ngram_hashes(texts)
    assert set(doc.tolist()) == {3, 4} and len(h) == (200_000 - 12) + (20 + 1 - 12)
    overlap = cont.SetOverlap.of([cont.EvalSet(cont.EvalSetSpec("w", "w.jsonl"),
                                               h[:1].copy(), 1, 0, "f" * 64)])
    assert overlap.flags(texts)[0].tolist() == [False, False, False, True, False, False]
