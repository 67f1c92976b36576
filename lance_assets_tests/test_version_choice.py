"""The table chooses versions: ``Table.choose`` turns the newest, a version number, a tag or a
run's recorded (tag, version) into one version, under the rules the snapshots and the
maintenance enforce, and no module outside ``lance_assets/table/`` reads tags or checks out
versions itself."""

from __future__ import annotations

import ast
from datetime import timedelta
from pathlib import Path
from types import SimpleNamespace

import pytest

import lance_assets
from lance_assets.ingest.raw_text import ingest
from lance_assets.table import Table, VersionChoiceError
from lance_assets.table import snapshots as snaps
from lance_assets.table.maintenance import maintain
from lance_assets_tests.helpers import quiet

PACKAGE = Path(lance_assets.__file__).parent

# Modules that still choose versions themselves, each with the change that removes it.
ALLOWED: set[str] = set()
TAG_VERBS = {"list", "create", "update", "delete", "get_version"}
CHECKOUTS = {"checkout", "checkout_version", "checkout_latest", "list_tags"}
OPENERS = {"dataset", "LanceDataset", "open_table"}


def version_choosers(package: Path) -> list[str]:
    """``file:line what`` for every place outside ``table/`` that reads tags (``x.tags.list()``,
    ``list_tags``, ``x.snapshots.version(tag)``), checks out a version (``checkout``,
    ``checkout_version``) or opens a dataset at a version (``dataset(..., version=...)``)."""
    found = []
    for path in sorted(package.rglob("*.py")):
        rel = path.relative_to(package.parent).as_posix()
        if rel.split("/")[1] == "table" or rel in ALLOWED:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            what = None
            if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Attribute):
                if node.value.attr == "tags" and node.attr in TAG_VERBS:
                    what = f"reads tags (.tags.{node.attr})"
                elif node.value.attr == "snapshots" and node.attr == "version":
                    what = "reads a tag (.snapshots.version)"
            if isinstance(node, ast.Attribute) and node.attr in CHECKOUTS:
                what = f"checks out a version (.{node.attr})"
            if isinstance(node, ast.Call):
                f = node.func
                name = f.attr if isinstance(f, ast.Attribute) else getattr(f, "id", "")
                if name in OPENERS and any(k.arg in ("version", "asof") for k in node.keywords):
                    what = f"opens a version ({name}(..., version=...))"
            if what:
                found.append(f"{rel}:{node.lineno} {what}")
    return found


def test_no_module_outside_the_table_reads_tags_or_checks_out_versions():
    offenders = version_choosers(PACKAGE)
    assert not offenders, ("choose the version through lance_assets.table.Table.choose:\n"
                           + "\n".join(offenders))


def test_the_scan_finds_every_way_of_choosing_a_version(tmp_path):
    package = tmp_path / "pkg"
    (package / "table").mkdir(parents=True)
    (package / "table" / "handle.py").write_text("ds.tags.list()\n")  # the table's own: allowed
    (package / "forensics.py").write_text(
        "tags = ds.tags.list()\n"
        "handle.to_lance().tags.create('t', 3)\n"
        "table.checkout(3)\n"
        "ds = ds.checkout_version(3)\n"
        "names = handle.list_tags()\n"
        "v = table.snapshots.version('train-r1')\n"
        "ds = lance.dataset(uri, version='train-r1')\n"
        "seen = (materialization.tags or {}).get('x')\n"  # Dagster's tags: not the table's
        "held = table.snapshots.hold('t', 3, owner='me')\n")  # holding is the snapshots' verb
    lines = sorted(int(o.split(":")[1].split()[0]) for o in version_choosers(package))
    assert lines == [1, 2, 3, 4, 5, 6, 7]


@pytest.fixture
def table(tmp_path) -> Table:
    root = tmp_path / "data"
    ingest(Table.of(root), "synthetic:200", rows_per_fragment=100, log=quiet)
    ingest(Table.of(root), "synthetic:300", rows_per_fragment=100, log=quiet)
    return Table.of(root)


def _first(table: Table) -> int:
    return min(int(v["version"]) for v in table.newest().versions()
               if table.open(int(v["version"])).count_rows() == 200)


def test_none_is_the_newest_version(table):
    chosen = table.choose()
    assert chosen.version == table.newest().version and chosen.tag is None
    assert chosen.dataset.count_rows() == table.newest().count_rows() > 200
    assert "newest" in chosen.said


def test_a_number_is_that_version(table):
    first = _first(table)
    chosen = table.choose(first)
    assert chosen.version == first and chosen.dataset.count_rows() == 200
    assert chosen.tag is None and f"version {first}" in chosen.said


def test_digits_from_a_command_line_are_a_version_number(table):
    first = _first(table)
    chosen = table.choose(str(first))
    assert chosen.version == first and chosen.tag is None
    assert chosen.dataset.count_rows() == 200
    with pytest.raises(VersionChoiceError, match="999999"):
        table.choose("999999")


def test_a_tag_made_by_hand_is_the_version_it_names(table):
    first = _first(table)
    table.newest().tags.create("by-hand", first)
    chosen = table.choose("by-hand")
    assert (chosen.version, chosen.tag, chosen.snapshot) == (first, "by-hand", None)
    assert chosen.dataset.count_rows() == 200


def test_a_snapshot_is_its_version_with_its_record(table):
    first = _first(table)
    table.snapshots.hold("train-r1", first, owner="pretrained_model", kind=snaps.RUN, named=False)
    chosen = table.choose("train-r1")
    assert chosen.version == first and chosen.tag == "train-r1"
    assert chosen.snapshot.owner == "pretrained_model" and chosen.snapshot.named is False
    assert "held by pretrained_model" in chosen.said
    # a run's first start: no tag yet means the newest, where the caller holds the tag next
    fresh = table.choose("train-r2", or_newest=True)
    assert fresh.version == table.newest().version and fresh.tag is None


def test_a_run_record_reads_its_version_though_the_tag_moved(table):
    first, newest = _first(table), table.newest().version
    table.snapshots.hold("train-r1", first, owner="pretrained_model", kind=snaps.RUN)
    assert table.choose("train-r1", version=first).tag == "train-r1"
    table.snapshots.hold("train-r1", newest, owner="pretrained_model", kind=snaps.RUN)
    moved = table.choose("train-r1", version=first)
    assert moved.version == first and moved.dataset.count_rows() == 200 and moved.tag is None
    assert f"now names version {newest}" in moved.said


def test_an_unknown_tag_names_the_input_the_tags_there_are_and_the_fix(table):
    table.snapshots.hold("train-r1", table.newest().version, owner="pretrained_model")
    with pytest.raises(VersionChoiceError) as err:
        table.choose("no-such-tag")
    text = str(err.value)
    assert "no-such-tag" in text and "train-r1" in text
    assert "Give one of its tags, a version number, or none for the newest" in text


def test_a_version_never_made_names_the_versions_there_are(table):
    newest = table.newest().version
    for ref in (newest + 5, 0, -1):
        with pytest.raises(VersionChoiceError, match=f"version {ref} .* does not exist") as err:
            table.choose(ref)
        assert f"1 to {newest}" in str(err.value) and "none for the newest" in str(err.value)
    with pytest.raises(TypeError):
        table.choose(True)


def test_versions_and_snapshots_the_retention_removed_name_why_and_the_fix(table):
    first = _first(table)
    table.snapshots.hold("train-old", first, owner="pretrained_model", kind=snaps.RUN,
                         named=False)
    ingest(Table.of(table.root), "synthetic:400", rows_per_fragment=100, log=quiet)
    table.snapshots.hold("train-new", table.newest().version, owner="pretrained_model",
                         kind=snaps.RUN, named=False)
    # one unnamed run kept: train-old is released, and its version then cleaned up
    report = maintain(table, keep_versions_for=timedelta(0), keep_unnamed_runs=1, compact=False,
                      optimize_indexes=False, log=quiet)
    assert "train-old" in report.tags_released
    with pytest.raises(VersionChoiceError) as err:
        table.choose("train-old")
    assert "no tag 'train-old'" in str(err.value) and "released" in str(err.value)
    with pytest.raises(VersionChoiceError) as err:  # what the run recorded: (tag, version)
        table.choose("train-old", version=first)
    text = str(err.value)
    assert f"version {first}" in text and "train-old" in text and "was released" in text
    assert "keep_versions_hours" in text and "train-new" in text
    with pytest.raises(VersionChoiceError, match=f"version {first} .* no longer exists"):
        table.choose(first)


def test_the_trainer_resolves_its_tag_through_the_table(table):
    import torch

    from lance_assets.train.collectives import Collectives
    from lance_assets.train.setup import TrainError, pinned_version

    first = _first(table)
    table.snapshots.hold("train-r1", first, owner="pretrained_model")
    comm = Collectives(torch.device("cpu"))
    cfg = SimpleNamespace(table="corpus", table_version=None, table_tag="train-r1")
    assert pinned_version(table, cfg, None, comm) == (first, "train-r1")
    cfg.table_tag = None
    assert pinned_version(table, cfg, None, comm) == (table.newest().version, None)
    cfg.table_tag = "train-gone"
    with pytest.raises(TrainError, match="--table-tag train-gone: .*no tag 'train-gone'"):
        pinned_version(table, cfg, None, comm)
