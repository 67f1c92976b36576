"""Each asset that writes columns of the corpus table says which: its materialization's
``dagster/column_schema`` lists exactly the columns it added to the table (compared with the
table's schema before and after that asset alone ran; the write markers ``write_columns`` adds
next to every group are bookkeeping, not the asset's data), with their types and a description each,
the asset definition declares the same columns (the UI shows them before the first run), and
``dagster/column_lineage`` points at real columns of the asset's upstream assets. Assets that
declare no columns add none."""

import dagster as dg
import lance
import pytest

from lance_assets import paths
from lance_assets.definitions import defs
from lance_assets.defs.resources import LanceStore
from lance_assets.table.columns import is_written_marker
from lance_assets.table.producer import producers

# raw_text, and every column producer the library declares (``table.producer.producers``)
COLUMN_ASSETS = {"raw_text", *(p.name for p in producers())}
# In graph order; the BPE `tokenizer` is left out (token_ids runs with the byte tokenizer) to
# keep this fast. Assets that write the table but add no column are run too.
ORDER = ["raw_text", "dedup_flag", "quality_signals", "fineweb_signals", "near_dup", "detected_language",
         "personal_data", "paragraph_dups", "contamination", "opted_out", "token_ids", "text_index",
         "curation_rules", "embeddings", "vector_index", "quality_score", "chunk_embeddings",
         "chunk_index", "semantic_dup"]
RUN_CONFIG = {
    "raw_text": {"rows_per_fragment": 120},
    "token_ids": {"tokenizer": "byte"},
    "embeddings": {"max_tokens": 16},
    "chunk_embeddings": {"chunk_tokens": 16, "overlap_tokens": 4},
}
GRAPH = defs.get_repository_def().asset_graph


def upstream_of(key: dg.AssetKey) -> set[dg.AssetKey]:
    """Every asset ``key`` depends on, directly or through others."""
    seen, todo = set(), [key]
    while todo:
        for parent in GRAPH.get(todo.pop()).parent_keys:
            if parent not in seen:
                seen.add(parent)
                todo.append(parent)
    return seen


def declared_schema(key: str) -> dg.TableSchema | None:
    meta = defs.get_assets_def(key).specs_by_key[dg.AssetKey(key)].metadata
    value = meta.get("dagster/column_schema")
    return getattr(value, "schema", value)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """asset -> (materialization metadata, table columns it added), each asset run alone."""
    store = LanceStore(data_dir=str(tmp_path_factory.mktemp("columns") / "data"),
                       source="synthetic:240")
    uri = paths.table_uri(store.root)
    out = {}
    for key in ORDER:
        before = lance.dataset(uri).schema.names if key != "raw_text" else []
        result = dg.materialize(
            [defs.get_assets_def(key)], resources={"lance_store": store},
            run_config={"ops": {key: {"config": RUN_CONFIG[key]}}} if key in RUN_CONFIG else None)
        assert result.success, key
        (mat,) = result.asset_materializations_for_node(key)
        after = lance.dataset(uri).schema
        added = [(f.name, str(f.type)) for f in after
                 if f.name not in before and not is_written_marker(f.name)]
        out[key] = ({k: v.value for k, v in mat.metadata.items()}, added)
    return out


def test_every_column_asset_declares_its_columns():
    declaring = {k.to_user_string() for k in GRAPH.get_all_asset_keys()
                 if declared_schema(k.to_user_string()) is not None}
    assert declaring == COLUMN_ASSETS
    # the producers of the graph as it was when this test was written are all still there
    assert COLUMN_ASSETS >= {"raw_text", "dedup_flag", "token_ids", "quality_signals", "near_dup",
                             "embeddings", "detected_language", "personal_data",
                             "paragraph_dups", "contamination", "quality_score",
                             "chunk_embeddings"}


@pytest.mark.parametrize("key", ORDER)
def test_column_schema_is_exactly_the_columns_the_asset_added(runs, key):
    meta, added = runs[key]
    if key not in COLUMN_ASSETS:
        assert added == [] and "dagster/column_schema" not in meta
        return
    reported = meta["dagster/column_schema"].columns
    assert [(c.name, c.type) for c in reported] == added
    assert all(c.description and c.description.strip() for c in reported)
    assert [c.name for c in declared_schema(key).columns] == [c.name for c in reported]
    assert [c.description for c in declared_schema(key).columns] == \
        [c.description for c in reported]


@pytest.mark.parametrize("key", sorted(COLUMN_ASSETS - {"raw_text"}))
def test_column_lineage_names_real_upstream_columns(runs, key):
    meta, added = runs[key]
    deps = meta["dagster/column_lineage"].deps_by_column
    assert set(deps) == {name for name, _ in added}
    upstream = upstream_of(dg.AssetKey(key))
    for column, sources in deps.items():
        assert sources, column
        for dep in sources:
            assert dep.asset_key in upstream, (column, dep)
            source = declared_schema(dep.asset_key.to_user_string())
            assert source is not None and dep.column_name in {c.name for c in source.columns}, \
                (column, dep)


@pytest.mark.parametrize("key", sorted(COLUMN_ASSETS - {"raw_text"}))
def test_null_share_of_each_column_is_a_number_dagster_can_plot(runs, key):
    """``null_share/<column>`` for exactly the asset's columns, equal to the share of null values
    pyarrow finds in the table (the assets ran one after another on every row)."""
    meta, added = runs[key]
    shares = {k.split("/", 1)[1]: v for k, v in meta.items() if k.startswith("null_share/")}
    assert set(shares) == {name for name, _ in added}
    table = lance.dataset(meta["dagster/uri"]).to_table(columns=list(shares))
    for column, share in shares.items():
        assert isinstance(share, float) and 0.0 <= share <= 1.0, (column, share)
        assert share == pytest.approx(table[column].null_count / table.num_rows, abs=1e-6), column
