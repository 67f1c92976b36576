"""Elastic resume, SIGINT flushes, SIGKILL during a checkpoint write: real torchrun processes."""

import json
import signal
import subprocess
import sys
import time

import pytest

from lance_assets.train import checkpoint
from lance_assets.train.trainer import main
from lance_assets_tests import seed_lines
from lance_assets_tests.helpers import descendants, steps_logged, still_running

# The reference recipe's 8-GPU line (runs/train_small.sh) on 2 CPU ranks, every loader flag as
# typed there, and its kill -9 and half-the-world resume (runs/resume_demo.sh): seed_lines.py.
EIGHT_GPU_LINE = seed_lines.trainer_argv(seed_lines.EIGHT_GPU_LINE)
STEPS = int(seed_lines.flags(EIGHT_GPU_LINE)["--steps"])
CKPT_EVERY = int(seed_lines.flags(EIGHT_GPU_LINE)["--ckpt-every"])
HALF_WORLD_LINE = seed_lines.trainer_argv(seed_lines.HALF_WORLD_LINE)


def torchrun(nproc, root, out, *flags, **kw):
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node",
           str(nproc), "-m", "lance_assets.train", "--data", str(root), "--out", str(out),
           *flags, "--log-batch-hashes"]
    return subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            start_new_session=True, **kw)


def finish(proc, timeout=300):
    _, err = proc.communicate(timeout=timeout)
    assert proc.returncode == 0, err.decode()[-3000:]


def with_flag(flags, name, value):
    """``flags`` with ``name`` set to ``value`` (replaced where it is, else appended)."""
    out = list(flags)
    if name in out:
        out[out.index(name) + 1] = value
        return out
    return out + [name, value]


def without(flags, name):
    """``flags`` without ``name`` and its value."""
    at = flags.index(name)
    return [*flags[:at], *flags[at + 2:]]


def test_the_reference_line_with_workers_reads_the_blocks_of_no_workers_and_resumes_anywhere(
        tokenized_root, tmp_path):
    """Its batches with --num-workers 2 are those of an uninterrupted run without workers (on
    one process with the same global batch: the blocks depend on neither); killed with kill -9
    like the reference's demo, it leaves no worker behind; resumed on half the world with twice
    the batch (and workers) it continues with the blocks of the uninterrupted run; and a resume
    with another worker count than the checkpoint's continues that run's loss exactly."""
    # the uninterrupted reference, in this process: the half-world line without workers, every
    # checkpoint kept (the resume with another worker count below starts from its first)
    ref = tmp_path / "ref"
    ref_line = with_flag(with_flag(without(HALF_WORLD_LINE, "--resume"), "--num-workers", "0"),
                         "--keep-ckpts", str(STEPS))
    assert main([*ref_line, "--data", str(tokenized_root), "--out", str(ref),
                 "--log-batch-hashes"]) == 0
    reference = steps_logged(ref)
    assert sorted(reference) == list(range(1, STEPS + 1))
    assert all(len(r["batch_hashes"]) == 128 for r in reference.values())  # 64 x 2 accumulated

    run = tmp_path / "run"
    proc = torchrun(2, tokenized_root, run, *EIGHT_GPU_LINE)
    deadline = time.time() + 240
    while time.time() < deadline and not any(s > CKPT_EVERY + 1 for s in steps_logged(run)):
        assert proc.poll() is None, proc.stderr.read().decode()[-3000:]
        time.sleep(0.02)
    tree = descendants(proc.pid)
    ranks = [p for p in tree if "lance_assets.train" in " ".join(p.cmdline())]
    assert len(ranks) == 2 and len(tree) >= 2 + 2 * 2  # the ranks and their loader workers
    for rank in ranks:  # what the reference's demo does: kill -9 the ranks, then the launcher
        rank.kill()
    proc.kill()
    proc.communicate(timeout=60)
    assert still_running(tree, wait_s=30) == [], "loader workers outlived their killed rank"
    logged = steps_logged(run)
    saved = checkpoint.load(checkpoint.list_checkpoints(run)[-1])
    k = saved["step"]
    assert k % CKPT_EVERY == 0 and CKPT_EVERY <= k < max(logged) < STEPS
    # both ranks' loader states merged: every split emitted one block per step (64 per rank)
    assert saved["world_size"] == 2 and saved["loader"]["blocks_emitted_per_split"] == [k] * 128
    for step in logged:  # 2 ranks with 2 workers each: the blocks of 1 rank with none
        assert logged[step]["batch_hashes"] == reference[step]["batch_hashes"], step

    # half the world, twice the batch, workers: the blocks of the uninterrupted run
    finish(torchrun(1, tokenized_root, run, *HALF_WORLD_LINE))
    resumed = steps_logged(run)
    assert sorted(resumed) == list(range(1, STEPS + 1))
    for step in range(k + 1, STEPS + 1):
        assert resumed[step]["batch_hashes"] == reference[step]["batch_hashes"], step

    # the same world with one worker (saved with none): the loss continues exactly
    again = tmp_path / "again"
    first = checkpoint.list_checkpoints(ref)[0]
    assert checkpoint.load(first)["step"] == CKPT_EVERY
    assert main([*with_flag(ref_line, "--num-workers", "1"), "--data", str(tokenized_root),
                 "--out", str(again), "--log-batch-hashes", "--resume", str(first)]) == 0
    same = steps_logged(again)
    assert sorted(same) == list(range(CKPT_EVERY + 1, STEPS + 1))
    for step in same:
        assert same[step]["batch_hashes"] == reference[step]["batch_hashes"], step
        assert same[step]["loss"] == pytest.approx(reference[step]["loss"], rel=1e-6, abs=1e-6), step


@pytest.mark.xdist_group("timing")  # a kill aimed at a write window
def test_sigkill_during_checkpoint_write_keeps_the_previous_one(tokenized_root, tmp_path):
    """`small` writes a ~1.5 GB checkpoint: long enough to be killed in the middle of it. Two
    steps: killed while writing the second step's checkpoint, the rerun resumes from the first."""
    out = tmp_path / "run"
    cmd = [sys.executable, "-m", "lance_assets.train", "--data", str(tokenized_root), "--out",
           str(out), "--model", "small", "--seq-len", "16", "--batch-size", "8", "--steps", "2",
           "--ckpt-every", "1", "--eval-every", "1000", "--eval-blocks", "8", "--lr", "6e-4"]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 240
    killed_during_write = False
    while time.time() < deadline and proc.poll() is None:
        temps = list(out.glob(".ckpt_0000002.pt.tmp-*")) if out.exists() else []
        if temps and (out / "ckpt_0000001.pt").exists():
            proc.send_signal(signal.SIGKILL)
            killed_during_write = True
            break
        time.sleep(0.002)
    proc.wait(timeout=60)
    assert killed_during_write, "the checkpoint write finished before the kill"
    assert list(out.glob(".ckpt_0000002.pt.tmp-*"))  # the partial file is there ...
    assert [p.name for p in checkpoint.list_checkpoints(out)] == ["ckpt_0000001.pt"]  # ... but ignored
    assert checkpoint.load(checkpoint.resolve_resume("auto", out))["step"] == 1

    subprocess.run(cmd + ["--resume", "auto"], check=True, timeout=600, capture_output=True)
    assert [p.name for p in checkpoint.list_checkpoints(out)] == ["ckpt_0000001.pt", "ckpt_0000002.pt"]
    assert not list(out.glob(".ckpt_*.tmp-*"))  # the next save cleared the stale partial write
    summary = json.loads((out / "summary.json").read_text())
    assert summary["step"] == 2 and sorted(steps_logged(out)) == [1, 2]
