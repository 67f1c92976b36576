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

from lance_assets.table import Table

WRITERS = ("ingest", "dedup_flag", "token_ids", "quality_signals", "fineweb_signals", "near_dup",
           "embeddings", "detected_language", "personal_data", "paragraph_dups", "contamination",
           "quality_score", "chunk_embeddings", "semantic_dup")  # the table's writers; `forget` too
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
    from lance_assets_tests.helpers import quiet

    if writer == "ingest":
        from lance_assets.ingest.raw_text import ingest
        ingest(Table.of(root), source, rows_per_fragment=128, rows_per_commit=200, log=quiet)
    elif writer == "dedup_flag":
        from lance_assets.curation.dedup_flag import dedup_flag
        dedup_flag(root, fragments_per_commit=1, log=quiet)
    elif writer == "token_ids":
        from lance_assets.tokens.token_ids import token_ids
        token_ids(root, "byte", fragments_per_commit=1, log=quiet)
    elif writer == "quality_signals":
        from lance_assets.curation.quality_signals import quality_signals
        quality_signals(root, fragments_per_commit=1, log=quiet)
    elif writer == "fineweb_signals":
        from lance_assets.fineweb.fineweb_signals import PRODUCER
        from lance_assets.table.producer import produce
        produce(PRODUCER, root, fragments_per_commit=1, log=quiet)
    elif writer == "near_dup":
        from lance_assets.curation.near_dup import near_dup
        near_dup(root, fragments_per_commit=1, log=quiet)
    elif writer == "embeddings":
        from lance_assets.embeddings.embeddings import embeddings
        from lance_assets.testing.embedders import ClusteredEmbedder
        embeddings(root, embedder=ClusteredEmbedder(), fragments_per_commit=1, log=quiet)
    elif writer == "detected_language":
        from lance_assets.curation.detected_language import language_id
        language_id(root, fragments_per_commit=1, log=quiet)
    elif writer == "personal_data":
        from lance_assets.curation.personal_data import pii
        pii(root, fragments_per_commit=1, log=quiet)
    elif writer == "paragraph_dups":
        from lance_assets.curation.paragraph_dups import paragraph_dups
        paragraph_dups(root, fragments_per_commit=1, log=quiet)
    elif writer == "contamination":
        import os.path

        from lance_assets.curation.contamination import EvalSetSpec, contamination
        spec = EvalSetSpec("planted", os.path.join(root, EVAL_SET), "question")
        contamination(root, [spec], fragments_per_commit=1, log=quiet)
    elif writer == "quality_score":  # on a table that already has `embedding`
        from lance_assets.curation.quality_score import quality_score
        quality_score(root, fragments_per_commit=1, log=quiet)
    elif writer == "chunk_embeddings":
        from lance_assets.embeddings.chunk_embeddings import chunk_embeddings
        from lance_assets.testing.embedders import ClusteredEmbedder
        chunk_embeddings(root, chunk_tokens=32, overlap_tokens=8, embedder=ClusteredEmbedder(),
                         fragments_per_commit=1, log=quiet)
    elif writer == "semantic_dup":  # on a table that already has `chunk_embeddings`
        import json

        from lance_assets.curation import semantic_dup as sd
        from lance_assets.table.producer import produce
        given = json.loads(source) if source and source.startswith("{") else {}
        settings = {"rows_per_cluster": 200, "languages": [], **given}
        produce(sd.PRODUCER, root, sd.SemanticDupSettings(**settings), fragments_per_commit=1,
                log=quiet)
    elif writer == "forget":  # SOURCE is the predicate
        from lance_assets.table.forget import forget
        forget(Table.of(root), source, log=quiet)
    else:
        raise SystemExit(f"unknown writer {writer!r}; one of {', '.join(WRITERS)}, forget")


if __name__ == "__main__":
    writer, root, point, n = sys.argv[1:5]
    source = sys.argv[5] if len(sys.argv) > 5 else None
    if point != "none":
        if point not in POINTS:
            raise SystemExit(f"unknown point {point!r}; one of {', '.join(POINTS)}")
        install(point, int(n))
    run(writer, root, source)
