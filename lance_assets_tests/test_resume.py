"""Elastic resume, SIGINT flushes, SIGKILL during a checkpoint write: real torchrun processes."""

import json
import os
import shutil
import signal
import subprocess
import sys
import time

import pytest

from lance_assets.train import checkpoint
from lance_assets_tests.helpers import steps_logged

STEPS = 120
COMMON = ["--seq-len", "32", "--steps", str(STEPS), "--warmup", "10", "--eval-every", "1000",
          "--ckpt-every", "1000", "--log-every", "1000", "--num-splits", "8", "--log-batch-hashes"]


def torchrun(nproc, root, out, *extra, **kw):
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node",
           str(nproc), "-m", "lance_assets.train", "--data", str(root), "--out", str(out),
           *COMMON, *extra]
    return subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            start_new_session=True, **kw)


def finish(proc, timeout=300):
    _, err = proc.communicate(timeout=timeout)
    assert proc.returncode == 0, err.decode()[-3000:]


def test_sigint_then_resume_on_another_world_size_sees_the_same_batches(tokenized_root, tmp_path):
    ref = tmp_path / "ref"
    finish(torchrun(2, tokenized_root, ref, "--batch-size", "4"))
    reference = steps_logged(ref)
    assert sorted(reference) == list(range(1, STEPS + 1))
    assert all(len(r["batch_hashes"]) == 8 for r in reference.values())  # 2 ranks x 4 blocks

    run = tmp_path / "run"
    proc = torchrun(2, tokenized_root, run, "--batch-size", "4")
    deadline = time.time() + 120
    while time.time() < deadline and not any(s >= 3 for s in steps_logged(run)):
        time.sleep(0.01)
    os.killpg(proc.pid, signal.SIGINT)  # what Ctrl-C does: the whole process group
    proc.communicate(timeout=120)
    saved = checkpoint.list_checkpoints(run)
    assert saved, "SIGINT must leave a checkpoint"
    k = checkpoint.load(saved[-1])["step"]
    assert 3 <= k < STEPS, f"interrupted at step {k}; the run finished before the signal landed"
    assert sorted(steps_logged(run)) == list(range(1, k + 1))

    # resume at world size 1 with twice the accumulation: same global batch, same blocks
    one = tmp_path / "one"
    shutil.copytree(run, one)
    finish(torchrun(1, tokenized_root, one, "--batch-size", "4", "--grad-accum", "2",
                    "--resume", "auto"))
    resumed = steps_logged(one)
    assert sorted(resumed) == list(range(1, STEPS + 1))
    for step in range(k + 1, STEPS + 1):
        assert resumed[step]["batch_hashes"] == reference[step]["batch_hashes"], step

    # resume at the same world size: the loss continues exactly
    finish(torchrun(2, tokenized_root, run, "--batch-size", "4", "--resume", "auto"))
    same = steps_logged(run)
    for step in range(k + 1, STEPS + 1):
        assert same[step]["batch_hashes"] == reference[step]["batch_hashes"], step
        assert same[step]["loss"] == pytest.approx(reference[step]["loss"], rel=1e-6, abs=1e-6), step


@pytest.mark.xdist_group("timing")  # a kill aimed at a write window
def test_sigkill_during_checkpoint_write_keeps_the_previous_one(tokenized_root, tmp_path):
    """`small` writes a ~1.5 GB checkpoint: long enough to be killed in the middle of it."""
    out = tmp_path / "run"
    cmd = [sys.executable, "-m", "lance_assets.train", "--data", str(tokenized_root), "--out",
           str(out), "--model", "small", "--seq-len", "16", "--batch-size", "8", "--steps", "3",
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
    assert [p.name for p in checkpoint.list_checkpoints(out)] == ["ckpt_0000002.pt", "ckpt_0000003.pt"]
    assert not list(out.glob(".ckpt_*.tmp-*"))  # the next save cleared the stale partial write
    summary = json.loads((out / "summary.json").read_text())
    assert summary["step"] == 3
