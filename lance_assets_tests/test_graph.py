"""The whole asset graph, in-process, on a temporary data dir; training through Pipes + torchrun."""

import contextlib
import io
import json
from datetime import timedelta

import dagster as dg
import lance
import numpy as np

from lance_assets import paths
from lance_assets.__main__ import main as cli
from lance_assets.definitions import defs
from lance_assets.defs.curation.checks import CHECKS
from lance_assets.defs.resources import LanceStore
from lance_assets.defs.tokens.checks import CHECKS as TOKENS_CHECKS
from lance_assets.defs.training.checks import CHECKS as TRAINING_CHECKS
from lance_assets.defs.training.torchrun import TorchrunPipesClient
from lance_assets.table import Table
from lance_assets.table.maintenance import maintain
from lance_assets_tests.helpers import held_on_disk


def test_materialize_whole_graph(tmp_path):
    root = tmp_path / "data"
    assets = [defs.get_assets_def(k) for k in
              ("raw_text", "dedup_flag", "tokenizer", "token_ids", "pretrained_model", "samples",
               "quality_signals", "near_dup", "curation_rules", "training_data_summary")]
    run_config = {"ops": {
        "raw_text": {"config": {"rows_per_fragment": 200}},
        "pretrained_model": {"config": {"steps": 20, "seq_len": 64, "batch_size": 8,
                                        "eval_every": 10, "ckpt_every": 10, "nproc_per_node": 1}},
        "samples": {"config": {"prompts": ["The", ""], "max_new_tokens": 16}},
    }}
    resources = {"lance_store": LanceStore(data_dir=str(root), source="synthetic:600"),
                 "pipes_subprocess_client": TorchrunPipesClient()}
    instance = dg.DagsterInstance.ephemeral()  # the second training run below compares with it
    result = dg.materialize([*assets, *CHECKS, *TOKENS_CHECKS, *TRAINING_CHECKS],
                            resources=resources, run_config=run_config, instance=instance)
    assert result.success

    def meta(key):
        mats = result.asset_materializations_for_node(key)
        assert len(mats) == 1
        return {k: v.value for k, v in mats[0].metadata.items()}

    ds = lance.dataset(paths.table_uri(root))
    assert {"text", "is_dup", "input_ids", "n_tokens", "n_bytes"} <= set(ds.schema.names)
    raw, dup, tok = meta("raw_text"), meta("dedup_flag"), meta("token_ids")
    assert raw["rows_added"] == 600 and raw["dagster/row_count"] == 600 and raw["fragments_added"] == 3
    assert raw["lance/table_version"] < dup["lance/table_version"] < tok["lance/table_version"]
    assert meta("curation_rules")["lance/table_version"] == ds.version  # the last writer
    evaluations = {e.check_name: e for e in result.get_asset_check_evaluations()}
    # and raw_text's own non-blocking check, evaluated with its materialization
    assert len(evaluations) == len(CHECKS) + len(TOKENS_CHECKS) + len(TRAINING_CHECKS) + 1
    assert evaluations["files_ingested"].description == "every file was read"
    assert all(e.passed for e in evaluations.values())  # training was not blocked
    # a fresh instance has nothing to compare with, and says so
    assert "no previous tokenizer" in evaluations["bytes_per_token_not_worse"].description
    assert "no earlier run" in evaluations["val_bpb_not_worse"].description
    assert 0 < dup["duplicate_rate"] < 0.2
    assert "is_dup" in dup["dagster/column_lineage"].deps_by_column
    assert [c.name for c in tok["dagster/column_schema"].columns][-2:] == ["input_ids", "n_tokens"]
    bpe = meta("tokenizer")  # token_ids default to the trained BPE
    assert tok["tokenizer_name"] == bpe["tokenizer_name"] == f"bpe:{bpe['tokenizer_sha256']}"
    assert (tok["eos_id"], tok["pad_id"]) == (bpe["eos_id"], bpe["pad_id"]) and tok["tokens_written"] > 0
    assert bpe["bpe_vs_byte"] >= 3 and tok["bytes_per_token"] > 3

    model = meta("pretrained_model")
    assert model["step"] == 20 and model["world_size"] == 1
    assert model["val_loss"] < model["first_val_loss"]
    assert model["table_version"] == ds.version and model["tokens_per_s"] > 0
    assert "loss_curve" in model
    curve = model["loss_curve_table"]  # the same curve as numbers: (step, train loss, val loss)
    assert [c.name for c in curve.schema.columns] == ["step", "train_loss", "val_loss"]
    points = [r.data for r in curve.records]
    assert [p["step"] for p in points] == sorted({p["step"] for p in points})
    assert [p["step"] for p in points if p["val_loss"] is not None] == [0, 10, 20]
    assert abs(points[-1]["val_loss"] - model["val_loss"]) < 1e-4
    assert all(isinstance(p["train_loss"], float) for p in points if p["step"] > 0)
    ckpt = paths.latest_checkpoint_pointer(root).read_text()
    assert ckpt.endswith("ckpt_0000020.pt")

    smp = meta("samples")
    assert smp["dagster/row_count"] == 2
    saved = json.loads((paths.samples_dir(root) / "samples.json").read_text())
    assert saved["checkpoint"] == ckpt and len(saved["samples"]) == 2
    assert all(len(s["token_ids"]) == 16 for s in saved["samples"])

    # materializing again with nothing new is a no-op for every column
    again = dg.materialize(assets[:4], resources=resources, run_config={"ops": {}})
    assert again.success
    mats = {m.asset_key.to_user_string(): m.metadata
            for m in again.asset_materializations_for_node("raw_text")
            + again.asset_materializations_for_node("dedup_flag")
            + again.asset_materializations_for_node("tokenizer")
            + again.asset_materializations_for_node("token_ids")}
    assert mats["raw_text"]["nothing_new"].value is True
    assert mats["dedup_flag"]["nothing_to_do"].value is True
    assert mats["tokenizer"]["nothing_to_do"].value is True
    assert mats["token_ids"]["nothing_to_do"].value is True
    assert lance.dataset(paths.table_uri(root)).version == ds.version

    # every document's story: the run `pretrained_model` recorded, judged at its tagged version
    from lance_assets.train.read_record import rows_read

    run_dir = next(p.parent for p in paths.train_dir(root).glob("*/summary.json"))
    # the public summary of what it read: the trainer's own read record, counted
    told = meta("training_data_summary")
    read_ids = rows_read(run_dir)
    assert told["run"] == run_dir.name and told["documents_read"] == len(read_ids) > 0
    in_read = "id IN (" + ", ".join(map(str, read_ids)) + ")"
    assert told["tokens"] == int(ds.to_table(columns=["n_tokens"], filter=in_read)
                                 .column(0).to_numpy().sum())
    assert "## 3. Data processing aspects" in told["summary"]
    summary = json.loads((run_dir / "summary.json").read_text())
    trained = int(rows_read(run_dir)[0])  # a document the run read (not only one its filter kept)
    assert ds.count_rows(filter=f"({summary['filter']}) AND id = {trained}") == 1
    removed = ds.to_table(columns=["id"], filter="is_dup").column("id").to_pylist()[0]
    stories = dg.materialize([defs.get_assets_def("document_stories")], resources=resources,
                             run_config={"ops": {"document_stories": {"config": {
                                 "ids": [trained, removed]}}}})
    assert stories.success
    meta = stories.asset_materializations_for_node("document_stories")[0].metadata
    assert f"(tag {summary['table_tag']})" in meta[f"document_{trained}"].value.split("\n")[2]
    assert "exact_dup" in meta[f"document_{removed}"].value
    for doc in (trained, removed):  # the stories quote the documents in their files only
        text = ds.to_table(columns=["text"], filter=f"id = {doc}").column("text")[0].as_py()
        assert " ".join(text.split()[:8]) not in " ".join(meta[f"document_{doc}"].value.split())
        assert " ".join(text.split()[:8]) in " ".join(
            (paths.reports_dir(root) / "stories" / f"{doc}.md").read_text().split())

    # the next training run carries what changed in the data since this one (the UI's data_diff)
    from lance_assets.curation.rules import DEFAULT_RULES, put_in_force
    from lance_assets.forensics.diff import diff

    assert "No earlier materialization of `pretrained_model`" in model["data_diff"]
    put_in_force(Table.of(root), {**DEFAULT_RULES, "gopher_word_count": "word_count BETWEEN 120 AND 100000",
                        "no_symbols": "symbol_word_ratio <= 0.02"},
                 keep_languages=[], drop_contaminated=False)
    Table.of(root).commit("delete", lambda d: d.delete("id IN (3, 4, 5)"))
    # a forget of two documents the first run read, as typed, then maintenance: its snapshot is
    # redacted under its tag, and the next run's diff counts them apart
    gone = [int(i) for i in rows_read(run_dir) if int(i) not in (3, 4, 5)][:2]
    texts = ds.to_table(columns=["text"], filter=f"id IN ({gone[0]}, {gone[1]})").column(0)
    with contextlib.redirect_stdout(io.StringIO()):
        assert cli(["forget", "--where", f"id IN ({gone[0]}, {gone[1]})", "--data", str(root)]) == 0
    maintain(Table.of(root), keep_versions_for=timedelta(0), log=lambda _m: None)
    again = dg.materialize([defs.get_assets_def("pretrained_model")], resources=resources,
                           instance=instance, run_config={"ops": {"pretrained_model": {"config": {
                               "steps": 2, "seq_len": 64, "batch_size": 8, "eval_every": 1000,
                               "eval_blocks": 2, "ckpt_every": 1000, "run_name": "next"}}}})
    second = {k: v.value for k, v in
              again.asset_materializations_for_node("pretrained_model")[0].metadata.items()}
    first_run = run_dir.name
    want = diff(Table.of(root), first_run, "next")
    md = second["data_diff"]
    assert "| gopher_word_count | changed |" in md and "| no_symbols | added |" in md
    assert "ids 3–5" in md and second["data_diff/against"] == first_run
    assert second["data_diff_chart"].startswith("![documents moved per rule](data:image/png")
    assert second["data_diff/documents_removed"] == want.documents["removed"] == 3
    assert second["data_diff/training_docs_net"] == want.training["net_docs"] < 0
    assert want.documents["forgotten"] == 2 and "removed (forgotten" in md
    assert held_on_disk(root, gone) == []  # no version of any branch holds them
    for path in (p for p in root.rglob("*") if p.is_file()):
        raw = path.read_bytes()
        assert not any(t.as_py()[:60].encode() in raw for t in texts), path
    story = io.StringIO()
    with contextlib.redirect_stdout(story):
        assert cli(["explain", "--id", str(gone[0]), "--json", "--data", str(root)]) == 0
    told = json.loads(story.getvalue())
    assert told["forgotten"]["done"] and any(
        s["name"] == first_run and s["read"] for s in told["snapshots"])
    from lance_assets.forensics.summary import summarize

    redacted = summarize(Table.of(root), first_run)["run"]["snapshot"]
    assert redacted["state"] == "redacted" and redacted["documents_read_forgotten"] == 2
    assert second["data_diff/rules_changed"] == 2
    both = len(np.intersect1d(rows_read(run_dir), rows_read(paths.run_dir(root, "next"))))
    assert want.read["both"] == both and f"{both:,} read by both" in md
