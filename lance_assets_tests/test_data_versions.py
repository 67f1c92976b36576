"""Data versions change exactly when an asset's own output in the table changed, so Dagster marks
exactly the assets downstream of a change stale:

- each data version names the Lance table version the asset wrote or read (``v<N>-...``);
- a rerun that writes nothing keeps the data version, even after other writers moved the table
  on (their columns are not this asset's output);
- new rows change ``raw_text``'s data version, which makes ``dedup_flag`` stale until it writes
  its column for them; then its data version changes too and it is fresh again;
- an index's data version follows the index (the version it was last updated at), the curation
  rules' the rules in force.
"""

from __future__ import annotations

import dagster as dg
import lance
import pyarrow as pa
import pyarrow.parquet as pq
from dagster._core.definitions.data_version import StaleStatus
from dagster._utils.test.data_versions import get_stale_status_resolver  # what the UI asks

from lance_assets.definitions import defs
from lance_assets.defs.resources import LanceStore
from lance_assets.ingest.synthetic import SyntheticSpec, generate

CONFIG = {"raw_text": {"config": {"rows_per_fragment": 100}}}


def landing_file(folder, name: str, rows: int, seed: int) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    texts = generate(SyntheticSpec(rows=rows, seed=seed, dup_fraction=0.1)).column("text")
    pq.write_table(pa.table({"text": texts}), folder / name)


def test_data_versions_change_exactly_when_the_output_changed(tmp_path):
    landing = tmp_path / "landing"
    landing_file(landing, "a.parquet", rows=150, seed=1)
    store = LanceStore(data_dir=str(tmp_path / "data"), source=str(landing))

    with dg.instance_for_test() as instance:
        def run(*keys: str, config: dict | None = None) -> dict[str, str]:
            """Materialize ``keys`` in one run: asset -> (data version, lance/table_version)."""
            result = dg.materialize([defs.get_assets_def(k) for k in keys], instance=instance,
                                    resources={"lance_store": store},
                                    run_config={"ops": {k: v for k, v in {**CONFIG, **(config or {})}.items()
                                                        if k in keys}})
            assert result.success
            return {k: result.asset_materializations_for_node(k)[0].tags["dagster/data_version"]
                    for k in keys}

        def status(key: str) -> StaleStatus:
            return get_stale_status_resolver(instance, list(defs.assets)).get_status(
                dg.AssetKey(key))

        first = run("raw_text", "dedup_flag")
        table = lance.dataset(store.table_uri)
        assert first["dedup_flag"].startswith(f"v{table.version}-")  # the version it wrote
        assert status("dedup_flag") == StaleStatus.FRESH

        again = run("raw_text", "dedup_flag")  # nothing new, nothing to write
        assert again == first and lance.dataset(store.table_uri).version == table.version

        run("quality_signals")  # another writer: the table moves on, dedup_flag's column does not
        assert lance.dataset(store.table_uri).version > table.version
        assert run("dedup_flag") == {"dedup_flag": first["dedup_flag"]}
        assert status("dedup_flag") == StaleStatus.FRESH

        landing_file(landing, "b.parquet", rows=50, seed=2)
        grown = run("raw_text")
        assert grown["raw_text"] != first["raw_text"]
        assert status("dedup_flag") == StaleStatus.STALE  # the UI marks the column behind
        caught_up = run("dedup_flag")
        assert caught_up["dedup_flag"] != first["dedup_flag"]
        assert caught_up["dedup_flag"].startswith(f"v{lance.dataset(store.table_uri).version}-")
        assert status("dedup_flag") == StaleStatus.FRESH

        # an index: its data version follows the index, not the table
        index = run("text_index")
        run("near_dup")
        assert run("text_index") == index
        landing_file(landing, "c.parquet", rows=40, seed=3)
        run("raw_text")
        assert run("text_index") != index

        # the curation rules: the rules in force, whatever else the table does
        rules = {"curation_rules": {"config": {"rules": {"exact_dup": "NOT is_dup"}}}}
        run("dedup_flag")
        kept = run("curation_rules", config=rules)
        run("quality_signals")
        assert run("curation_rules", config=rules) == kept
        stricter = {"curation_rules": {"config": {"rules": {"exact_dup": "NOT is_dup",
                                                            "long": "n_chars > 200"}}}}
        assert run("curation_rules", config=stricter) != kept
