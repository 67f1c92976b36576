"""The trainer, in-process on a small table: the loss falls, checkpoints resume."""

import json

import torch

from lance_assets.table import Table
from lance_assets.table.producer import produce
from lance_assets.train import checkpoint, data
from lance_assets.train.config import DEFAULT_STEPS
from lance_assets.train.loop import block_hashes
from lance_assets.train.trainer import main


def metrics(out):
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


# measured at step 50 (still in the 60-step warmup, so the same as in the full run): 7.006 ->
# 2.185 (0.31 of it) with the default seed, 0.31 with seeds 0 and 1; 1.532 at step 100, 0.94
# after the full 300 steps. A default that stops learning stays near ln(vocab)
VAL_AT_50_MAX_SHARE = 0.45


def test_demo_training_validation_loss_falls(tmp_path):
    """The demo's own run: default corpus, the `pretrained_model` asset's default flags."""
    from lance_assets.curation import dedup_flag, near_dup, quality_signals
    from lance_assets.defs.training.assets import TrainConfig
    from lance_assets.ingest.raw_text import ingest
    from lance_assets.tokens import token_ids
    from lance_assets.tokens.bpe import train_bpe
    from lance_assets.train.spec import RunSpec
    from lance_assets_tests.helpers import quiet

    root = tmp_path / "data"
    ingest(Table.of(root), "synthetic", log=quiet)
    produce(dedup_flag.PRODUCER, Table.of(root), log=quiet)
    # the default filter is the curation rules over these
    produce(quality_signals.PRODUCER, Table.of(root), log=quiet)
    produce(near_dup.PRODUCER, Table.of(root), log=quiet)
    train_bpe(Table.of(root), log=quiet)  # the `tokenizer` asset: token_ids use its BPE by default
    produce(token_ids.PRODUCER, Table.of(root), log=quiet)
    out = tmp_path / "run"
    # the demo's flags, but its first sixth: the whole 300 steps cost minutes of the suite, and
    # the first 50 already show whether the defaults learn (`make demo` runs all 300)
    defaults = TrainConfig()
    spec = RunSpec.of(Table.of(root), out, TrainConfig(steps=50, ckpt_every=50).model_dump())
    assert main(spec.argv()) == 0
    vals = [m["val_loss"] for m in metrics(out) if "val_loss" in m]
    assert (defaults.steps or DEFAULT_STEPS) == 300 and defaults.eval_every == 50
    assert len(vals) == 2  # step 0, 50
    assert vals[0] > 6.5  # ~ln(1057) at init: the demo BPE's ids
    assert vals[-1] < VAL_AT_50_MAX_SHARE * vals[0]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["step"] == 50 and summary["tokenizer"].startswith("bpe:")
    ckpt = checkpoint.load(out / "ckpt_0000050.pt")
    assert ckpt["table_version"] == summary["table_version"] and ckpt["loader"]["num_splits"] == 8


def test_resume_continues_from_checkpoint(tokenized_root, tmp_path):
    out = tmp_path / "run"
    common = ["--data", str(tokenized_root), "--out", str(out), "--seq-len", "32", "--batch-size", "8",
              "--eval-every", "1000", "--ckpt-every", "5"]
    main(common + ["--steps", "5"])
    main(common + ["--steps", "10", "--resume", "auto"])
    steps = [m["step"] for m in metrics(out) if "loss" in m]
    assert steps == list(range(1, 11))  # 1-5 in the first run, 6-10 after resume
    assert checkpoint.load(out / "ckpt_0000010.pt")["step"] == 10


def test_validation_blocks_are_frozen_and_disjoint_from_training(tokenized_root):
    snap = data.open_snapshot(Table.of(tokenized_root))
    split = data.splits("NOT is_dup", 20, snap.table.schema.names)
    vf = split.val.lance
    a = data.val_blocks(snap, filter=vf, block_len=65, max_blocks=8)
    b = data.val_blocks(snap, filter=vf, block_len=65, max_blocks=8)
    assert torch.equal(a.blocks, b.blocks) and a.blocks.shape == (8, 65)
    assert torch.equal(a.first_doc, b.first_doc)
    # a sample spread over the split's documents, not its first few (a stride of blocks)
    contiguous = data.val_blocks(snap, filter=vf, block_len=65, max_blocks=200)
    assert len(contiguous) == 200 or len(contiguous) == data.count_blocks(snap, vf, 65, 1)
    assert a.first_doc.tolist() == sorted(a.first_doc.tolist())
    assert a.first_doc[-1] > 2 * contiguous.first_doc[7] > 0
    lance_ds = snap.table.to_lance()
    val_ids = set(lance_ds.to_table(columns=["id"], filter=vf).column("id").to_pylist())
    train_ids = set(lance_ds.to_table(columns=["id"], filter=split.train.lance)
                    .column("id").to_pylist())
    assert val_ids and train_ids and not val_ids & train_ids
    dup_ids = set(lance_ds.to_table(columns=["id"], filter="is_dup").column("id").to_pylist())
    assert dup_ids and not dup_ids & (val_ids | train_ids)


def test_resume_auto_falls_back_past_a_corrupt_newest_checkpoint(tokenized_root, tmp_path, capsys):
    """Files newest by name that do not load (bytes that make torch's weights-only loader raise
    IndexError; a dict without what a resume reads) are skipped by --resume auto, named with the
    reason; named by --resume or `sample --ckpt`, each is one line and exit 2, no traceback."""
    from lance_assets import sample

    out = tmp_path / "run"
    common = ["--data", str(tokenized_root), "--out", str(out), "--seq-len", "32", "--batch-size", "8",
              "--eval-every", "1000", "--ckpt-every", "3", "--keep-ckpts", "3"]
    assert main(common + ["--steps", "6"]) == 0
    (out / "ckpt_0000006.pt").write_bytes(b".")  # torch.load(weights_only) raises IndexError
    torch.save({"step": 7, "model": {}}, out / "ckpt_0000007.pt")  # loads, but no resume in it
    capsys.readouterr()
    reasons = {"ckpt_0000006.pt": "IndexError", "ckpt_0000007.pt": "no optimizer"}
    for name, reason in reasons.items():
        assert main(common + ["--steps", "8", "--resume", str(out / name)]) == 2
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and name in err and reason in err, err
        assert sample.main(["--ckpt", str(out / name)]) == 2
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and name in err and "--ckpt" in err, err
    # the whole line `python -m lance_assets.sample --ckpt FILE` prints (its main, in process)
    assert sample.main(["--ckpt", str(out / "ckpt_0000006.pt")]) == 2
    [line] = capsys.readouterr().err.strip().splitlines()
    assert line.startswith(f"python -m lance_assets.sample: error: --ckpt {out / 'ckpt_0000006.pt'}"
                           ": not a readable checkpoint (IndexError"), line
    assert main(common + ["--steps", "8", "--resume", "auto"]) == 0
    said = capsys.readouterr().out
    skipped = [line for line in said.splitlines() if "skipping" in line]
    assert len(skipped) == 2 and all(n in " ".join(skipped) and r in " ".join(skipped)
                                     for n, r in reasons.items()), skipped
    assert "ckpt_0000003.pt at step 3" in said
    assert checkpoint.load(out / "ckpt_0000008.pt")["step"] == 8


def test_a_hostile_checkpoint_is_refused_by_the_cli(tokenized_root, tmp_path, capsys):
    from lance_assets_tests.helpers import WritesAMarker

    marker = tmp_path / "pwned"
    evil = tmp_path / "evil.pt"
    torch.save({"step": 1, "model": {}, "x": WritesAMarker(str(marker))}, evil)
    assert main(["--data", str(tokenized_root), "--out", str(tmp_path / "run"),
                 "--resume", str(evil)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "refused" in err and not marker.exists()


def test_a_bad_filter_is_one_line_naming_the_flag(tokenized_root, tmp_path, capsys):
    for hostile in ["1=1) OR (1=1", "no_such_column > 0", "NOT is_dup; DROP TABLE corpus"]:
        assert main(["--data", str(tokenized_root), "--out", str(tmp_path / "run"),
                     "--filter", hostile]) == 2
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and "--filter" in err, err
    assert not (tmp_path / "run" / "metrics.jsonl").exists()


def test_with_no_filter_the_trainer_reads_the_rules_in_force_at_the_version_it_pins(
        tokenized_root, tmp_path, capsys):
    """The rules live in the table's config, versioned with the rows: a run pinned at an older
    version trains on the rules in force there, not on newer ones, and says in its summary (the
    Pipes metadata under Dagster) what it resolved; a broken rule stored there is one line."""
    import dataclasses
    import shutil

    from lance_assets.curation import rules
    from lance_assets.train.spec import RunSpec

    root = tmp_path / "data"
    shutil.copytree(tokenized_root, root)
    table = Table.of(root)
    older = rules.store_curation(table, rules.Curation(rules={"exact_dup": "NOT is_dup"}))
    rules.store_curation(table, rules.Curation(rules={"exact_dup": "NOT is_dup",
                                                      "long": "n_tokens > 100"}))
    quick = {"steps": 2, "seq_len": 32, "batch_size": 8, "eval_every": 2, "eval_blocks": 4,
             "ckpt_every": 2}
    spec = RunSpec.of(table, tmp_path / "pinned", quick)  # filter '': the rules in force
    assert ["--filter", ""] == spec.argv()[spec.argv().index("--filter"):][:2]
    assert main(dataclasses.replace(spec, version=older).argv()) == 0
    pinned = json.loads((tmp_path / "pinned" / "summary.json").read_text())
    assert pinned["table_version"] == older
    assert pinned["run_filter"] == "NOT `is_dup`"
    assert pinned["run_filter_source"] == f"curation rules at version {older}"
    assert main(dataclasses.replace(spec, out=str(tmp_path / "newest")).argv()) == 0
    newest = json.loads((tmp_path / "newest" / "summary.json").read_text())
    assert newest["table_version"] > older and "n_tokens" in newest["run_filter"]

    table.set_config(rules.CURATION_KEY, {"rules": [["broken", "no_such_column > 0"]]})
    assert main(dataclasses.replace(spec, out=str(tmp_path / "broken")).argv()) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert "broken" in "\n".join(err) and "no_such_column" in "\n".join(err), err


def test_no_validation_document_reaches_a_training_batch(tokenized_root, tmp_path):
    """Even a filter written to select the validation split (`id % 20 = 0 OR ...`): the split
    is the trainer's own predicate, joined as a parsed tree, not pasted into the user's text."""
    out = tmp_path / "run"
    pull_in_val = "id % 20 = 0 OR n_tokens >= 0"
    assert main(["--data", str(tokenized_root), "--out", str(out), "--seq-len", "512",
                 "--batch-size", "16", "--steps", "8", "--eval-every", "1000", "--no-pack",
                 "--filter", pull_in_val, "--log-batch-hashes"]) == 0
    seen = {h for m in metrics(out) if "batch_hashes" in m for h in m["batch_hashes"]}
    assert len(seen) > 100
    snap = data.open_snapshot(Table.of(tokenized_root))
    rows = snap.table.to_lance().to_table(columns=["id", "input_ids"], filter="n_tokens > 0")
    shape = data.TruncateOrPad(513, snap.tokenizer["eos_id"], snap.tokenizer["pad_id"])
    by_split = {True: set(), False: set()}
    for doc_id, seq in zip(rows.column("id").to_pylist(), shape(rows)):
        digest = block_hashes([seq["input_ids"][None]])[0]
        by_split[doc_id % 20 == 0].add(digest)
    assert seen <= by_split[False] | by_split[True]  # the hashes are of whole documents
    assert not seen & (by_split[True] - by_split[False])  # and never of a validation one


def test_a_run_is_said_to_have_trained_on_exactly_what_it_read(tokenized_root, tmp_path):
    """A run of 4 steps of 16 whole documents reads about a twentieth of what its filter keeps:
    its read record names exactly the documents of its batches; `explain` says "read" for those
    and "kept by its filter, not read" for the others, and `forget` counts only the read ones."""
    import shutil

    import numpy as np

    from lance_assets.defs.training.assets import TrainConfig, training_snapshot
    from lance_assets.forensics.explain import explain
    from lance_assets.table.forget import forget
    from lance_assets.train.read_record import rows_read
    from lance_assets_tests.helpers import quiet

    root = tmp_path / "data"
    shutil.copytree(tokenized_root, root)
    table = Table.of(root)
    out = root / "train" / "r1"
    tag, _ = training_snapshot(TrainConfig(run_name="r1"), table, out)
    assert main(["--data", str(root), "--out", str(out), "--table-tag", tag, "--seq-len", "512",
                 "--batch-size", "16", "--steps", "4", "--eval-every", "1000", "--no-pack",
                 "--log-batch-hashes"]) == 0
    seen = {h for m in metrics(out) if "batch_hashes" in m for h in m["batch_hashes"]}
    summary = json.loads((out / "summary.json").read_text())
    snap = data.open_snapshot(table, version=summary["table_version"])
    rows = snap.table.to_lance().to_table(columns=["id", "input_ids"], filter=summary["filter"])
    shape = data.TruncateOrPad(513, snap.tokenizer["eos_id"], snap.tokenizer["pad_id"])
    digest = {i: block_hashes([s["input_ids"][None]])[0]
              for i, s in zip(rows.column("id").to_pylist(), shape(rows))}
    batches = {i for i, h in digest.items() if h in seen}
    read = rows_read(out)
    assert len(batches) == 64 and set(read.tolist()) == batches
    assert len(read) < len(digest) / 10  # a small part of what the filter keeps

    in_read, not_read = int(read[0]), next(i for i in digest if i not in batches)
    story = {i: {s.name: s for s in explain(table, i, ref=tag).snapshots}["r1"]
             for i in (in_read, not_read)}
    assert story[in_read].read is True and story[in_read].trained_on
    assert story[not_read].read is False and story[not_read].trained_on
    assert "kept by its filter, not read" in story[not_read].note
    assert "r1" not in [s.name for s in explain(table, not_read, ref=tag).trained_by]

    tokens = sum(table.open(tag).to_table(columns=["n_tokens"], filter=f"id IN ({in_read}, "
                                          f"{not_read})").column("n_tokens").to_pylist())
    report = forget(table, f"id IN ({in_read}, {not_read})", force=True, log=quiet)
    (holder,) = report.holders
    assert (holder.name, holder.rows, holder.kept_by_filter, holder.trained_on) == ("r1", 2, 2, 1)
    assert holder.read_record and np.isin(in_read, read)
    # what cannot be edited is named, with what makes it again
    assert holder.checkpoints and holder.permutations
    assert all(p.startswith(str(out)) for p in holder.checkpoints + holder.permutations)
    assert "--select pretrained_model" in holder.rebuild and '"run_name": "r1"' in holder.rebuild
    # r1's snapshot is redacted, not released: the run resumes on its copy and says what went
    ckpt = checkpoint.load(checkpoint.list_checkpoints(out)[-1])
    assert main(["--data", str(root), "--out", str(out), "--table-tag", tag, "--seq-len", "512",
                 "--batch-size", "16", "--steps", "6", "--eval-every", "1000", "--no-pack",
                 "--resume", "auto"]) == 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["step"] == 6 and summary["table_version"] != ckpt["table_version"]
    assert summary["redacted"] == {"documents": 2, "tokens": tokens,
                                   "from_version": ckpt["table_version"], "forgets": 1,
                                   "from_step": ckpt["step"]}
    assert [m["step"] for m in metrics(out) if "loss" in m][-2:] == [5, 6]
    # what rank 0 reports through Dagster Pipes: every value a metadata value (Pipes' own check)
    from dagster_pipes import _normalize_param_metadata

    from lance_assets.train.mixture import flat

    reported = _normalize_param_metadata(flat(summary), "report_asset_materialization", "metadata")
    assert reported["redacted/documents"]["raw_value"] == 2
    # a second forget redacts the copy again: the next resume counts only what went since
    again = next(int(i) for i in read if int(i) != in_read)
    forget(table, f"id = {again}", force=True, log=quiet)
    ckpt = checkpoint.load(checkpoint.list_checkpoints(out)[-1])
    assert main(["--data", str(root), "--out", str(out), "--table-tag", tag, "--seq-len", "512",
                 "--batch-size", "16", "--steps", "7", "--eval-every", "1000", "--no-pack",
                 "--resume", "auto"]) == 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["step"] == 7 and summary["redacted"]["documents"] == 1
    assert summary["redacted"]["forgets"] == 1 and summary["redacted"]["from_step"] == 6
