"""Cancelling `pretrained_model` stops every torchrun rank and its loader workers, and leaves a
resumable checkpoint."""

import json
import signal
import subprocess
import sys
import textwrap
import time

from lance_assets.train import checkpoint
from lance_assets_tests.helpers import descendants, processes_mentioning, still_running

RUNNER = textwrap.dedent("""
    import sys
    import dagster as dg
    from lance_assets.definitions import defs
    from lance_assets.defs.resources import LanceStore
    from lance_assets.defs.training.torchrun import TorchrunPipesClient

    root, run_name, workers = sys.argv[1], sys.argv[2], int(sys.argv[3])
    config = {"steps": 100000, "seq_len": 32, "batch_size": 4, "nproc_per_node": 2,
              "num_workers": workers, "eval_every": 100000, "ckpt_every": 100000,
              "run_name": run_name}
    dg.materialize(
        [defs.get_assets_def("pretrained_model")],
        resources={"lance_store": LanceStore(data_dir=root),
                   "pipes_subprocess_client": TorchrunPipesClient(termination_timeout_seconds=55)},
        run_config={"ops": {"pretrained_model": {"config": config}}},
        raise_on_error=False,
    )
""")


def test_cancel_stops_every_rank_and_leaves_a_checkpoint(tokenized_root, tmp_path):
    script = tmp_path / "runner.py"
    script.write_text(RUNNER)
    out = tokenized_root / "train" / "cancel"
    proc = subprocess.Popen([sys.executable, str(script), str(tokenized_root), "cancel", "2"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    metrics = out / "metrics.jsonl"
    deadline = time.time() + 180
    while time.time() < deadline:
        if metrics.exists() and sum(1 for line in metrics.read_text().splitlines() if '"loss"' in line) >= 3:
            break
        time.sleep(0.05)
    else:
        proc.kill()
        raise AssertionError("training never started: " + proc.stderr.read().decode()[-2000:])
    ranks = processes_mentioning(str(out))
    assert len(ranks) >= 3  # torchrun and two ranks
    tree = descendants(proc.pid)  # ... and each rank's loader workers and their forkserver
    assert sum(p.name() == "pt_data_worker" for p in tree) == 4

    cancelled_at = time.time()
    proc.send_signal(signal.SIGINT)  # what the run worker gets when the run is cancelled
    proc.communicate(timeout=120)
    assert time.time() - cancelled_at < 60
    assert processes_mentioning(str(out)) == []
    assert still_running(tree, wait_s=10) == [], "loader workers outlived the cancel"
    saved = checkpoint.list_checkpoints(out)
    assert saved, "cancel must leave a checkpoint"
    state = checkpoint.load(saved[-1])
    assert state["step"] >= 3 and state["world_size"] == 2
    assert len(state["loader"]["blocks_emitted_per_split"]) == 8
    rows = [json.loads(line) for line in metrics.read_text().splitlines()]
    assert max(r["step"] for r in rows if "loss" in r) == state["step"]


def test_a_killed_launcher_stops_its_ranks_with_a_checkpoint(tokenized_root, tmp_path):
    """SIGKILL of the process that launched torchrun (a Dagster step killed, a power cut of the
    run worker): the agent, in a session of its own, must not go on training unwatched next to
    the rerun. It gets SIGINT from the kernel (parent-death signal) and stops like a cancel."""
    script = tmp_path / "runner.py"
    script.write_text(RUNNER)
    out = tokenized_root / "train" / "killed"
    proc = subprocess.Popen([sys.executable, str(script), str(tokenized_root), "killed", "0"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    metrics = out / "metrics.jsonl"
    deadline = time.time() + 180
    while time.time() < deadline:
        if metrics.exists() and sum(1 for line in metrics.read_text().splitlines() if '"loss"' in line) >= 3:
            break
        time.sleep(0.05)
    else:
        proc.kill()
        raise AssertionError("training never started: " + proc.stderr.read().decode()[-2000:])
    assert len(processes_mentioning(str(out))) >= 3  # torchrun and two ranks

    proc.kill()  # SIGKILL: no handler runs in the launcher, no stop_agents
    proc.communicate(timeout=30)
    deadline = time.time() + 90
    while time.time() < deadline and processes_mentioning(str(out)):
        time.sleep(0.1)
    assert processes_mentioning(str(out)) == [], "ranks outlived their killed launcher"
    saved = checkpoint.list_checkpoints(out)
    assert saved, "the orphaned ranks must stop through their final checkpoint"
    assert checkpoint.load(saved[-1])["step"] >= 3
