"""The reference recipes' commands as a new user types them (docs/seeds.md), through the entry
points the page names, scaled down only in sizes (``seed_lines.py``); the reference's flags that
this trainer spells otherwise are refused naming the equivalent. The 8-GPU line and its
half-world resume run in ``test_resume.py``."""

import json
import math
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import lance
import pytest

from lance_assets import paths
from lance_assets.train import checkpoint, reference_flags
from lance_assets.train.trainer import main
from lance_assets_tests import seed_lines
from lance_assets_tests.helpers import descendants, quiet, steps_logged, still_running

REPO = Path(__file__).resolve().parents[1]
PAGE = REPO / "docs" / "seeds.md"
BIN = Path(sys.executable).parent
ROW = re.compile(r"^\| *(\d+\.\d+) *\|(.*)\|$")
CODE = re.compile(r"`([^`]+)`")
SUITE_TEST = re.compile(r"^(test_\w+\.py)::(test_\w+)")


def page_rows() -> dict[str, list[str]]:
    """Row number -> its cells, for every row of the page's tables."""
    rows = {}
    for line in PAGE.read_text().splitlines():
        m = ROW.match(line)
        if m:
            rows[m.group(1)] = [c.strip() for c in m.group(2).split(" | ")]
    return rows


def command(cell: str) -> list[str]:
    """The cell's first code span as argv, leading ``VAR=value`` assignments dropped."""
    argv = shlex.split(CODE.findall(cell)[0])
    while argv and re.match(r"^[A-Z_]+=", argv[0]):
        argv = argv[1:]
    return argv


def test_every_command_on_the_page_is_the_one_the_suite_runs():
    """Each row names what runs it: a line of ``seed_lines`` (then the page's command and the
    suite's have the same program and flags, values differing only in sizes) or a test of the
    suite (which must exist)."""
    rows = page_rows()
    assert len(rows) >= 25, "docs/seeds.md lost its tables"
    compared = set()
    for number, (reference, here, runs, _differs) in rows.items():
        if number.startswith("1."):  # the long-run recipe is settings, not a published script
            assert CODE.search(reference), f"row {number}: no reference command"
        for name in CODE.findall(runs):
            test = SUITE_TEST.match(name)
            if test:
                source = (REPO / "lance_assets_tests" / test.group(1)).read_text()
                assert f"def {test.group(2)}(" in source, f"row {number}: {name} does not exist"
            elif name.isupper():
                suite = getattr(seed_lines, name)
                page = command(here)
                (prog, launch, args), (s_prog, s_launch, s_args) = (seed_lines.split(page),
                                                                    seed_lines.split(suite))
                assert prog == s_prog, (number, prog, s_prog)
                for mine, theirs in ((seed_lines.flags(launch), seed_lines.flags(s_launch)),
                                     (seed_lines.flags(args), seed_lines.flags(s_args))):
                    mine = {k: v for k, v in mine.items() if k not in seed_lines.RUN_FOLDER}
                    left_out = set(mine) - set(theirs)
                    assert left_out <= seed_lines.CPU_ONLY_LEFT_OUT, (number, left_out)
                    added = set(theirs) - set(mine)  # the suite may only add sizes
                    assert added <= seed_lines.SIZES | seed_lines.SPEED_ONLY, (number, added)
                    for flag, value in theirs.items():
                        if flag not in seed_lines.SIZES and flag in mine:
                            assert mine[flag] == value, (number, flag, mine[flag], value)
                compared.add(name)
    lines = {n for n, v in vars(seed_lines).items() if n.isupper() and not n.startswith("_")
             and isinstance(v, list) and v and v[0] in ("python", "torchrun", "dagster")}
    assert compared == lines, f"lines of seed_lines.py no row of the page runs: {lines - compared}"


def test_every_selection_on_the_page_names_assets_we_define():
    """The page's `dagster asset materialize --select` (run by the suite or not) selects exactly
    the assets it names, through Dagster's own selection parser."""
    import dagster as dg

    from lance_assets.definitions import defs

    graph = defs.get_repository_def().asset_graph
    selections = [seed_lines.flags(command(here))["--select"] for here in
                  (cells[1] for cells in page_rows().values())
                  if CODE.search(here) and command(here)[:1] == ["dagster"]]
    assert len(selections) >= 5
    for select in selections:
        names = select.split(",")
        found = dg.AssetSelection.from_coercible(names).resolve(graph)
        assert {k.to_user_string() for k in found} == set(names), select


@pytest.mark.parametrize("flag, value", [*((f, "1") for f in reference_flags.EQUIVALENTS),
                                         ("--tokenizer", "hf:gpt2"),
                                         *((f, "0") for f in reference_flags.ZERO_MEANS_DEFAULT)])
def test_a_reference_only_flag_is_refused_naming_the_equivalent(flag, value, capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["--data", "/nonexistent", flag, value])
    assert exit_.value.code == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and flag in err and "docs/seeds.md" in err
    named = re.findall(r"--[a-z-]+|token_ids|benchmarks\.\w+|n_tokens", err.split(";", 1)[1])
    assert named, err  # the equivalent is named


def test_the_laptop_smoke_test_as_typed(tmp_path, capsys):
    """Ingest, curate, byte tokens (one `dagster asset materialize`, on a fresh machine: no
    DAGSTER_HOME, so an ephemeral instance with no pool limit and its default executor runs the
    column steps side by side, and they must not fail), then the trainer's CLI; sizes scaled
    down."""
    data_dir = tmp_path / "data"
    env = {k: v for k, v in os.environ.items() if k != "DAGSTER_HOME"}
    env.update(LANCE_ASSETS_DATA=str(data_dir), LANCE_ASSETS_SOURCE=seed_lines.SMOKE_SOURCE,
               LANCE_LOG="error")
    argv = seed_lines.SMOKE_MATERIALIZE
    done = subprocess.run([str(BIN / argv[0]), *argv[1:]], cwd=tmp_path, env=env, text=True,
                          capture_output=True, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "RUN_SUCCESS" in done.stdout + done.stderr  # every selected asset's step succeeded
    ds = lance.dataset(paths.table_uri(data_dir))
    rows = int(seed_lines.SMOKE_SOURCE.split(":")[1])
    assert ds.count_rows() == rows and ds.count_rows("is_dup") > 0
    assert ds.count_rows("input_ids IS NULL OR is_dup IS NULL OR near_dup IS NULL "
                         "OR word_count IS NULL") == 0
    assert "text_fts" in {i.name for i in ds.describe_indices()}  # the full-text search

    out = tmp_path / "run"  # the trainer's CLI in this process: `python -m lance_assets.train`'s main
    train = seed_lines.SMOKE_TRAIN
    capsys.readouterr()
    assert main([*seed_lines.trainer_argv(train), "--data", str(data_dir), "--out", str(out)]) == 0
    summary = json.loads((out / "summary.json").read_text())
    steps = int(seed_lines.flags(train)["--steps"])
    assert summary["step"] == steps and summary["tokenizer"] == "byte"
    assert summary["val_loss"] < summary["first_val_loss"]
    assert f"--steps {steps}" in capsys.readouterr().out


def test_the_single_gpu_and_ablation_lines_in_one_process(tokenized_root, tmp_path, capsys):
    """``--epochs`` alone trains that many epochs' steps; ``--filter`` is the reference's
    ``--min-score`` ablation, one SQL prefilter per run."""
    runs = {}
    for name in ("SINGLE_GPU", "MIN_SCORE_3", "MIN_SCORE_0"):
        out = tmp_path / name
        argv = [*seed_lines.trainer_argv(getattr(seed_lines, name)), "--data",
                str(tokenized_root), "--out", str(out)]
        assert main(argv) == 0
        runs[name] = (json.loads((out / "summary.json").read_text()), capsys.readouterr().out)
    summary, said = runs["SINGLE_GPU"]
    epochs = float(seed_lines.flags(seed_lines.SINGLE_GPU)["--epochs"])
    batch = int(seed_lines.flags(seed_lines.SINGLE_GPU)["--batch-size"])
    steps = math.ceil(epochs * summary["blocks_per_epoch"] / batch)
    assert summary["step"] == steps and f"--epochs {epochs:g}: {steps} steps" in said
    high, low = runs["MIN_SCORE_3"][0], runs["MIN_SCORE_0"][0]
    assert "`score` >= 3" in high["filter"] and "`score` >= 0" in low["filter"]
    assert 0 < high["blocks_per_epoch"] < low["blocks_per_epoch"]


def test_the_loader_probe_prints_its_figures(capsys):
    """runs/bench_small.sh's loader-only probe, as this project's benchmark (tiny sizes)."""
    from benchmarks.train_loader import main as bench

    argv = seed_lines.BENCH_LOADER
    assert bench(argv[3:]) == 0
    table = [line for line in capsys.readouterr().out.splitlines() if line.startswith("| synthetic-web")]
    assert len(table) == 1  # one worker count, one thread setting
    cells = [c.strip() for c in table[0].strip("|").split("|")]
    assert cells[:5] == ["synthetic-web", "64", "0", "reference", "64"]  # ... 64 blocks per read
    assert float(cells[5].replace(",", "")) > 0 and float(cells[9].replace(",", "")) > 0


def test_the_long_run_recipe_flushes_on_ctrl_c_and_resumes(bpe_root, tmp_path, capsys):
    """BPE tokens, bf16, accumulation, cosine with warm-up, the validation split, a checkpoint
    every N steps and loader workers: Ctrl-C (SIGINT to the whole process group, workers
    included) finishes the step, writes its checkpoint and leaves no process; ``--resume auto``
    then trains to the end, ``--steps`` ending before ``--epochs`` as the log says."""
    from lance_assets.table import Table
    from lance_assets.table.producer import produce
    from lance_assets.tokens import token_ids

    root = tmp_path / "data"
    shutil.copytree(bpe_root, root)
    produce(token_ids.PRODUCER, Table.of(root), log=quiet)  # the corpus BPE the `tokenizer` asset trained
    out = tmp_path / "run"
    argv = [sys.executable, *seed_lines.LONG_RUN[1:], "--data", str(root), "--out", str(out)]
    flags = seed_lines.flags(seed_lines.LONG_RUN)
    steps, every = int(flags["--steps"]), int(flags["--ckpt-every"])
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    deadline = time.time() + 300
    while time.time() < deadline and not any(s >= every + 1 for s in steps_logged(out)):
        assert proc.poll() is None, proc.stderr.read()[-3000:]
        time.sleep(0.02)
    tree = descendants(proc.pid)
    assert sum(p.name() == "pt_data_worker" for p in tree) == int(flags["--num-workers"])
    os.killpg(proc.pid, signal.SIGINT)  # Ctrl-C in the terminal
    said, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err[-3000:]
    assert still_running(tree, wait_s=10) == []
    logged = steps_logged(out)
    saved = checkpoint.load(checkpoint.list_checkpoints(out)[-1])
    assert saved["step"] == max(logged) < steps and "interrupted at step" in said  # nothing lost

    capsys.readouterr()  # resumed in this process: the same argv through the CLI's main
    assert main([*argv[3:], "--resume", "auto"]) == 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["step"] == steps and summary["dtype"] == "bfloat16"
    assert summary["tokenizer"].startswith("bpe:") and summary["val_loss_step"] == steps
    assert f"--steps {steps} ends before --epochs 1" in capsys.readouterr().out
    logged = steps_logged(out)
    assert sorted(logged) == list(range(1, steps + 1))
    lrs = [logged[s]["lr"] for s in range(1, steps + 1)]
    warmup, peak = int(flags["--warmup"]), float(flags["--lr"])
    assert lrs[:warmup] == sorted(lrs[:warmup]) and lrs[warmup - 1] == pytest.approx(peak)
    assert lrs[warmup - 1:] == sorted(lrs[warmup - 1:], reverse=True)  # the cosine, resumed
    assert float(flags["--min-lr"]) < lrs[-1] < peak / 5
    vals = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()
            if '"val_loss"' in line]
    every_eval = int(flags["--eval-every"])
    assert [v["step"] for v in vals][-2:] == [steps - every_eval, steps]
    assert f"id % {flags['--val-mod']} = 0" in re.sub(r"[()`]", "", summary["eval_filter"])
