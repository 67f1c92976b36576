"""The learned quality score: a ridge head on `embedding` that beats the mean on held-out rows,
a model file named by its hash and loaded without pickle, new rows scored with the same model,
a retrain that re-scores everything, and a corpus without labels that is skipped, not failed."""

import json

import lance
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from lance_assets import keys, paths
from lance_assets.curation import quality_score as qm
from lance_assets.embeddings import embeddings as embed
from lance_assets.ingest.raw_text import ingest
from lance_assets.table import Table, get_json_config
from lance_assets.table.producer import Skip, produce
from lance_assets.testing.embedders import FeatureEmbedder
from lance_assets_tests.helpers import quiet


def embedded_table(root, rows="synthetic:800"):
    ingest(Table.of(root), rows, rows_per_fragment=200, log=quiet)
    produce(embed.PRODUCER, Table.of(root), embed.EmbeddingsSettings(embedder=FeatureEmbedder()),
            fragments_per_commit=2, log=quiet)


def test_the_head_beats_the_mean_on_held_out_rows_and_is_saved_by_hash(tmp_path):
    root = tmp_path / "data"
    embedded_table(root)
    report = produce(qm.PRODUCER, Table.of(root), qm.QualityScoreSettings(ridge=0.1), log=quiet)
    held = report.model["heldout"]
    assert report.trained and held["rows"] > 50
    assert held["mae"] < 0.75 * held["mae_of_mean_baseline"], held
    assert held["f1"] > 0.7 and held["accuracy"] > 0.7, held

    ds = lance.dataset(paths.table_uri(root))
    stored = get_json_config(ds, keys.QUALITY_MODEL_KEY)
    assert stored["sha256"] == report.model["sha256"] and stored["heldout"] == held
    path = paths.data_dir(root) / stored["path"]
    doc = json.loads(path.read_bytes())  # plain JSON: numbers, no code
    assert path.stem == report.model["sha256"] and doc["format"] == qm.FORMAT
    # the column is the head applied to every row's embedding
    t = ds.to_table(columns=["embedding", "quality_score"])
    x = t.column("embedding").combine_chunks().values.to_numpy().reshape(t.num_rows, -1)
    want = x.astype(np.float64) @ np.array(doc["weights"]) + doc["bias"]
    assert np.allclose(t.column("quality_score").to_numpy(), want, atol=1e-5)

    path.write_bytes(path.read_bytes().replace(b'"ridge"', b'"Ridge"'))
    with pytest.raises(qm.QualityModelError, match="corrupt"):
        qm.load_head(Table.of(root), report.model["sha256"])


def test_new_rows_use_the_stored_model_and_a_retrain_rescores_every_row(tmp_path):
    root = tmp_path / "data"
    embedded_table(root, "synthetic:400")
    first = produce(qm.PRODUCER, Table.of(root), log=quiet)
    ingest(Table.of(root), "synthetic:200", rows_per_fragment=200, log=quiet)  # a second source unit
    produce(embed.PRODUCER, Table.of(root), embed.EmbeddingsSettings(embedder=FeatureEmbedder()), log=quiet)
    more = produce(qm.PRODUCER, Table.of(root), log=quiet)
    assert not more.trained and more.model["sha256"] == first.model["sha256"]
    assert more.rows_written == 200 and more.fragments_already_done == 2
    assert produce(qm.PRODUCER, Table.of(root), log=quiet).nothing_to_do

    with pytest.raises(qm.QualityModelError, match="retrain: true"):
        produce(qm.PRODUCER, Table.of(root), qm.QualityScoreSettings(ridge=5.0), log=quiet)
    again = produce(qm.PRODUCER, Table.of(root), qm.QualityScoreSettings(ridge=5.0, retrain=True),
                    log=quiet)
    assert again.trained and again.model["sha256"] != first.model["sha256"]
    assert again.rows_written == 600  # every row scored by the new model
    stored = get_json_config(lance.dataset(paths.table_uri(root)), keys.QUALITY_MODEL_KEY)
    assert stored["sha256"] == again.model["sha256"] and stored["ridge"] == 5.0


def test_a_corpus_without_labels_is_skipped_and_says_why(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    pq.write_table(pa.table({"text": [f"document {i} about rivers" for i in range(120)]}),
                   src / "a.parquet")
    root = tmp_path / "data"
    ingest(Table.of(root), str(src), log=quiet)
    with pytest.raises(qm.QualityModelError, match="materialize `embeddings`"):
        produce(qm.PRODUCER, Table.of(root), log=quiet)
    produce(embed.PRODUCER, Table.of(root), embed.EmbeddingsSettings(embedder=FeatureEmbedder()), log=quiet)
    report = produce(qm.PRODUCER, Table.of(root), log=quiet)
    assert isinstance(report, Skip) and "labelled training rows" in report.reason
    assert "quality_score" not in lance.dataset(paths.table_uri(root)).schema.names
    with pytest.raises(qm.QualityModelError, match="not a number"):
        produce(qm.PRODUCER, Table.of(root), qm.QualityScoreSettings(label="text"), log=quiet)


def test_the_held_out_split_depends_on_the_id_only():
    ids = np.arange(100_000, dtype=np.int64)
    mask = qm.heldout_mask(ids)
    assert 0.09 < mask.mean() < 0.11
    assert np.array_equal(qm.heldout_mask(ids[::-1]), mask[::-1])
    assert np.array_equal(qm.heldout_mask(ids[5000:6000]), mask[5000:6000])
