"""A new column is one file: docs/write-a-tagger.md's code, saved as the only change to a copy of
the package, becomes an asset with its config, check, column schema and automation, and writes
the values a plain-Python reference gives; ``corpus_profile`` follows it, and ``curation_rules``
does when the configured rules name it.
"""

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
DOC = REPO / "docs" / "write-a-tagger.md"

TEXTS = [
    "Plain prose.\nNo code here at all.",
    "A loop:\n    for i in range(3):\n        print(i)\n    done()\nend",
    "Two lines only:\n    x = 1\n\ty = 2\n",
    "\tone\n    two\n    three\n    \n    four",
    "    \n\t\nindented blanks are not code",
]

SCRIPT = r"""
import json, sys
import dagster as dg
import lance_assets
assert lance_assets.__file__.startswith(sys.argv[1]), lance_assets.__file__
from lance_assets.definitions import defs
from lance_assets.defs.resources import LanceStore
from lance_assets.table import Table

graph = defs.resolve_asset_graph()
key = dg.AssetKey("has_code")
asset = defs.get_assets_def("has_code")
spec = asset.specs_by_key[key]
config_fields = sorted(asset.op.config_schema.as_field().config_type.fields)
checks = sorted(c.name for c in defs.asset_checks for c in c.check_keys if c.asset_key == key)
store = LanceStore(data_dir=sys.argv[2], source=sys.argv[3])
result = dg.materialize(
    [defs.get_assets_def("raw_text"), asset], resources={"lance_store": store},
    run_config={"ops": {"has_code": {"config": {"min_lines": 2, "fragments_per_commit": 1}}}})
meta = {k: v.value for k, v in result.asset_materializations_for_node("has_code")[0].metadata.items()}
rows = Table.of(sys.argv[2]).newest().to_table(columns=["text", "code_lines", "has_code"]).to_pylist()
print(json.dumps({
    "parents": sorted(k.to_user_string() for k in graph.get(key).parent_keys),
    "rules_parents": sorted(k.to_user_string() for k in graph.get(dg.AssetKey("curation_rules")).parent_keys),
    "profile_parents": sorted(k.to_user_string()
                              for k in graph.get(dg.AssetKey("corpus_profile")).parent_keys),
    "group": spec.group_name, "pool": asset.op.pool, "automation": spec.automation_condition is not None,
    "columns": [c.name for c in spec.metadata["dagster/column_schema"].columns],
    "config_fields": config_fields, "checks": checks,
    "rows_written": meta["rows_written"], "rows_with_code": meta["rows_with_code"],
    "rows": rows,
}))
"""


def doc_code() -> str:
    """The walk-through's one ```python block."""
    blocks = re.findall(r"```python\n(.*?)```", DOC.read_text(), re.S)
    assert len(blocks) == 1, "docs/write-a-tagger.md holds exactly one python block: the file"
    return blocks[0]


def reference(text: str) -> int:
    return sum(bool(re.match(r"^(    |\t)\S", line)) for line in text.split("\n"))


def test_the_walkthrough_tagger_is_one_file_and_a_working_asset(tmp_path):
    copy = tmp_path / "src"
    shutil.copytree(REPO / "lance_assets", copy / "lance_assets",
                    ignore=shutil.ignore_patterns("__pycache__"))
    (copy / "lance_assets" / "curation" / "has_code.py").write_text(doc_code())
    # the copy differs from the package by that file alone (and, like an installed wheel, has no
    # pyproject.toml above it: the package's own dg.toml names its defs folder)
    ours = {p.relative_to(REPO).as_posix() for p in (REPO / "lance_assets").rglob("*")
            if p.is_file() and "__pycache__" not in p.parts}
    theirs = {p.relative_to(copy).as_posix() for p in (copy / "lance_assets").rglob("*")
              if p.is_file()}
    assert theirs - ours == {"lance_assets/curation/has_code.py"} and ours == theirs - \
        {"lance_assets/curation/has_code.py"}

    source = tmp_path / "docs.jsonl"
    source.write_text("".join(json.dumps({"text": t}) + "\n" for t in TEXTS))
    # a rules file that names the new column puts it on the path to training
    rules_file = tmp_path / "rules.json"
    rules_file.write_text(json.dumps({"exact_dup": "NOT is_dup", "no_code": "NOT has_code"}))
    env = {**os.environ, "PYTHONPATH": str(copy), "DAGSTER_HOME": str(tmp_path / "home"),
           "LANCE_LOG": "error", "LANCE_ASSETS_RULES": str(rules_file)}
    (tmp_path / "home").mkdir()
    done = subprocess.run([sys.executable, "-c", SCRIPT, str(copy), str(tmp_path / "data"),
                           str(source)], env=env, cwd=tmp_path, capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0, done.stderr[-4000:]
    out = json.loads(done.stdout.strip().splitlines()[-1])

    assert out["parents"] == ["raw_text"] and out["group"] == "curation"
    assert "has_code" in out["rules_parents"]  # the rules that name it wait for it
    assert "has_code" in out["profile_parents"]  # the profile follows every curation column
    assert out["pool"] == "lance_corpus" and out["automation"]
    assert out["columns"] == ["code_lines", "has_code"]
    assert {"executor", "fragments_per_commit", "min_lines"} <= set(out["config_fields"])
    assert out["checks"] == ["columns_written"]
    assert out["rows_written"] == len(TEXTS)
    by_text = {r["text"]: r for r in out["rows"]}
    for text in TEXTS:
        want = reference(text)
        assert by_text[text]["code_lines"] == want, text
        assert by_text[text]["has_code"] == (want >= 2), text
    assert out["rows_with_code"] == sum(reference(t) >= 2 for t in TEXTS) == 3


def test_the_steps_excerpt_is_the_real_declaration():
    """The page's abridged multi-step producer (its ```py block) is ``dedup_flag``'s code: every
    line it shows, bar the elisions, is a line of that file."""
    blocks = re.findall(r"```py\n(.*?)```", DOC.read_text(), re.S)
    assert len(blocks) == 1
    source = {line.strip() for line in
              (REPO / "lance_assets" / "curation" / "dedup_flag.py").read_text().splitlines()}
    shown = [line.strip() for line in blocks[0].splitlines()
             if line.strip() and "..." not in line and line.strip() != ")"]
    assert len(shown) >= 10
    assert [line for line in shown if line not in source] == []


def test_the_walkthrough_tagger_fits_one_screen_and_takes_at_most_three_library_names():
    """The page's file is short enough to read at once, and the contract it needs is small."""
    import ast

    code = doc_code()
    assert len(code.splitlines()) <= 50
    names = [a.name for n in ast.walk(ast.parse(code)) if isinstance(n, ast.ImportFrom)
             and (n.module or "").startswith("lance_assets") for a in n.names]
    assert 1 <= len(names) <= 3, names
