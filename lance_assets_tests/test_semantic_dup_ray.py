"""``semantic_dup`` under ``executor: ray``: the comparison runs as one task per group of
clusters (and the retraining's sampling and re-homing as tasks), the driver holding references
and counts; over increments that retrain the clusters, its columns and side store equal the
single-process run's."""

import dataclasses
import json

import lance
import pytest

from lance_assets import paths
from lance_assets.curation import semantic_dup as sd
from lance_assets.curation import semantic_store as ss
from lance_assets.embeddings import chunk_embeddings
from lance_assets.ingest.raw_text import ingest
from lance_assets.table import Table
from lance_assets.table.producer import produce
from lance_assets.testing.semantic_planted import SynonymBagEmbedder, planted_set
from lance_assets_tests.helpers import quiet

# the worker's one Ray cluster (conftest.ray_cluster), shared with the other Ray modules
pytestmark = pytest.mark.xdist_group("ray")


def test_ray_tasks_per_cluster_group_write_the_local_columns(ray_cluster, tmp_path):
    planted = planted_set(24, 1, 12, seed=21, drop=0.1, synonyms=0.4, shuffle=0.5)
    steps = [planted.texts[:20], planted.texts[20:]]
    settings = sd.SemanticDupSettings(threshold=0.75, rows_per_cluster=4, languages=[])
    got, states, reasons = {}, {}, {}
    for where in ("local", "ray"):
        root = tmp_path / where
        reasons[where] = []
        for n, texts in enumerate(steps):
            src = tmp_path / f"{where}{n}.jsonl"
            src.write_text("".join(json.dumps({"text": t}) + "\n" for t in texts))
            ingest(Table.of(root), str(src), rows_per_fragment=8, log=quiet)
            produce(chunk_embeddings.PRODUCER, Table.of(root),
                    chunk_embeddings.ChunkEmbeddingsSettings(chunk_tokens=64, overlap_tokens=8,
                                                             embedder=SynonymBagEmbedder()),
                    log=quiet)
            report = produce(sd.PRODUCER, Table.of(root), dataclasses.replace(settings, partitions=3),
                             executor=where, log=quiet)
            stats = report.stats
            assert stats.groups == 3
            reasons[where].append(stats.retrained)
        got[where] = lance.dataset(paths.table_uri(root)).to_table(
            columns=["id", *sd.COLUMNS]).sort_by("id")
        side = ss.side_store(Table.of(root))
        state = side.load_state()
        states[where] = {k: v for k, v in state.items()  # a generation is drawn at random, a
                         if k not in ("segments", "generation", "table_sig")}  # file named so
        states[where]["clusters_held"] = {  # each cluster's rows (a generation is drawn at random)
            c: sorted(ids.tolist()) for c, ids in side.cluster_ids(state).items()}
    assert reasons["ray"] == reasons["local"] and reasons["local"][1].startswith("grown")
    assert got["ray"].equals(got["local"])
    assert states["ray"] == states["local"]
    flags = got["ray"].column("semantic_dup").to_pylist()
    assert sum(flags) >= len(planted.copy_of) - 2
