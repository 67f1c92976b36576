"""Where per-fragment column work runs: in this process (``local``) or as Ray tasks (``ray``).

``LANCE_ASSETS_EXECUTOR=local|ray`` (default ``local``) picks it; a writer's ``executor=``
argument overrides it. ``ray`` joins the cluster at ``RAY_ADDRESS`` when set, else starts a
local Ray. Nothing here commits: tasks only compute and write new, uncommitted data files, and
the driver commits them (``columns.write_columns``), so a failed task or a killed driver leaves
only unfinished fragments to redo.

What a task receives is pickled: module-level functions, ``functools.partial`` over them and
small dataclasses, never a live dataset or a closure. Workers import this package from the
``py_modules`` of the job's runtime environment, which carries code only: object-store
credentials come from the standard environment variables on each worker, never from the
driver through task arguments.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

EXECUTOR_ENV = "LANCE_ASSETS_EXECUTOR"
EXECUTORS = ("local", "ray")
# Tasks in flight per CPU of the cluster: enough to keep every core busy while the driver
# commits, few enough that finished results (a data file's metadata, or a fragment's MinHash
# payload for near_dup) never pile up in the object store.
IN_FLIGHT_PER_CPU = 2
SYSTEM_RETRIES = 2


def executor_name(requested: str | None = None) -> str:
    """``requested``, else ``LANCE_ASSETS_EXECUTOR``, else ``local``; anything else is refused."""
    name = (requested or os.environ.get(EXECUTOR_ENV) or "local").strip().lower()
    if name not in EXECUTORS:
        raise ValueError(
            f"executor {name!r} (argument or {EXECUTOR_ENV}) is not one of {', '.join(EXECUTORS)}: "
            f"set {EXECUTOR_ENV}=local to compute in this process, or =ray to run Ray tasks "
            "(RAY_ADDRESS to join a cluster)."
        )
    return name


def runtime_env(extra_modules: Sequence[Any] = ()) -> dict:
    """The Ray runtime environment for column tasks: this package (and ``extra_modules``, e.g.
    test helpers) shipped as ``py_modules``, so workers on any cluster run the driver's code.
    No ``env_vars``: secrets stay out of the job's metadata."""
    import lance_assets

    modules = [lance_assets, *extra_modules]
    return {"py_modules": [str(Path(m.__file__).parent) for m in modules]}


def ensure_ray(log: Callable[[str], None] | None = None) -> None:
    """Connect to Ray unless this process already is (a Dagster ``RayResource``, a test)."""
    import ray

    if ray.is_initialized():
        return
    address = os.environ.get("RAY_ADDRESS") or None
    options: dict = {"address": address, "runtime_env": runtime_env(), "log_to_driver": True}
    if address is None:
        options["include_dashboard"] = False
    ray.init(**options)
    if log is not None:
        where = f"the cluster at {address}" if address else "a local Ray"
        log(f"Ray: joined {where} ({ray.cluster_resources().get('CPU', 0):.0f} CPUs, "
            f"{ray.cluster_resources().get('GPU', 0):.0f} GPUs)")


def resolve_partitions(value: int, executor: str, what: str) -> int:
    """A partition count setting: ``value`` itself, or for 0 one per CPU of the Ray cluster
    under the ``ray`` executor and 1 locally. ``what`` names the setting in the error."""
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise ValueError(f"{what}={value!r}: give a whole number >= 1 (or 0 for one per CPU "
                         "of the Ray cluster, 1 locally)")
    if value:
        return value
    if executor != "ray":
        return 1
    import ray

    ensure_ray()
    return max(1, int(ray.cluster_resources().get("CPU", 1)))


def cluster_gpus() -> float:
    import ray

    return float(ray.cluster_resources().get("GPU", 0))


@dataclass
class TaskResult:
    key: Any
    value: Any = None
    error: BaseException | None = None


def _call(fn: Callable[[Any, Any], Any], shared: Any, key: Any) -> Any:
    return fn(shared, key)


def ray_map(fn: Callable[[Any, Any], Any], shared: Any, keys: Iterable[Any], *,
            ordered: bool = False, num_gpus: float = 0, num_cpus: float = 1,
            max_in_flight: int | None = None) -> Iterator[TaskResult]:
    """``fn(shared, key)`` for every key as Ray tasks; results as they finish (``ordered``: in
    key order). ``shared`` goes to the object store once, not once per task. A task that raises
    yields a ``TaskResult`` with ``error`` set; the others go on. Tasks still running when the
    caller stops iterating are cancelled."""
    import ray

    ensure_ray()
    # A worker that dies (OOM, a preempted node) is retried: a task only writes a new,
    # uncommitted file, so running it twice is harmless. An exception in the task is not.
    remote = ray.remote(_call).options(num_gpus=num_gpus, num_cpus=num_cpus,
                                       max_retries=SYSTEM_RETRIES, retry_exceptions=False)
    shared_ref = ray.put(shared)
    keys = list(keys)
    if max_in_flight is None:
        cpus = ray.cluster_resources().get("CPU", 1)
        max_in_flight = max(2, int(cpus * IN_FLIGHT_PER_CPU))
    running: dict = {}  # ObjectRef -> key
    order: list = []  # refs in submission order (ordered mode)
    next_key = 0

    def submit() -> None:
        nonlocal next_key
        while next_key < len(keys) and len(running) < max_in_flight:
            ref = remote.remote(fn, shared_ref, keys[next_key])
            running[ref] = keys[next_key]
            if ordered:
                order.append(ref)
            next_key += 1

    def result(ref) -> TaskResult:
        key = running.pop(ref)
        try:
            return TaskResult(key, ray.get(ref))
        except Exception as exc:  # noqa: BLE001 - handed to the caller, which names the key
            return TaskResult(key, error=_cause(exc))

    try:
        submit()
        while running:
            # a bounded wait: a stop (a cancelled run's exception) lands within a second
            if ordered:
                if not ray.wait([order[0]], num_returns=1, timeout=1.0)[0]:
                    continue
                ref = order.pop(0)
            else:
                ready, _ = ray.wait(list(running), num_returns=1, timeout=1.0)
                if not ready:
                    continue
                ref = ready[0]
            out = result(ref)
            submit()
            yield out
    finally:
        for ref in running:
            ray.cancel(ref)


def _cause(exc: BaseException) -> BaseException:
    """The task's own exception rather than Ray's wrapper, when Ray kept it."""
    cause = getattr(exc, "cause", None)
    return cause if isinstance(cause, BaseException) else exc


# ---------------------------------------------------------------------------- map/reduce steps

def contiguous_groups(spans: dict[int, np.ndarray], groups: int) -> np.ndarray:
    """Cut fragments into ``groups`` contiguous id ranges of about equal rows, from their
    ``(first id, last id, rows)`` spans: the first id of every group but the first (what
    :func:`group_of` takes)."""
    live = sorted((s[0], s[2]) for s in spans.values() if s[2] > 0)
    if groups <= 1 or len(live) <= 1:
        return np.zeros(0, np.int64)
    total = sum(n for _, n in live)
    starts, seen = [], 0
    for first, n in live:
        if seen and seen >= total * (len(starts) + 1) / groups and len(starts) < groups - 1:
            starts.append(first)
        seen += n
    return np.array(starts, np.int64)


def group_of(ids: np.ndarray, starts: np.ndarray) -> np.ndarray:
    """The group of each id, for groups that are contiguous id ranges (``starts``: the first
    id of every group but the first)."""
    return np.searchsorted(starts, ids, side="right").astype(np.int64)


def _run(fn: Callable, returns: int, *args: Any) -> Any:
    out = fn(*args)
    if returns == 1:
        return out[0] if isinstance(out, tuple) else out
    if len(out) != returns:
        raise RuntimeError(f"{getattr(fn, '__name__', fn)!s}: {len(out)} results, {returns} expected")
    return out


class Tasks:
    """Calls a step here or as a Ray task (arguments that are object references reach the task
    as their values), always returning a list of results (values, or references)."""

    def __init__(self, ray_tasks: bool) -> None:
        self.ray = ray_tasks
        self._remote = None

    def __call__(self, fn: Callable, *args: Any, returns: int = 1) -> list:
        if not self.ray:
            out = _run(fn, returns, *args)
            return [out] if returns == 1 else list(out)
        import ray

        if self._remote is None:
            self._remote = ray.remote(_run)
        # a worker that dies is retried (a task writes nothing); an exception is not
        refs = self._remote.options(num_returns=returns, max_retries=SYSTEM_RETRIES,
                                    retry_exceptions=False).remote(fn, returns, *args)
        return [refs] if returns == 1 else list(refs)

    def get(self, values: list) -> list:
        if not self.ray:
            return values
        import ray

        return ray.get(values)

    def put(self, value: Any) -> Any:
        if not self.ray:
            return value
        import ray

        return ray.put(value)


def value_of(x: Any) -> Any:
    """``x``, or its value when it is a Ray object reference (inside a task or the driver)."""
    if type(x).__name__ == "ObjectRef":
        import ray

        return ray.get(x)
    return x
