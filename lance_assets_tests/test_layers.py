"""The layers of docs/architecture.md, checked on the source: every module of the package is
parsed (``ast``) and its imports collected, those inside functions included.

- No import cycle among our modules, counting function-level imports: an import moved into a
  function to dodge a cycle is still a cycle.
- The Dagster domains (``defs/ingest``, ``defs/tokens``, ``defs/curation``, ``defs/embeddings``,
  ``defs/forensics``, ``defs/table``, ``defs/training``) import ``defs/common``,
  ``defs/config``, ``defs/metadata``, ``defs/resources``, ``defs/executor``,
  ``defs/conditions`` and the library, never one another.
- The library (everything outside ``defs/`` and ``definitions.py``) imports neither ``dagster``
  nor ``lance_assets.defs``; the trainer may use ``dagster_pipes``.
- No module imports another module's ``_private`` name.
- The table layer (``table/``) is the bottom of the library: it imports only itself and the
  foundation modules (``storage``, ``paths``, ``progress``, ``keys``, ``markdown``,
  ``std_streams``), which import only each other; and the packages of ``lance_assets`` import
  one another without a cycle (a module cycle is not needed for a layer cycle:
  ``table.forget`` importing ``curation.rules``, which imports ``table``, is one).
- No private API of another package: no ``from pkg import _name`` or ``import pkg._mod`` of a
  third-party package, no function's globals rebound, no ``_private`` attribute that no code of
  ours defines. The one module allowed to reach inside a dependency (``ADAPTERS``) says in its
  docstring what it relies on and checks it.
- Below the edges (the command lines, ``defs/``, the trainer's entry point) a table argument is
  a ``Table``: no library parameter is typed as a ``Table`` or a string or path.
- Every library package has a face, its ``__init__``'s ``__all__``, and imports across packages
  go through it (``through_a_face``): ``from lance_assets.P import name`` with ``name`` in the
  face; ``from lance_assets.P import mod``, ``import lance_assets.P.mod`` or ``from
  lance_assets.P.mod import anything`` with ``mod`` in the face (a public submodule); or ``from
  lance_assets.P.mod import name`` with ``name`` in the face and taken by P's ``__init__`` from
  ``P.mod``. A subpackage in the face is walked the same way, one level down. ``defs/``,
  ``definitions.py`` and the top-level modules are outside every package.
"""

import ast
from dataclasses import dataclass
from pathlib import Path

import pytest

PACKAGE_DIR = Path(__file__).resolve().parents[1] / "lance_assets"
DOMAINS = ("ingest", "tokens", "curation", "embeddings", "forensics", "table", "training")
SHARED_DEFS = {"lance_assets.defs", "lance_assets.defs.common", "lance_assets.defs.config",
               "lance_assets.defs.metadata", "lance_assets.defs.resources",
               "lance_assets.defs.executor", "lance_assets.defs.conditions"}
DAGSTER_APP = ("lance_assets.defs", "lance_assets.definitions")


@dataclass(frozen=True)
class Import:
    importer: str
    target: str  # a module (ours: resolved to the module, not the package, where possible)
    names: tuple[str, ...]  # `from target import names`
    in_function: bool
    line: int


def module_name(path: Path, root: Path = PACKAGE_DIR) -> str:
    parts = [root.name, *path.relative_to(root).with_suffix("").parts]
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def parse_imports(path: Path, known: set[str], root: Path = PACKAGE_DIR) -> list[Import]:
    """Every import statement of ``path``; ``from pkg import mod`` counts as importing
    ``pkg.mod`` when that is one of the ``known`` modules."""
    me = module_name(path, root)
    package = me if path.name == "__init__.py" else me.rpartition(".")[0]
    tree = ast.parse(path.read_text(), str(path))
    out: list[Import] = []

    def visit(node: ast.AST, in_function: bool) -> None:
        for child in ast.iter_child_nodes(node):
            nested = in_function or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef,
                                                       ast.Lambda))
            if isinstance(child, ast.Import):
                out.extend(Import(me, a.name, (), in_function, child.lineno) for a in child.names)
            elif isinstance(child, ast.ImportFrom):
                base = child.module or ""
                if child.level:
                    up = package.split(".")[: len(package.split(".")) - child.level + 1]
                    base = ".".join([*up, base] if base else up)
                for alias in child.names:
                    sub = f"{base}.{alias.name}"
                    if sub in known:
                        out.append(Import(me, sub, (), in_function, child.lineno))
                    else:
                        out.append(Import(me, base, (alias.name,), in_function, child.lineno))
            visit(child, nested)

    visit(tree, False)
    return out


def package_imports(root: Path = PACKAGE_DIR) -> list[Import]:
    files = sorted(root.rglob("*.py"))
    known = {module_name(f, root) for f in files}
    return [imp for f in files for imp in parse_imports(f, known, root)]


def find_cycle(edges: dict[str, set[str]]) -> list[str] | None:
    """One cycle of the directed graph ``edges`` as [a, b, ..., a], or None."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def dfs(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(edges.get(node, ())):
            if state.get(nxt) == 1:
                return path[path.index(nxt):] + [nxt]
            if nxt not in state and (found := dfs(nxt)):
                return found
        path.pop()
        state[node] = 2
        return None

    for start in sorted(edges):
        if start not in state and (found := dfs(start)):
            return found
    return None


def internal_edges(imports: list[Import], known: set[str]) -> dict[str, set[str]]:
    """importer -> our modules it imports (package ``__init__`` edges left out when the
    import names a submodule: importing ``a.b.c`` runs ``a/b/__init__`` first, which is no
    dependency of ``a.b.c``'s code)."""
    edges: dict[str, set[str]] = {}
    for imp in imports:
        if imp.target in known and imp.target != imp.importer:
            edges.setdefault(imp.importer, set()).add(imp.target)
    return edges


IMPORTS = package_imports()
KNOWN = {module_name(f) for f in PACKAGE_DIR.rglob("*.py")}


def domain_of(module: str) -> str | None:
    parts = module.split(".")
    if parts[:2] == ["lance_assets", "defs"] and len(parts) > 2 and parts[2] in DOMAINS:
        return parts[2]
    return None


def is_library(module: str) -> bool:
    return not any(module == m or module.startswith(m + ".") for m in DAGSTER_APP)


def where(imp: Import) -> str:
    how = "inside a function" if imp.in_function else "at module level"
    return f"{imp.importer} imports {imp.target} {how} (line {imp.line})"


def test_the_walk_sees_the_whole_package():
    assert {"lance_assets.tokens.token_ids", "lance_assets.defs.ingest.assets",
            "lance_assets.train.trainer", "lance_assets.keys"} <= KNOWN
    assert any(i.in_function for i in IMPORTS), "function-level imports are not collected"


def test_no_import_cycle_even_through_function_level_imports():
    cycle = find_cycle(internal_edges(IMPORTS, KNOWN))
    assert cycle is None, "import cycle: " + " -> ".join(cycle)


def test_cycle_finder_finds_a_cycle_hidden_in_a_function(tmp_path):
    pkg = tmp_path / "lance_assets"
    (pkg / "corpus").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "corpus" / "__init__.py").write_text("")
    (pkg / "corpus" / "a.py").write_text("from lance_assets.corpus.b import f\n")
    (pkg / "corpus" / "b.py").write_text("def f():\n    from lance_assets.corpus import a\n")
    imports = package_imports(pkg)
    known = {module_name(f, pkg) for f in pkg.rglob("*.py")}
    assert find_cycle(internal_edges(imports, known)) == [
        "lance_assets.corpus.a", "lance_assets.corpus.b", "lance_assets.corpus.a"]


@pytest.mark.parametrize("domain", DOMAINS)
def test_dagster_domains_do_not_import_each_other(domain):
    sideways = [where(i) for i in IMPORTS
                if domain_of(i.importer) == domain
                and i.target.startswith("lance_assets.defs")
                and domain_of(i.target) not in (None, domain)]
    unshared = [where(i) for i in IMPORTS
                if domain_of(i.importer) == domain and i.target.startswith("lance_assets.defs")
                and domain_of(i.target) is None and i.target not in SHARED_DEFS]
    assert not sideways and not unshared, sideways + unshared


def test_library_and_trainer_never_import_dagster_or_the_definitions():
    bad = [where(i) for i in IMPORTS if is_library(i.importer) and (
        i.target == "dagster" or i.target.startswith("dagster.")
        or not is_library(i.target))]
    assert not bad, bad
    trainer = [i for i in IMPORTS if i.importer.startswith("lance_assets.train")]
    assert trainer and not [where(i) for i in trainer if i.target.split(".")[0] == "dagster"]


def test_no_module_imports_another_modules_private_names():
    private = [f"{where(i)}: {n}" for i in IMPORTS for n in i.names
               if n.startswith("_") and not n.startswith("__") and i.target in KNOWN]
    assert not private, private


# The tests package is no library: the wheel leaves ``lance_assets_tests`` out, so the package
# and the benchmarks never import it (shared fixtures live in ``lance_assets.testing``), and a
# test module imports ``lance_assets_tests.helpers`` or a driver, never another test module nor
# ``conftest`` (pytest's fixtures file, imported by pytest alone).

REPO_DIR = PACKAGE_DIR.parent
TESTS_PACKAGE = "lance_assets_tests"


def imported_names(path: Path, root: Path) -> list[tuple[int, list[str]]]:
    """(line, dotted names) of every import statement of ``path``, inside functions too,
    relative imports resolved against its package under ``root``; ``from a import b`` names
    ``a`` and ``a.b`` (``b`` may be a module)."""
    me = module_name(path, root)
    package = me if path.name == "__init__.py" else me.rpartition(".")[0]
    out: list[tuple[int, list[str]]] = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out.extend((node.lineno, [a.name]) for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*up, base] if base else up)
            out.append((node.lineno, [base, *(f"{base}.{a.name}" for a in node.names)]))
    return sorted(out)


def is_in_tests_package(name: str) -> bool:
    return name == TESTS_PACKAGE or name.startswith(TESTS_PACKAGE + ".")


def imports_of_the_tests_package(roots: list[Path]) -> list[str]:
    """Every import of ``lance_assets_tests`` (or of a module in it) by a file under ``roots``."""
    return [f"{f.relative_to(root.parent)}:{line} imports {names[-1]}"
            for root in roots for f in sorted(root.rglob("*.py"))
            for line, names in imported_names(f, root)
            if any(is_in_tests_package(n) for n in names)]


def is_test_module_or_conftest(name: str) -> bool:
    parts = name.split(".")
    if parts[0] == TESTS_PACKAGE:  # lance_assets_tests.test_x / .conftest (and what is in them)
        parts = parts[1:]
    elif len(parts) > 1:  # another package's module named test_*: not ours
        return False
    return bool(parts) and (parts[0] == "conftest" or parts[0].startswith("test_"))


def imports_of_test_modules(files: list[Path], tests_dir: Path) -> list[str]:
    """Every import of a ``test_*`` module or of ``conftest`` by one of ``files`` (modules of
    ``tests_dir``; ``from .conftest``, ``from lance_assets_tests import test_x`` included)."""
    return [f"{f.name}:{line} imports {names[-1]}"
            for f in files for line, names in imported_names(f, tests_dir)
            if any(is_test_module_or_conftest(n) for n in names)]


def test_neither_the_package_nor_the_benchmarks_import_the_tests_package():
    roots = [PACKAGE_DIR, REPO_DIR / "benchmarks"]
    assert all(any(r.rglob("*.py")) for r in roots)
    bad = imports_of_the_tests_package(roots)
    assert not bad, "the wheel has no lance_assets_tests (fixtures go in lance_assets.testing): " + \
        "; ".join(bad)


def test_no_test_module_imports_another_test_module_or_conftest():
    tests_dir = Path(__file__).resolve().parent
    files = sorted(tests_dir.glob("test_*.py"))
    assert len(files) > 10
    bad = imports_of_test_modules(files, tests_dir)
    assert not bad, "shared helpers go in lance_assets_tests/helpers.py: " + "; ".join(bad)


def test_drivers_and_helpers_import_no_test_module_either():
    tests_dir = Path(__file__).resolve().parent
    files = [f for f in sorted(tests_dir.glob("*.py"))
             if not f.name.startswith("test_") and f.name != "conftest.py"]
    assert any(f.name == "fault_driver.py" for f in files)
    bad = imports_of_test_modules(files, tests_dir)
    assert not bad, bad


def test_the_tests_package_checks_catch_every_spelling(tmp_path):
    lib = tmp_path / "lance_assets"
    (lib / "sub").mkdir(parents=True)
    (lib / "__init__.py").write_text("")
    (lib / "sub" / "__init__.py").write_text("")
    (lib / "sub" / "ok.py").write_text("from lance_assets.testing import longdocs\nimport lance\n")
    (lib / "sub" / "a.py").write_text("from lance_assets_tests.curation_reference import x\n")
    (lib / "sub" / "b.py").write_text("import os\ndef f():\n    import lance_assets_tests.multilingual\n")
    (lib / "c.py").write_text("from lance_assets_tests import pii_planted\n")
    bad = imports_of_the_tests_package([lib])
    assert [b.split(" imports ")[0] for b in bad] == [
        "lance_assets/c.py:1", "lance_assets/sub/a.py:1", "lance_assets/sub/b.py:3"]

    tests = tmp_path / "lance_assets_tests"
    tests.mkdir()
    (tests / "__init__.py").write_text("")
    (tests / "test_fine.py").write_text(
        "import lance_assets_tests\nfrom lance_assets_tests.helpers import quiet\n"
        "from lance_assets_tests.fault_driver import run\nfrom lance_assets.testing import x\n"
        "from hypothesis import strategies\nimport other.test_thing\n")
    (tests / "test_bad.py").write_text(
        "from lance_assets_tests.conftest import quiet\n"
        "from .conftest import quiet\n"
        "from . import test_fine\n"
        "from lance_assets_tests import conftest\n"
        "def f():\n    from lance_assets_tests.test_fine import ClusteredEmbedder\n"
        "import lance_assets_tests.test_fine\n")
    bad = imports_of_test_modules(sorted(tests.glob("test_*.py")), tests)
    assert [b.split(" imports ")[0] for b in bad] == [f"test_bad.py:{n}" for n in (1, 2, 3, 4, 6, 7)]


# ---- layers: the table layer at the bottom, packages without cycles

TABLE_LAYER = "lance_assets.table"
FOUNDATION = {"lance_assets", "lance_assets.storage", "lance_assets.paths", "lance_assets.progress",
              "lance_assets.std_streams",
              "lance_assets.keys", "lance_assets.markdown"}


def in_package(module: str, package: str) -> bool:
    return module == package or module.startswith(package + ".")


def is_ours(module: str) -> bool:
    return in_package(module, "lance_assets")


def upward_imports(imports: list[Import], layer: str, allowed: set[str]) -> list[str]:
    """Imports by the modules of package ``layer`` of our modules outside ``layer`` and
    ``allowed``."""
    return [where(i) for i in imports if in_package(i.importer, layer) and is_ours(i.target)
            and not in_package(i.target, layer) and i.target not in allowed]


def package_of(module: str) -> str:
    """The package of ``lance_assets`` a module belongs to (``lance_assets.table.core`` ->
    ``lance_assets.table``); a top-level module is its own."""
    return ".".join(module.split(".")[:2])


def package_edges(imports: list[Import]) -> dict[str, set[str]]:
    edges: dict[str, set[str]] = {}
    for i in imports:
        if is_ours(i.target) and i.target != "lance_assets":
            a, b = package_of(i.importer), package_of(i.target)
            if a != b:
                edges.setdefault(a, set()).add(b)
    return edges


def test_the_table_layer_imports_nothing_above_it():
    assert any(i.importer.startswith(TABLE_LAYER + ".") for i in IMPORTS)
    bad = upward_imports(IMPORTS, TABLE_LAYER, FOUNDATION)
    assert not bad, ("table/ sits below ingest, curation, train...: move what it needs down or "
                     "pass it in: " + "; ".join(bad))


def test_the_foundation_modules_import_only_each_other():
    bad = [where(i) for i in IMPORTS if i.importer in FOUNDATION and is_ours(i.target)
           and i.target not in FOUNDATION]
    assert not bad, bad


def test_no_import_cycle_between_packages():
    cycle = find_cycle(package_edges(IMPORTS))
    assert cycle is None, "packages import each other in a cycle: " + " -> ".join(cycle)


def test_the_layer_checks_catch_an_upward_import_and_a_package_cycle(tmp_path):
    pkg = tmp_path / "lance_assets"
    for sub in ("table", "curation"):
        (pkg / sub).mkdir(parents=True)
        (pkg / sub / "__init__.py").write_text("")
    (pkg / "__init__.py").write_text("")
    (pkg / "storage.py").write_text("import os\n")
    (pkg / "table" / "core.py").write_text("from lance_assets import storage\n")
    (pkg / "table" / "forget.py").write_text(
        "from lance_assets.table import core\ndef f():\n    from lance_assets.curation import rules\n")
    (pkg / "curation" / "rules.py").write_text("from lance_assets.table.core import x\n")
    imports = package_imports(pkg)
    known = {module_name(f, pkg) for f in pkg.rglob("*.py")}
    assert find_cycle(internal_edges(imports, known)) is None  # no module cycle...
    assert find_cycle(package_edges(imports)) == [  # ...but a layer cycle
        "lance_assets.curation", "lance_assets.table", "lance_assets.curation"]
    assert upward_imports(imports, TABLE_LAYER, FOUNDATION) == [
        "lance_assets.table.forget imports lance_assets.curation.rules inside a function (line 3)"]


# ---- no private API of another package

ADAPTERS = {"lance_assets.train.streaming_adapter", "lance_assets.table.lance_manifest"}
"""Modules allowed to reach inside a dependency, each naming in its docstring what it relies on
and checking it (a test fails the day the dependency changes it)."""
REBINDING = {"__globals__", "__code__", "__closure__", "FunctionType"}

OUTSTANDING: dict[tuple[str, str], str] = {}
"""Private attributes of other packages still used outside ``ADAPTERS``: each is an open issue
(replace it with public API, or move it into an adapter that checks it). The list may only
shrink: a new one fails, and so does an entry that is gone."""


def is_private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def private_imports_of_other_packages(imports: list[Import]) -> list[str]:
    out = []
    for i in imports:
        if is_ours(i.target) or i.target == "__future__":
            continue
        private = [p for p in i.target.split(".") if is_private(p)]
        private += [n for n in i.names if is_private(n)]
        if private:
            out.append(f"{where(i)}: {', '.join(private)}")
    return out


def module_trees(root: Path = PACKAGE_DIR) -> dict[str, ast.Module]:
    return {module_name(f, root): ast.parse(f.read_text(), str(f)) for f in sorted(root.rglob("*.py"))}


def defined_names(trees: dict[str, ast.Module]) -> set[str]:
    """Every name our code defines: functions, classes, arguments, imports, assignments."""
    names: set[str] = set()
    for tree in trees.values():
        for n in ast.walk(tree):
            if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                names.add(n.name)
            elif isinstance(n, ast.arg):
                names.add(n.arg)
            elif isinstance(n, ast.alias):
                names.add((n.asname or n.name).split(".")[0])
            elif isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store):
                names.add(n.id)
            elif isinstance(n, ast.Attribute) and isinstance(n.ctx, ast.Store):
                names.add(n.attr)
    return names


def private_uses_of_other_packages(trees: dict[str, ast.Module]) -> set[tuple[str, str]]:
    """(module, name) of every ``x._name`` our code does not define, and every
    ``super()._name`` of a method only the calling class defines (an override of another
    package's private method), outside ``ADAPTERS``."""
    mine = {m: t for m, t in trees.items() if m not in ADAPTERS}
    ours = defined_names(mine)
    methods: dict[str, int] = {}
    for tree in mine.values():
        for n in ast.walk(tree):
            if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)):
                methods[n.name] = methods.get(n.name, 0) + 1
    out = set()
    for module, tree in mine.items():
        for n in ast.walk(tree):
            if not (isinstance(n, ast.Attribute) and is_private(n.attr)):
                continue
            base = n.value
            is_super = (isinstance(base, ast.Call) and isinstance(base.func, ast.Name)
                        and base.func.id == "super")
            if n.attr not in ours or (is_super and methods.get(n.attr) == 1):
                out.add((module, n.attr))
    return out


def rebinding_outside_adapters(trees: dict[str, ast.Module]) -> list[str]:
    return [f"{module}:{n.lineno} uses {getattr(n, 'attr', getattr(n, 'id', ''))}"
            for module, tree in trees.items() if module not in ADAPTERS for n in ast.walk(tree)
            if (isinstance(n, ast.Attribute) and n.attr in REBINDING)
            or (isinstance(n, ast.Name) and n.id in REBINDING)]


TREES = module_trees()


def test_no_private_name_of_another_package_is_imported():
    bad = private_imports_of_other_packages(IMPORTS)
    assert not bad, "use the package's public API, or an adapter (ADAPTERS): " + "; ".join(bad)


def test_no_function_of_another_package_is_rebound_outside_the_adapters():
    assert ADAPTERS <= set(TREES)
    bad = rebinding_outside_adapters(TREES)
    assert not bad, bad


def test_the_private_attributes_of_other_packages_in_use_are_only_the_known_ones():
    found = private_uses_of_other_packages(TREES)
    assert not found - set(OUTSTANDING), f"new private API of another package: {found - set(OUTSTANDING)}"
    assert not set(OUTSTANDING) - found, f"fixed, remove from OUTSTANDING: {set(OUTSTANDING) - found}"


def test_the_adapters_say_what_they_rely_on():
    for module in ADAPTERS:
        doc = ast.get_docstring(TREES[module]) or ""
        assert "relies on" in doc and "test" in doc, module


def test_the_private_api_checks_catch_every_spelling(tmp_path):
    pkg = tmp_path / "lance_assets"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "ok.py").write_text(
        "from __future__ import annotations\nfrom lancedb.streaming import StreamingDataset\n"
        "class Mine:\n    def _go(self):\n        return self._x\n    def __init__(self):\n"
        "        self._x = 1\n"
        "def f(m):\n    return m._go()\n")
    (pkg / "bad.py").write_text(
        "from lancedb.streaming import _EPOCH_PRIME\nimport lancedb._lancedb\n"
        "from lance.dataset import LanceDataset\n"
        "def f(ds):\n    return ds._take_rows([1])\n"
        "def g(fn):\n    return fn.__globals__\n"
        "class C(LanceDataset):\n    def _hook(self):\n        return super()._hook()\n")
    imports = package_imports(pkg)
    assert [b.split(": ")[1] for b in private_imports_of_other_packages(imports)] == [
        "_EPOCH_PRIME", "_lancedb"]
    trees = module_trees(pkg)
    assert private_uses_of_other_packages(trees) == {("lance_assets.bad", "_take_rows"),
                                                     ("lance_assets.bad", "_hook")}
    assert rebinding_outside_adapters(trees) == ["lance_assets.bad:7 uses __globals__"]


# -- one contract for every column producer: the table layer pins, writes and commits

CONTRACT_VERBS = {"write_columns", "pinned"}
"""What only ``table/`` calls: ``write_columns(...)`` and ``<table>.pinned(...)``. A producer
declares ``compute`` or ``steps`` (``table/producer.py``) and ``produce`` pins and writes."""
CONTRACT_EXEMPT = ("lance_assets.table", "lance_assets.ingest")
"""The table layer itself, and ingest (it appends rows, it writes no column)."""
OWN_WRITES: set[str] = set()
"""Producers that still pin and write themselves (``write=``). The list may only shrink: a new
one fails, and so does an entry that follows the contract now."""


def contract_calls(trees: dict[str, ast.Module]) -> dict[str, list[str]]:
    """``{module: ["line: verb", ...]}`` of the calls to ``write_columns`` (by name or as an
    attribute) and to a ``.pinned`` method outside ``CONTRACT_EXEMPT``."""
    out: dict[str, list[str]] = {}
    for module, tree in trees.items():
        if any(in_package(module, p) for p in CONTRACT_EXEMPT):
            continue
        for n in ast.walk(tree):
            if not isinstance(n, ast.Call):
                continue
            f = n.func
            name = f.id if isinstance(f, ast.Name) else f.attr if isinstance(f, ast.Attribute) \
                else None
            if name == "write_columns" or (name == "pinned" and isinstance(f, ast.Attribute)):
                out.setdefault(module, []).append(f"{n.lineno}: {name}")
    return out


def test_no_module_outside_the_table_layer_pins_or_writes_columns_itself():
    found = contract_calls(TREES)
    assert not set(found) - OWN_WRITES, (
        "declare the producer's compute or steps and let produce() pin and write: "
        f"{ {m: v for m, v in found.items() if m not in OWN_WRITES} }")
    assert not OWN_WRITES - set(found), f"follows the contract now, remove from OWN_WRITES: " \
                                        f"{OWN_WRITES - set(found)}"


def test_the_contract_check_catches_every_spelling(tmp_path):
    pkg = tmp_path / "lance_assets"
    (pkg / "table").mkdir(parents=True)
    (pkg / "ingest").mkdir()
    for d in (pkg, pkg / "table", pkg / "ingest"):
        (d / "__init__.py").write_text("")
    (pkg / "table" / "producer.py").write_text("def f(t, c):\n    return t.pinned(c)\n")
    (pkg / "ingest" / "raw_text.py").write_text("def f(t, c):\n    return t.pinned(c)\n")
    (pkg / "ok.py").write_text("def f(p, t):\n    return produce(p, t), t.pinned\n")
    (pkg / "bad.py").write_text(
        "from lance_assets.table import columns\nfrom lance_assets.table.columns import "
        "write_columns\n"
        "def f(t, c):\n    return write_columns(t, [], c)\n"
        "def g(t, c):\n    return columns.write_columns(t, [], c)\n"
        "def h(t, w):\n    return t.pinned(w, what='x')\n")
    assert contract_calls(module_trees(pkg)) == {
        "lance_assets.bad": ["4: write_columns", "6: write_columns", "8: pinned"]}


# Where a string becomes the table (``Table.of``): the command lines, the Dagster layer, the
# trainer's entry point. Below them the library takes a ``Table``.
EDGES = ("lance_assets.defs", "lance_assets.definitions", "lance_assets.__main__",
         "lance_assets.forensics.__main__", "lance_assets.train.__main__",
         "lance_assets.train.trainer")
PATH_TYPES = {"str", "PathLike", "Path", "Location", "UPath"}


def annotation_names(annotation: ast.expr) -> set[str]:
    """The type names an annotation mentions, string annotations (``"Table | str"``) included."""
    names: set[str] = set()
    for n in ast.walk(annotation):
        if isinstance(n, ast.Name):
            names.add(n.id)
        elif isinstance(n, ast.Attribute):
            names.add(n.attr)
        elif isinstance(n, ast.Constant) and isinstance(n.value, str):
            try:
                names |= annotation_names(ast.parse(n.value, mode="eval").body)
            except SyntaxError:
                pass
    return names


def table_or_path_parameters(trees: dict[str, ast.Module]) -> dict[str, list[str]]:
    """module -> ``line: function(parameter)`` of every library parameter typed as a ``Table``
    or a string or path; ``Table.of``, the one resolver, aside."""
    out: dict[str, list[str]] = {}
    for module, tree in trees.items():
        if any(in_package(module, edge) for edge in EDGES):
            continue
        for n in ast.walk(tree):
            if not isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            if module == "lance_assets.table.handle" and n.name == "of":
                continue
            params = [*n.args.posonlyargs, *n.args.args, *n.args.kwonlyargs]
            for p in params:
                names = annotation_names(p.annotation) if p.annotation is not None else set()
                if "Table" in names and names & PATH_TYPES:
                    out.setdefault(module, []).append(f"{n.lineno}: {n.name}({p.arg})")
    return out


def test_below_the_edges_a_table_argument_is_a_table():
    found = table_or_path_parameters(TREES)
    assert not found, ("take a Table and let the caller resolve a string with Table.of at the "
                       f"edge (the CLI, defs/, the trainer's entry): {found}")


def test_the_table_argument_check_catches_every_spelling(tmp_path):
    pkg = tmp_path / "lance_assets"
    (pkg / "table").mkdir(parents=True)
    (pkg / "defs").mkdir()
    for d in (pkg, pkg / "table", pkg / "defs"):
        (d / "__init__.py").write_text("")
    (pkg / "table" / "handle.py").write_text(
        "class Table:\n    def of(cls, where: 'Table | str | None' = None): ...\n")
    (pkg / "defs" / "assets.py").write_text("def a(root: Table | str): ...\n")
    (pkg / "ok.py").write_text("def f(table: Table, root: str | Path): ...\n")
    (pkg / "bad.py").write_text(
        "import os\nfrom typing import Union\n"
        "def f(table: Union[Table, str, os.PathLike]): ...\n"
        "def g(x, *, table: 'Table | str'): ...\n"
        "class C:\n    def __init__(self, root: Table | Path): ...\n")
    assert table_or_path_parameters(module_trees(pkg)) == {
        "lance_assets.bad": ["3: f(table)", "4: g(table)", "6: __init__(root)"]}


# ---- package faces: what a package offers the others is its ``__init__``'s ``__all__``

def library_packages(root: Path = PACKAGE_DIR) -> list[Path]:
    """Every package folder of the library (subpackages included), ``defs/`` left out."""
    return [init.parent for init in sorted(root.rglob("__init__.py"))
            if init.parent != root and not in_package(module_name(init, root),
                                                      f"{root.name}.defs")]


def face_of(package: Path, root: Path = PACKAGE_DIR) -> dict[str, str] | None:
    """``{name: where it comes from}`` for every name of the package's ``__all__`` (None when it
    has none): a submodule or subpackage maps to itself, a name its ``__init__`` imports to the
    module it imports it from, a name the ``__init__`` defines to the package, and a name bound
    nowhere to ``""``."""
    init = package / "__init__.py"
    me = module_name(init, root)
    tree = ast.parse(init.read_text(), str(init))
    listed = None
    bound: dict[str, str] = {}
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(
                isinstance(t, ast.Name) and t.id == "__all__" for t in node.targets):
            listed = [e.value for e in node.value.elts]  # a literal list of strings
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join([*me.split(".")[: len(me.split(".")) - node.level + 1], base])
            bound.update({a.asname or a.name: base for a in node.names})
        elif isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            bound[node.name] = me
        elif isinstance(node, ast.Assign):
            bound.update({t.id: me for t in node.targets if isinstance(t, ast.Name)})
    if listed is None:
        return None
    submodules = {p.stem for p in package.glob("*.py")} | {
        p.parent.name for p in package.glob("*/__init__.py")}
    return {n: f"{me}.{n}" if n in submodules else bound.get(n, "") for n in listed}


def faces(root: Path = PACKAGE_DIR) -> dict[str, dict[str, str] | None]:
    return {module_name(p / "__init__.py", root): face_of(p, root) for p in library_packages(root)}


def face_problems(faces_: dict[str, dict[str, str] | None]) -> list[str]:
    """A face that is missing, names a private name, or names what its package does not hold."""
    out = []
    for package, face in faces_.items():
        if face is None:
            out.append(f"{package}: its __init__ has no __all__")
            continue
        out += [f"{package}: {n} is private" for n in face if n.startswith("_") and n != "__version__"]
        out += [f"{package}: {n} is neither a submodule nor bound in its __init__"
                for n, origin in face.items() if not origin]
    return out


def through_a_face(imp: Import, faces_: dict[str, dict[str, str] | None]) -> bool:
    """Whether ``imp`` (of a module of a library package, by a module outside that package) goes
    through the faces, walked from the top package down: at each package, the next part of the
    path, or each imported name where the path ends, is in the face; a submodule in the face
    offers all of its public names; ``from P.mod import name`` is allowed where ``name`` is in
    P's face and P's ``__init__`` takes it from ``P.mod``."""
    parts = imp.target.split(".")
    package, rest = ".".join(parts[:2]), parts[2:]
    while True:
        face = faces_.get(package) or {}
        if not rest:  # the package itself: its names, or the package as a namespace
            return all(n in face for n in imp.names)
        head = f"{package}.{rest[0]}"
        if face.get(rest[0]) == head:  # a public submodule or subpackage
            if head not in faces_:
                return True
            package, rest = head, rest[1:]
            continue
        return len(rest) == 1 and bool(imp.names) and all(face.get(n) == head for n in imp.names)


def imports_around_the_faces(imports: list[Import], faces_: dict[str, dict[str, str] | None]
                             ) -> list[str]:
    """Every import of a library package's module by a module of another package (``defs/``,
    ``definitions.py`` and the top-level modules are outside every package) that does not go
    through the package's face."""
    tops = {p for p in faces_ if p.count(".") == 1}
    out = []
    for i in imports:
        top = package_of(i.target)
        if top in tops and (i.target != top or i.names):
            if package_of(i.importer) != top and not through_a_face(i, faces_):
                out.append(f"{where(i)}: {', '.join(i.names) or 'the module'}")
    return out


FACES = faces()


def test_every_library_package_has_a_face():
    assert {"lance_assets.table", "lance_assets.curation", "lance_assets.forensics.diff",
            "lance_assets.train"} <= set(FACES)
    assert not any(p.startswith("lance_assets.defs") for p in FACES)
    bad = face_problems(FACES)
    assert not bad, "; ".join(bad)


def test_imports_across_packages_go_through_the_faces():
    """A module of package P is another package's to import only as P's ``__init__`` offers it
    in ``__all__`` (see ``through_a_face``): a name other packages may use goes in the face, a
    name used only inside P stays out."""
    bad = imports_around_the_faces(IMPORTS, FACES)
    assert not bad, ("import it through the package's face, or add it to the face (its "
                     "__init__'s __all__) if other packages may use it: " + "; ".join(bad))


def test_the_face_checks_catch_every_spelling(tmp_path):
    pkg = tmp_path / "lance_assets"
    for sub in ("table", "curation", "forensics/diff", "defs/corpus"):
        (pkg / sub).mkdir(parents=True, exist_ok=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "defs" / "__init__.py").write_text("")
    (pkg / "defs" / "corpus" / "__init__.py").write_text("")
    (pkg / "table" / "__init__.py").write_text(
        "from lance_assets.table.handle import Table\n__all__ = ['Table', 'columns', 'gone']\n")
    for mod in ("handle", "columns", "core"):
        (pkg / "table" / f"{mod}.py").write_text("from lance_assets.table.core import x\n")
    (pkg / "curation" / "__init__.py").write_text("from .rules import training_filter\n")
    (pkg / "curation" / "rules.py").write_text("from lance_assets.table import Table\n")
    (pkg / "forensics" / "__init__.py").write_text("__all__ = ['diff', '_hidden']\n")
    (pkg / "forensics" / "diff" / "__init__.py").write_text(
        "from lance_assets.forensics.diff.core import diff\n__all__ = ['diff']\n")
    (pkg / "forensics" / "diff" / "core.py").write_text("from lance_assets.table import core\n")
    (pkg / "defs" / "corpus" / "assets.py").write_text(
        "from lance_assets.table import Table, columns\n"
        "from lance_assets.table.handle import Table\n"
        "from lance_assets.table.columns import anything\n"
        "import lance_assets.table.columns\n"
        "from lance_assets.forensics.diff import diff\n"
        "from lance_assets.forensics.diff.core import diff\n"
        "from lance_assets.curation import rules\n"
        "from lance_assets.table.core import x\n"
        "from lance_assets.table.handle import other\n"
        "def f():\n    from lance_assets.forensics.diff.core import helper\n")
    faces_ = faces(pkg)
    assert sorted(faces_) == ["lance_assets.curation", "lance_assets.forensics",
                              "lance_assets.forensics.diff", "lance_assets.table"]
    assert face_problems(faces_) == [
        "lance_assets.curation: its __init__ has no __all__",
        "lance_assets.forensics: _hidden is private",
        "lance_assets.forensics: _hidden is neither a submodule nor bound in its __init__",
        "lance_assets.table: gone is neither a submodule nor bound in its __init__"]
    bad = imports_around_the_faces(package_imports(pkg), faces_)
    assert [b.split(" imports ")[1] for b in bad] == [
        "lance_assets.curation.rules at module level (line 7): the module",
        "lance_assets.table.core at module level (line 8): x",
        "lance_assets.table.handle at module level (line 9): other",
        "lance_assets.forensics.diff.core inside a function (line 11): helper",
        "lance_assets.table.core at module level (line 1): the module"]
