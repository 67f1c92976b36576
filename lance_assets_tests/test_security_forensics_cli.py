"""The forensics CLI on a person's mistakes: one line naming the input and the fix, a non-zero
exit, no traceback. Run as a real process, the way a person runs it."""

import subprocess
import sys

import pytest

from lance_assets.ingest.raw_text import ingest
from lance_assets.table import Table
from lance_assets_tests.helpers import quiet


@pytest.fixture(scope="module")
def bare_root(tmp_path_factory):
    """A table with raw text only: no embeddings, no tokens, no text index."""
    root = tmp_path_factory.mktemp("cli") / "data"
    ingest(Table.of(root), "synthetic:60", rows_per_fragment=60, log=quiet)
    return root


def cli(*args, stdin: bytes | None = None):
    proc = subprocess.run([sys.executable, "-m", "lance_assets.forensics", *map(str, args)],
                          input=stdin, capture_output=True, timeout=300)
    return proc.returncode, proc.stdout.decode(), proc.stderr.decode()


def assert_one_line(rc, out, err, *needles):
    assert rc == 1, (rc, err)
    assert "Traceback" not in err and out == ""
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), err
    for needle in needles:
        assert needle in lines[0], (needle, lines[0])


def test_missing_data_dir(tmp_path):
    assert_one_line(*cli("search", "telescope", "--data", tmp_path / "nowhere"),
                    "No Lance table at", "Materialize `raw_text`")


def test_text_file_that_is_not_utf8(bare_root, tmp_path):
    latin1 = tmp_path / "sample.txt"
    latin1.write_bytes("caf\u00e9 cr\u00e8me".encode("latin-1"))
    assert_one_line(*cli("attribute", "--text-file", latin1, "--data", bare_root),
                    str(latin1), "not UTF-8")
    assert_one_line(*cli("attribute", "--text-file", tmp_path / "absent.txt", "--data", bare_root),
                    "no such file")


def test_near_dups_without_embeddings(bare_root):
    assert_one_line(*cli("near-dups", "--data", bare_root), "no `embedding` column",
                    "materialize `embeddings`")


def test_hostile_filter_is_refused_before_any_search(bare_root):
    assert_one_line(*cli("search", "telescope", "--mode", "text", "--data", bare_root,
                         "--filter", "1=1); DROP TABLE x; --"), "--filter", "';'")
    assert_one_line(*cli("search", "telescope", "--mode", "text", "--data", bare_root,
                         "--filter", "id IN (SELECT 1 FROM read_text('/etc/passwd'))"),
                    "subqueries are not allowed")


def test_unknown_table_version(bare_root):
    assert_one_line(*cli("near-dups", "--version", 999, "--data", bare_root), "--version 999")
