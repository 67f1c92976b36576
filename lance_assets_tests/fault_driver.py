"""Run one table writer in this process and SIGKILL it at a chosen instruction.

    python -m lance_assets_tests.fault_driver WRITER ROOT POINT N [SOURCE]

SOURCE is ingest's source, ``forget``'s predicate, or ``semantic_dup``'s settings as JSON.

The injection points wrap the calls through which the library changes the table:

- ``before-commit N``: the N-th commit is about to start (a version create, an ``Append`` or
  ``DataReplacement`` commit, an ``add_columns``, a config update, an index build);
- ``during-commit N``: a timer fires a few milliseconds into the N-th commit;
- ``after-commit N``: the N-th commit has returned, before the writer goes on;
- ``files-written N``: the N-th batch of new data files is written but not yet committed;
- ``after-delete N``: the N-th delete has committed (``forget``'s, or any writer's).

Nothing here is imported by the package: the writers run unmodified, only the Lance entry
points are wrapped. Exit status 0 means the point was never reached (the test then fails).
"""

from __future__ import annotations

import functools
import os
import random
import signal
import sys
import threading

import lance
import lance.fragment

MODULES = {  # each column writer: the library module of its producer
    "dedup_flag": "lance_assets.curation.dedup_flag", "token_ids": "lance_assets.tokens.token_ids",
    "quality_signals": "lance_assets.curation.quality_signals",
    "fineweb_signals": "lance_assets.fineweb.fineweb_signals",
    "near_dup": "lance_assets.curation.near_dup", "embeddings": "lance_assets.embeddings.embeddings",
    "detected_language": "lance_assets.curation.detected_language",
    "personal_data": "lance_assets.curation.personal_data",
    "paragraph_dups": "lance_assets.curation.paragraph_dups",
    "contamination": "lance_assets.curation.contamination",
    "quality_score": "lance_assets.curation.quality_score",
    "chunk_embeddings": "lance_assets.embeddings.chunk_embeddings",
    "semantic_dup": "lance_assets.curation.semantic_dup",
}
WRITERS = ("ingest", *MODULES)  # the table's writers; `forget` too
# The evaluation set the contamination writer checks against: a file under the data root (the
# test copies the root, set and all; the set's fingerprint, not its path, names its column).
EVAL_SET = "evalsets/planted.jsonl"
POINTS = ("before-commit", "during-commit", "after-commit", "files-written", "after-delete")


def _die() -> None:
    os.kill(os.getpid(), signal.SIGKILL)


def install(point: str, n: int, seed: int = 0) -> None:
    counts = {"commit": 0, "write": 0, "delete": 0}

    def committing(fn):
        @functools.wraps(fn)
        def inner(*args, **kwargs):
            counts["commit"] += 1
            hit = counts["commit"] == n
            if hit and point == "before-commit":
                _die()
            if hit and point == "during-commit":
                threading.Timer(random.Random(seed).uniform(0.0, 0.01), _die).start()
            out = fn(*args, **kwargs)
            if hit and point == "after-commit":
                _die()
            return out
        return inner

    def writing(fn):
        @functools.wraps(fn)
        def inner(*args, **kwargs):
            out = fn(*args, **kwargs)
            counts["write"] += 1
            if point == "files-written" and counts["write"] == n:
                _die()
            return out
        return inner

    def deleting(fn):
        @functools.wraps(fn)
        def inner(*args, **kwargs):
            out = fn(*args, **kwargs)
            counts["delete"] += 1
            if point == "after-delete" and counts["delete"] == n:
                _die()
            return out
        return inner

    ds_cls = lance.LanceDataset
    ds_cls.delete = deleting(ds_cls.delete)
    ds_cls.commit = staticmethod(committing(ds_cls.commit))
    for name in ("add_columns", "update_config", "drop_columns", "create_scalar_index",
                 "create_index"):
        setattr(ds_cls, name, committing(getattr(ds_cls, name)))
    lance.write_dataset = committing(lance.write_dataset)

    from lance_assets.table import Table

    Table.write_fragments = writing(Table.write_fragments)  # every data file a writer writes


def run(writer: str, root: str, source: str | None) -> None:
    import importlib

    from lance_assets.table import Table
    from lance_assets.table.producer import produce
    from lance_assets_tests.helpers import quiet

    if writer == "ingest":
        from lance_assets.ingest.raw_text import ingest
        ingest(Table.of(root), source, rows_per_fragment=128, rows_per_commit=200, log=quiet)
        return
    if writer == "forget":  # SOURCE is the predicate
        from lance_assets.table.forget import forget
        forget(Table.of(root), source, log=quiet)
        return
    if writer not in WRITERS:
        raise SystemExit(f"unknown writer {writer!r}; one of {', '.join(WRITERS)}, forget")
    module = importlib.import_module(MODULES[writer])
    settings = None
    if writer == "token_ids":
        settings = module.TokenIdsSettings(tokenizer="byte")
    elif writer in ("embeddings", "chunk_embeddings"):
        from lance_assets.testing.embedders import ClusteredEmbedder
        settings = module.EmbeddingsSettings(embedder=ClusteredEmbedder()) \
            if writer == "embeddings" else module.ChunkEmbeddingsSettings(
                chunk_tokens=32, overlap_tokens=8, embedder=ClusteredEmbedder())
    elif writer == "contamination":
        spec = module.EvalSetSpec("planted", os.path.join(root, EVAL_SET), "question")
        settings = module.ContaminationSettings(eval_sets=[spec])
    elif writer == "semantic_dup":  # on a table that already has `chunk_embeddings`
        import json

        given = json.loads(source) if source and source.startswith("{") else {}
        settings = module.SemanticDupSettings(**{"rows_per_cluster": 200, "languages": [],
                                                 **given})
    # quality_score runs on a table that already has `embedding`
    produce(module.PRODUCER, Table.of(root), settings, fragments_per_commit=1, log=quiet)


def main(argv: list[str]) -> None:
    writer, root, point, n = argv[:4]
    source = argv[4] if len(argv) > 4 else None
    if point != "none":
        if point not in POINTS:
            raise SystemExit(f"unknown point {point!r}; one of {', '.join(POINTS)}")
        install(point, int(n))
    run(writer, root, source)


def _child(argv: list[str], cwd: str, log: str) -> None:
    fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.chdir(cwd)
    main(argv)


def killed(argv: list[str], cwd: str, timeout: float = 300) -> tuple[int | None, str]:
    """``main(argv)`` in a process of its own, as ``python -m lance_assets_tests.fault_driver``
    runs it, but forked from a server that imported the writers once (multiprocessing's
    forkserver; it never opens a table, so its forks are safe): (exit code, its output)."""
    import multiprocessing
    import tempfile

    ctx = multiprocessing.get_context("forkserver")
    ctx.set_forkserver_preload(["lance_assets_tests.fault_driver", "lance_assets_tests.helpers",
                                "lance_assets.ingest.raw_text", "lance_assets.table.forget",
                                "lance_assets.testing.embedders", *MODULES.values()])
    with tempfile.TemporaryDirectory() as tmp:
        log = os.path.join(tmp, "out.txt")
        proc = ctx.Process(target=_child, args=(argv, cwd, log))
        proc.start()
        proc.join(timeout)
        if proc.is_alive():
            proc.kill()
            proc.join()
        with open(log, errors="replace") as out:
            return proc.exitcode, out.read()


if __name__ == "__main__":
    main(sys.argv[1:])
