"""The code is shaped like the graph, and stays so:

- no package of ``lance_assets`` holds more than a quarter of its lines;
- every column producer lives in a library module named after its asset, and every other asset
  is a function of that name in the Dagster layer: one hop from a name to its code;
- ``definitions.py`` keeps no hand list: it imports nothing of ours and loads the defs folder;
- no two Dagster config classes are the same class under two names;
- one settings vocabulary: one ``setting()`` (``table/settings.py``) and one generator of run
  configs from settings dataclasses (``defs/config.py``);
- the producer contract stays small: ``table/producer.py`` exports at most 7 names,
  ``ColumnProducer`` has at most 13 fields, and no step's result is looked up by name;
- no module of ``lance_assets`` is over 650 lines, and no module docstring over 25.
"""

import ast
import dataclasses
import importlib
import inspect
import pkgutil
import re
from pathlib import Path

import dagster as dg

import lance_assets.defs
from lance_assets.definitions import defs
from lance_assets.defs import columns as column_defs
from lance_assets.table import producer as contract
from lance_assets.table.producer import producers

PACKAGE = Path(lance_assets.defs.__file__).resolve().parents[1]
MAX_SHARE = 0.25
MAX_MODULE_LINES = 650
MAX_DOCSTRING_LINES = 25
STEP_BY_NAME = re.compile(r"\brun\.(states|after|reports)\[")


def lines(path: Path) -> int:
    return len(path.read_text().splitlines())


def test_no_package_holds_more_than_a_quarter_of_the_lines():
    total = sum(lines(p) for p in PACKAGE.rglob("*.py"))
    by_package = {d.name: sum(lines(p) for p in d.rglob("*.py"))
                  for d in PACKAGE.iterdir() if d.is_dir() and (d / "__init__.py").exists()}
    assert len(by_package) >= 8, by_package  # table, ingest, curation, tokens, ...
    too_big = {name: round(n / total, 3) for name, n in by_package.items() if n > MAX_SHARE * total}
    assert not too_big, f"packages over {MAX_SHARE:.0%} of {total} lines: {too_big}"


def test_every_asset_is_one_hop_from_its_name():
    made = {p.name: p for p in producers()}
    for key in defs.resolve_asset_graph().get_all_asset_keys():
        name = key.to_user_string()
        if name in made:
            # the PRODUCER of `name` is in lance_assets/<package>/<name>.py
            owner = [m for m in pkgutil.walk_packages([str(PACKAGE)], prefix="lance_assets.")
                     if m.name.rpartition(".")[2] == name and not m.ispkg]
            assert owner, f"{name}: no library module named after it"
            assert getattr(importlib.import_module(owner[0].name), "PRODUCER", None) is made[name]
        else:
            fn = defs.get_assets_def(name).op.compute_fn
            fn = getattr(fn, "decorated_fn", fn)
            assert fn.__name__ == name, f"{name}: its asset function is {fn.__name__}"
            assert Path(inspect.getsourcefile(fn)).is_relative_to(PACKAGE / "defs")


def test_definitions_keep_no_hand_list():
    tree = ast.parse((PACKAGE / "definitions.py").read_text())
    imported = [a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names]
    imported += [n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)]
    assert not [m for m in imported if m and m.startswith("lance_assets")], imported
    assert not [n for n in ast.walk(tree) if isinstance(n, (ast.List, ast.Tuple, ast.Set))]


def config_classes() -> dict[str, type[dg.Config]]:
    """Every ``dg.Config`` class of the Dagster layer: those written in ``defs/`` and those the
    column factory makes, by qualified name."""
    out = {}
    for info in pkgutil.walk_packages(lance_assets.defs.__path__, prefix="lance_assets.defs."):
        module = importlib.import_module(info.name)
        for obj in vars(module).values():
            if (inspect.isclass(obj) and issubclass(obj, dg.Config) and obj.__module__ == info.name):
                out[f"{info.name}.{obj.__name__}"] = obj
    for producer in producers():
        cls = column_defs.column_config(producer)
        if cls not in out.values():  # producers without settings share ColumnConfig itself
            out[f"{producer.name}:{cls.__name__}"] = cls
    return out


def shape(cls: type[dg.Config]) -> tuple:
    return tuple(sorted((name, repr(f.annotation), repr(f.default), f.description or "")
                        for name, f in cls.model_fields.items()))


def test_no_two_config_classes_are_the_same():
    classes = config_classes()
    assert len(classes) > 10
    seen: dict[tuple, str] = {}
    for name, cls in sorted(classes.items()):
        if not cls.model_fields:
            continue
        assert shape(cls) not in seen, f"{name} is the same class as {seen[shape(cls)]}"
        seen[shape(cls)] = name


def test_one_settings_vocabulary():
    """Settings are declared with one ``setting()`` and made into run configs by one
    generator (``defs/config.py``): no second helper, no second ``create_model``."""
    def holding(pattern: str) -> list[str]:
        return sorted(str(p.relative_to(PACKAGE.parent)) for p in PACKAGE.rglob("*.py")
                      if re.search(pattern, p.read_text(), re.M))

    assert holding(r"^def setting\(") == ["lance_assets/table/settings.py"]
    assert holding(r"\bcreate_model\(") == ["lance_assets/defs/config.py"]


def test_every_definition_is_found_once():
    """A defs module refers to another domain's asset by its key (``defs/common.py``), never by
    importing the object: the folder loader would find that object twice."""
    for kind in ("assets", "asset_checks", "jobs", "schedules", "sensors"):
        objects = list(getattr(defs, kind) or [])
        assert len(objects) == len({id(o) for o in objects}), kind


def test_the_package_and_the_project_name_the_same_defs_folder():
    """``lance_assets/dg.toml`` (what an installed package loads its definitions with) says
    what ``pyproject.toml``'s ``[tool.dg]`` (what the ``dg`` CLI reads in the repository) says."""
    import tomllib

    package = tomllib.loads((PACKAGE / "dg.toml").read_text())
    project = tomllib.loads((PACKAGE.parent / "pyproject.toml").read_text())["tool"]["dg"]
    assert package["directory_type"] == project["directory_type"] == "project"
    assert package["project"] == project["project"]
    assert package["project"]["defs_module"] == lance_assets.defs.__name__


def test_the_producer_contract_stays_small():
    assert len(contract.__all__) <= 7, contract.__all__
    assert all(hasattr(contract, name) for name in contract.__all__)
    assert len(dataclasses.fields(contract.ColumnProducer)) <= 13
    by_name = [f"{p.relative_to(PACKAGE.parent)}:{n}" for p in sorted(PACKAGE.rglob("*.py"))
               for n, line in enumerate(p.read_text().splitlines(), 1) if STEP_BY_NAME.search(line)]
    assert not by_name, f"a step's result is handed on as a value, never looked up: {by_name}"


def module_docstring_lines(path: Path) -> int:
    tree = ast.parse(path.read_text())
    first = tree.body[0] if tree.body else None
    if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) \
            and isinstance(first.value.value, str):
        return first.end_lineno - first.lineno + 1
    return 0


def test_no_module_is_over_650_lines():
    too_long = {str(p.relative_to(PACKAGE.parent)): lines(p) for p in PACKAGE.rglob("*.py")
                if lines(p) > MAX_MODULE_LINES}
    assert not too_long, f"modules over {MAX_MODULE_LINES} lines: {too_long}"


def test_no_module_docstring_is_over_25_lines():
    long_docs = {str(p.relative_to(PACKAGE.parent)): module_docstring_lines(p)
                 for p in PACKAGE.rglob("*.py") if module_docstring_lines(p) > MAX_DOCSTRING_LINES}
    assert not long_docs, f"module docstrings over {MAX_DOCSTRING_LINES} lines: {long_docs}"


def test_the_shape_checks_catch_what_they_look_for(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text('"""' + "line\n" * 30 + '"""\nx = run.states["near_dup"]\n')
    assert module_docstring_lines(bad) == 31
    assert STEP_BY_NAME.search(bad.read_text().splitlines()[-1])
    assert not STEP_BY_NAME.search("x = run.state; y = done.reports")
