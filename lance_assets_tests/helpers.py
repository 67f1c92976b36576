"""Plain helpers shared by the test modules (and the drivers they start). Test modules import
this, never one another nor ``conftest`` (which keeps only the pytest fixtures); data and
stand-in models that the benchmarks use too live in ``lance_assets.testing``."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq


def quiet(_msg: str) -> None:
    pass


def build_table(root, source: str = "synthetic", *, upto: Sequence[str] = (),
                settings: Mapping[str, Any] | None = None,
                fragments_per_commit: int | None = None, **ingest_args) -> Path:
    """A table at a stage: ``source`` ingested at ``root`` (``ingest_args``: the ingest's own,
    such as ``rows_per_fragment``), then each column producer named in ``upto``, in that order,
    at its settings in ``settings`` (by producer name; the defaults otherwise, but for
    `token_ids`: the byte tokenizer, which the suite's small models train on). Returns
    ``root``."""
    from lance_assets.ingest.raw_text import ingest
    from lance_assets.table import Table
    from lance_assets.table.producer import produce, producers
    from lance_assets.tokens import token_ids

    by_name = {p.name: p for p in producers()}
    chosen = {"token_ids": token_ids.TokenIdsSettings(tokenizer="byte"), **(settings or {})}
    unknown = [name for name in [*upto, *chosen] if name not in by_name]
    if unknown:
        raise ValueError(f"build_table: no column producer is named {unknown}; "
                         f"the producers are {sorted(by_name)}")
    root = Path(root)
    ingest(Table.of(root), source, log=quiet, **ingest_args)
    for name in upto:
        produce(by_name[name], Table.of(root), chosen.get(name),
                fragments_per_commit=fragments_per_commit, log=quiet)
    return root


def write_fineweb_parquet(path, texts, start_id=0, extra=None):
    """A FineWeb-Edu-shaped parquet file: text, id, url, dump, score, int_score, ..."""
    n = len(texts)
    cols = {
        "text": pa.array(texts, pa.string()),
        "id": pa.array([f"<urn:uuid:{start_id + i:08d}>" for i in range(n)]),
        "dump": pa.array(["CC-MAIN-2024-10"] * n),
        "url": pa.array([f"https://site{i % 7}.example/{start_id + i}" for i in range(n)]),
        "score": pa.array([2.5 + (i % 5) / 2 for i in range(n)], pa.float64()),
        "int_score": pa.array([2 + i % 3 for i in range(n)], pa.int64()),
        "language": pa.array(["en"] * n),
    }
    cols.update(extra or {})
    pq.write_table(pa.table(cols), path)
    return path


def processes_mentioning(text: str) -> list[int]:
    """Live (not zombie) processes whose command line contains ``text``."""
    found = []
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            if text in cmdline.read_bytes().replace(b"\0", b" ").decode(errors="replace"):
                status = (cmdline.parent / "stat").read_text().rsplit(")", 1)[1].split()[0]
                if status != "Z":
                    found.append(int(cmdline.parent.name))
        except OSError:
            continue
    return found


def descendants(pid: int) -> list:
    """Every process under ``pid`` now (psutil processes): its ranks, their forkservers, their
    loader workers, the multiprocessing resource trackers."""
    import psutil

    return psutil.Process(pid).children(recursive=True)


def still_running(processes, wait_s: float = 0.0) -> list:
    """Those of ``processes`` (psutil) that are alive and not zombies after up to ``wait_s``."""
    import time

    import psutil

    deadline = time.time() + wait_s
    while True:
        alive = []
        for p in processes:
            try:
                if p.is_running() and p.status() != psutil.STATUS_ZOMBIE:
                    alive.append(p)
            except psutil.NoSuchProcess:
                pass
        if not alive or time.time() >= deadline:
            return alive
        time.sleep(0.2)


def steps_logged(out):
    """step -> its last metrics entry (a resumed run appends to the same file)."""
    path = out / "metrics.jsonl"
    if not path.exists():
        return {}
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return {r["step"]: r for r in rows if "loss" in r}


class WritesAMarker:
    """Unpickling this runs ``Path(marker).touch()``: what a malicious checkpoint would do."""

    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        import pathlib

        return (pathlib.Path.touch, (pathlib.Path(self.marker),))


def held_on_disk(root, ids) -> list[str]:
    """Where a version on disk still holds one of ``ids``: rows it reads, or rows a data file it
    references keeps behind a deletion file (read with Lance's file reader: pages are
    compressed, so no byte search would do)."""
    import lance
    import numpy as np
    from lance.file import LanceFileReader

    from lance_assets import paths
    from lance_assets.table.redact import data_path

    uri = paths.table_uri(root)
    ids = np.asarray(sorted(ids), np.int64)
    found, seen = [], set()
    main = lance.dataset(uri)
    every = [(None, v["version"]) for v in main.versions()] + [
        (b, v["version"]) for b in main.branches.list()
        for v in main.checkout_version((b, None)).versions()]
    for branch, version in every:  # every version of every branch
        try:
            ds = main.checkout_version((branch, version))
            n = ds.count_rows(filter=f"id IN ({','.join(map(str, ids))})")
        except OSError as e:  # a branch's parent manifest, its files cleaned up: reads nothing
            assert "Not found" in str(e) and branch is None
            continue
        if n:
            found.append(f"version {version} of {branch or 'main'} reads them")
        id_field = ds.lance_schema.field("id").id()
        for frag in ds.get_fragments():
            for f in frag.metadata.data_files():
                path = data_path(uri, ds, f, branch)
                if id_field not in f.fields or path in seen:
                    continue
                seen.add(path)
                got = LanceFileReader(path, columns=["id"]).read_all().to_table()
                if np.isin(got.column("id").to_numpy(), ids).any():
                    found.append(f"version {version} of {branch or 'main'}: data file {path}")
    return found
