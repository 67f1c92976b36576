"""Fixtures shared by the test modules, and how the suite spreads over the cores.

``make test`` runs the suite with pytest-xdist on every core (``-n auto --dist loadgroup``). Each
worker is one pytest process: session fixtures here are built once per worker, in the worker's
own temporary folder. How the work is split (docs/testing.md):

- **A module is one unit of work** (its module fixtures are built once), but for tests marked
  ``pytest.mark.xdist_group(...)``: ``ray`` (the modules that share the worker's one Ray cluster)
  and ``timing`` (timing-sensitive races, the browser: never beside each other).
- **The most expensive units start first** (``UNIT_SECONDS``, measured), so no long test starts
  last and keeps one core busy while the other idles.
- **Each worker gets its share of the cores** for torch's OpenMP pool, whose threads spin while
  they wait: two workers with a pool the size of the machine each ran one test for over ten
  minutes instead of one. A test that pins more threads (``test_ablation_power``) finds them
  waiting passively.
"""

from __future__ import annotations

import os

import pytest

from lance_assets.table import Table
from lance_assets_tests.helpers import build_table, quiet

os.environ.setdefault("LANCE_LOG", "error")

WORKERS = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
if WORKERS > 1:  # before torch is imported anywhere in this worker
    _share = str(max(1, len(os.sched_getaffinity(0)) // WORKERS))
    for _var, _value in (("OMP_NUM_THREADS", _share), ("MKL_NUM_THREADS", _share),
                         ("OMP_WAIT_POLICY", "PASSIVE")):
        os.environ.setdefault(_var, _value)

# Seconds a unit of work (a module, or a named group) took on one of three workers on the 2-core
# machine (docs/testing.md). Only the order matters: units not named here cost little and run
# after these.
UNIT_SECONDS = {
    "test_ablation_power": 250, "timing": 200, "test_mixture_search": 200,
    "test_object_storage": 130, "ray": 125, "test_multinode": 110, "test_seeds": 110,
    "test_resume": 45, "test_one_version": 90, "test_concurrency": 65, "test_snapshots": 65,
    "test_automation": 65, "test_mixture_loader": 60, "test_train": 55, "test_ablation": 50,
    "test_cancel": 45, "test_faults": 30, "test_shared_permutation": 30,
    "test_column_metadata": 25, "test_forensics_reformatted": 25, "test_embedding_backends": 20,
    "test_security_forensics_cli": 20, "test_collectives": 20, "test_curation_rules": 18,
    "test_graph": 40, "test_data_versions": 18, "test_curation_assets": 16,
    "test_scale_paths": 14, "test_incremental": 12, "test_diff": 12, "test_forget_faults": 12,
    "test_readme_commands": 9,
    "test_forensics_attribution": 9, "test_source_columns": 6, "test_training_data_summary": 6,
    "test_source_shares": 4, "test_opted_out": 2,
}


def _unit(item: pytest.Item) -> str:
    marker = item.get_closest_marker("xdist_group")
    if marker is not None:
        return marker.args[0] if marker.args else marker.kwargs["name"]
    return item.module.__name__.rsplit(".", 1)[-1]


def pytest_collection_modifyitems(config, items):
    """The units go out most expensive first (pytest-xdist keeps this order with
    ``--no-loadscope-reorder``); a module's own order is kept."""
    position: dict[str, int] = {}
    for item in items:
        position.setdefault(_unit(item), len(position))
    items.sort(key=lambda item: (-UNIT_SECONDS.get(_unit(item), 0), position[_unit(item)]))


def pytest_xdist_make_scheduler(config, log):
    """``--dist loadgroup`` with a module as the unit of work of every test outside a named group
    (pytest-xdist's own makes each such test a unit, building module fixtures once per worker)."""
    if config.getvalue("dist") != "loadgroup":
        return None
    from xdist.scheduler import LoadGroupScheduling

    class ModuleOrGroupScheduling(LoadGroupScheduling):
        def _split_scope(self, nodeid: str) -> str:
            scope = super()._split_scope(nodeid)
            return scope if scope != nodeid else nodeid.split("::", 1)[0]

    return ModuleOrGroupScheduling(config, log)


def pytest_collection_finish(session):
    """pytest-xdist tags a grouped test's id with ``@group`` (then the scheduler keeps the group on
    one worker); when it cannot (a pytest it does not know), say so instead of running groups
    side by side."""
    grouped = [i for i in session.items if i.get_closest_marker("xdist_group") is not None]
    if getattr(session.config.option, "loadgroup", False) and grouped and "@" not in grouped[0].nodeid:
        raise pytest.UsageError(
            f"pytest-xdist did not tag {grouped[0].nodeid} with its group: this pytest "
            f"({pytest.__version__}) and pytest-xdist do not work together for --dist loadgroup; "
            "keep pytest to the versions pyproject.toml's dev extra allows (make setup)")


@pytest.fixture
def root(tmp_path):
    return tmp_path / "data"


@pytest.fixture(scope="session")
def tokenized_root(tmp_path_factory):
    """A small synthetic corpus, deduplicated, curated (quality signals and near-duplicate
    flags, so the default training filter, the curation rules, applies) and byte-tokenized
    (shared, read-only)."""
    return build_table(tmp_path_factory.mktemp("tokenized") / "data", "synthetic:1500",
                       rows_per_fragment=500,
                       upto=["dedup_flag", "quality_signals", "near_dup", "token_ids"])


@pytest.fixture(scope="session")
def bpe_root(tmp_path_factory):
    """The demo corpus (synthetic, 2,000 docs), deduplicated, with a BPE trained on it and no
    token columns yet (shared: copy it before writing)."""
    from lance_assets.tokens.bpe import train_bpe

    root = build_table(tmp_path_factory.mktemp("bpe") / "data", "synthetic",
                       rows_per_fragment=500, upto=["dedup_flag"])
    train_bpe(Table.of(root), log=quiet)
    return root


_RAY: dict[str, str] = {}  # the GCS address while this worker's Ray runs


@pytest.fixture
def ray_cluster():
    """The worker's one local Ray, sized to its share of the machine, for every module of the
    ``ray`` group; its workers import this package and the tests'. Returns the GCS address.
    Started by the group's first test that needs it and stopped after the group's last test
    (``pytest_runtest_teardown``): an idle Ray costs a few CPU-seconds a minute."""
    ray = pytest.importorskip("ray")
    if "address" not in _RAY:
        import lance_assets_tests
        from lance_assets.table import executor

        cpus = max(2, len(os.sched_getaffinity(0)) // WORKERS)
        ray.init(num_cpus=cpus, include_dashboard=False, log_to_driver=False,
                 runtime_env=executor.runtime_env([lance_assets_tests]))
        _RAY["address"] = ray.get_runtime_context().gcs_address
    return _RAY["address"]


def pytest_runtest_teardown(item, nextitem):
    """Ray stops once the worker's next test is outside the ``ray`` group (a group's tests run
    one after another on one worker)."""
    if "address" in _RAY and (nextitem is None or _unit(nextitem) != "ray"):
        import ray

        ray.shutdown()
        del _RAY["address"]


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    """With ``LANCE_ASSETS_TEST_TIMELINE=FILE``: one line per test (worker, start, end, id, CPU
    seconds of the worker, CPU seconds of the processes it waited for), appended to FILE, to see
    which units run beside which, which one ends the suite and where the CPU goes."""
    path = os.environ.get("LANCE_ASSETS_TEST_TIMELINE")
    if not path:
        yield
        return
    import time

    start = time.time()
    t0 = os.times()
    yield
    t1 = os.times()
    cpu = t1.user + t1.system - t0.user - t0.system
    kids = t1.children_user + t1.children_system - t0.children_user - t0.children_system
    worker = os.environ.get("PYTEST_XDIST_WORKER", "main")
    with open(path, "a") as out:
        out.write(f"{worker}\t{start:.1f}\t{time.time():.1f}\t{item.nodeid}\t{cpu:.1f}\t{kids:.1f}\n")
