"""Tables for ``semantic_dup``'s cost as the table grows, made directly: rows on ``topics`` topics
(a few of them near copies), with ``lang``, ``chunk_embeddings`` and, for the rows already there,
the semantic columns and the side store a run would have left (trained on them, one pass, no
comparison), so a table of 320 k rows takes seconds and the next increment is a real run.

The rows already there get an empty ``chunk_embeddings`` (a run never reads an earlier row's
chunks: it reads the side store); new rows get one vector each."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow as pa

from lance_assets import keys
from lance_assets.curation import semantic_clusters as sc
from lance_assets.curation import semantic_dup as sd
from lance_assets.curation import semantic_store as ss
from lance_assets.curation.detected_language import LANG, LANG_SCORE
from lance_assets.embeddings import int8_vectors as iv
from lance_assets.embeddings import vector_files as vf
from lance_assets.embeddings.chunk_embeddings import CHUNK_EMBEDDINGS, to_arrow
from lance_assets.embeddings.embeddings import DIM
from lance_assets.ingest.raw_text import ingest
from lance_assets.table import Table, get_json_config
from lance_assets.table.columns import write_columns

NOISE = 0.9  # a row: its topic's centre plus this much noise (unit vectors, cosine ~0.55)
COPIES = 0.05  # share of rows that are a near copy of an earlier row


def _quiet(_msg: str) -> None:
    pass


def topic_vectors(n: int, topics: int, seed: int, first_id: int) -> np.ndarray:
    """``n`` unit vectors on ``topics`` topics (the same centres for every seed), a share of
    them near copies of an earlier one."""
    centres = np.random.default_rng(12345).standard_normal((topics, DIM)).astype(np.float32)
    rng = np.random.default_rng(seed * 1_000_003 + first_id)
    x = centres[rng.integers(0, topics, n)] + NOISE * rng.standard_normal((n, DIM)).astype(
        np.float32)
    copies = np.flatnonzero(rng.random(n) < COPIES)
    copies = copies[copies > 0]
    x[copies] = x[rng.integers(0, copies)] + 0.1 * rng.standard_normal(
        (len(copies), DIM)).astype(np.float32)
    return x / np.linalg.norm(x, axis=1, keepdims=True)


def _append(root: Path, n: int, first_id: int, tag: str) -> None:
    src = root.parent / f"{root.name}-{tag}.jsonl"
    src.write_text("".join(json.dumps({"text": f"row {first_id + i}"}) + "\n" for i in range(n)))
    ingest(Table.of(root), str(src), rows_per_fragment=8192, log=_quiet)
    src.unlink()


def _lang(frag):
    n = frag.count_rows()
    return [pa.RecordBatch.from_arrays([pa.array(["en"] * n), pa.array(np.ones(n, np.float32))],
                                       schema=pa.schema([LANG, LANG_SCORE]))]


def grown_table(root: Path, rows: int, topics: int = 200, seed: int = 0,
                settings: sd.SemanticDupSettings = sd.SemanticDupSettings()) -> None:  # noqa: B008
    """A table of ``rows`` rows with every column ``semantic_dup`` reads and writes, and its
    side store, as if ``semantic_dup`` had run on them."""
    _append(root, rows, 0, "base")
    write_columns(Table.of(root), [LANG, LANG_SCORE], _lang, log=_quiet)
    empty = to_arrow(np.zeros((0, DIM), np.float32), np.zeros(0, np.int64))

    def no_chunks(frag):
        n = frag.count_rows()
        col = pa.ListArray.from_arrays(pa.array(np.zeros(n + 1, np.int32)), empty.values)
        return [pa.RecordBatch.from_arrays([col], schema=pa.schema([CHUNK_EMBEDDINGS]))]

    write_columns(Table.of(root), [CHUNK_EMBEDDINGS], no_chunks, log=_quiet)
    unit = topic_vectors(rows, topics, seed, 0)
    q = iv.quantize(unit)
    x, inv = iv.as_unit(q)
    x *= inv[:, None]
    k = sc.auto_clusters(rows, settings.rows_per_cluster)
    rate = min(1.0, max(sc.TRAIN_ROWS, sc.TRAIN_ROWS_PER_CLUSTER * k) / rows)
    ids = np.arange(rows, dtype=np.int64)
    sample = sc.hashed_sample(ids, rate, settings.seed)
    centroids = iv.spherical_kmeans(x[sample], k, settings.seed)
    home, best = iv.nearest(x, centroids)
    home = home[:, 0]
    side = ss.side_store(Table.of(root))
    store = side.files
    store.save_centroids(0, centroids)
    segments = {}
    for c in range(len(centroids)):
        sel = home == c
        if sel.any():
            segments[str(c)] = [store.write_segment(0, c, ids[sel], ids[sel], q[sel])]
    side.switch(side.read(), {
        "format": vf.FORMAT, "generation": 0, "first_cluster": 0, "clusters": len(centroids),
        "segments": segments, "rows": rows, "digest": ss.id_digest(ids), "trained_rows": rows,
        "trained_through": rows - 1, "trained_distance": float(np.mean(1 - best[sample])),
        "since_rows": 0, "since_distance": 0.0})

    def semantic(frag):
        t = frag.to_table(columns=["id"])
        i = t.column("id").to_numpy()
        vec = pa.FixedSizeListArray.from_arrays(pa.array(q[i].reshape(-1), pa.int8()), DIM)
        return [pa.RecordBatch.from_arrays(
            [pa.array(home[i]), pa.array(i), pa.array(np.zeros(len(i), np.float32)),
             pa.array(np.zeros(len(i), bool)), vec], schema=pa.schema(sd.FIELDS))]

    write_columns(Table.of(root), sd.FIELDS, semantic, log=_quiet)
    table = Table.of(root)
    chunking = get_json_config(table.newest(), keys.CHUNK_EMBEDDING_KEY)
    table.set_config(keys.SEMANTIC_DUP_KEY, {"settings": settings.to_dict(), "chunking": chunking,
                                             "vector": sd.VECTOR}, log=_quiet)


def add_rows(root: Path, n: int, topics: int = 200, seed: int = 0) -> None:
    """``n`` new rows on the same topics, with ``lang`` and one chunk vector each."""
    first = Table.of(root).newest().count_rows()
    _append(root, n, first, f"new-{first}")
    write_columns(Table.of(root), [LANG, LANG_SCORE], _lang, log=_quiet)
    unit = topic_vectors(n, topics, seed + 1, first)

    def one_chunk(frag):
        i = frag.to_table(columns=["id"]).column("id").to_numpy() - first
        col = to_arrow(unit[i], np.ones(len(i), np.int64))
        return [pa.RecordBatch.from_arrays([col], schema=pa.schema([CHUNK_EMBEDDINGS]))]

    write_columns(Table.of(root), [CHUNK_EMBEDDINGS], one_chunk, log=_quiet)
