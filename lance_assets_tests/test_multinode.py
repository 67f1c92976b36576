"""`pretrained_model` on two nodes (two torchrun agents sharing a c10d rendezvous), launched on
this machine and as a Ray job: cancelled mid-run, it has seen exactly the batches of an
uninterrupted run, and (after the local launcher's cancel) resumed on one node it goes on with
them. The resume is the same for both launchers: the trainer's ranks write the checkpoint."""

import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time

import dagster as dg
import pytest

from lance_assets.table import Table
from lance_assets.train import checkpoint
from lance_assets_tests.helpers import processes_mentioning, steps_logged

STEPS = 200  # the interrupted runs' length: long enough for a cancel to land mid-run
MORE = 10  # steps the resumed run adds after the checkpoint
AHEAD = 60  # the reference's least length: enough for either case's cancel
CONFIG = {"steps": STEPS, "seq_len": 32, "batch_size": 4, "num_splits": 8, "warmup": 5,
          "eval_every": 1000, "ckpt_every": 1000, "log_every": 1000, "log_batch_hashes": True}

RUNNER = textwrap.dedent("""
    import json, sys
    import dagster as dg
    from lance_assets.definitions import defs
    from lance_assets.defs.resources import LanceStore
    from lance_assets.defs.training.torchrun import TorchrunPipesClient

    client = TorchrunPipesClient(termination_timeout_seconds=55, local_ray_num_cpus=2)
    dg.materialize([defs.get_assets_def("pretrained_model")],
                   resources={"lance_store": LanceStore(data_dir=sys.argv[1]),
                              "pipes_subprocess_client": client},
                   run_config={"ops": {"pretrained_model": {"config": json.loads(sys.argv[2])}}},
                   raise_on_error=False)
""")


@pytest.fixture(scope="module")
def data_root(tokenized_root, tmp_path_factory):
    """A writable copy of the shared corpus (the asset writes checkpoints and a pointer)."""
    root = tmp_path_factory.mktemp("multinode") / "data"
    shutil.copytree(tokenized_root, root)
    return root


@pytest.fixture(scope="module")
def reference(data_root, tmp_path_factory):
    """Per-step batch hashes of an uninterrupted run: one process, the same global batch.
    (They depend on the seed and the data only, not on the run's length or its LR, so the
    reference runs only as far as the tests ask: a cancel lands within the first few dozen
    steps. Both launchers' cases share it: it runs once, to at least ``AHEAD`` steps.)"""
    from lance_assets.defs.training.assets import TrainConfig
    from lance_assets.train.spec import RunSpec
    from lance_assets.train.trainer import main

    hashes: dict[int, list] = {}

    def upto(steps: int) -> dict[int, list]:
        if steps > len(hashes):
            out = tmp_path_factory.mktemp("reference")
            run_steps = max(steps, AHEAD)
            cfg = TrainConfig(**{**CONFIG, "steps": run_steps, "grad_accum": 2})
            assert main(RunSpec.of(Table.of(data_root), out, cfg.model_dump()).argv()) == 0
            logged = steps_logged(out)
            assert sorted(logged) == list(range(1, run_steps + 1))
            hashes.clear()
            hashes.update({step: row["batch_hashes"] for step, row in logged.items()})
        return hashes

    return upto


def cancel_after_three_steps(root, config, out):
    """Run the asset in a Dagster process and cancel it (SIGINT, as the run worker gets) once
    three steps are logged; the process's output (the run's event log)."""
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}  # a local Ray
    proc = subprocess.Popen([sys.executable, "-c", RUNNER, str(root), json.dumps(config)],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env)
    try:
        deadline = time.time() + 300  # two agents (and a Ray job) start slowly on busy cores
        while time.time() < deadline and len(steps_logged(out)) < 3:
            if proc.poll() is not None:
                break
            time.sleep(0.05)
        started = len(steps_logged(out)) >= 3
        if started:
            assert len(processes_mentioning(str(out))) >= 4  # two agents and their workers
    finally:
        proc.send_signal(signal.SIGINT)  # also on a failure: nothing may outlive the test
        said, _ = proc.communicate(timeout=120)
    assert started, "training never started: " + said.decode()[-3000:]
    return said.decode()


@pytest.mark.parametrize("launcher", ["local", "ray"])
def test_two_nodes_cancelled_then_resumed_on_one_node_see_the_same_batches(
        launcher, data_root, reference):
    from lance_assets.definitions import defs
    from lance_assets.defs.resources import LanceStore
    from lance_assets.defs.training.torchrun import TorchrunPipesClient

    run_name = f"two-nodes-{launcher}"
    out = data_root / "train" / run_name
    said = cancel_after_three_steps(data_root, {**CONFIG, "nnodes": 2, "nproc_per_node": 1,
                                                "launcher": launcher, "run_name": run_name}, out)
    assert "model tiny" in said and "world 2" in said, said[-3000:]  # rank 0's Pipes log lines
    assert processes_mentioning(str(out)) == [], "a rank outlived the cancelled run"
    saved = checkpoint.list_checkpoints(out)
    assert saved, "cancel must leave a checkpoint"
    state = checkpoint.load(saved[-1])
    k = state["step"]
    assert 3 <= k <= STEPS - MORE and state["world_size"] == 2, f"cancelled at step {k}"
    assert sorted(steps_logged(out)) == list(range(1, k + 1))
    # what the UI shows: how to go on, in its own words, and that nothing was evaluated
    hint = ("to continue, materialize pretrained_model again with resume: auto and run_name: "
            + run_name)
    assert f"interrupted at step {k}; checkpoint {saved[-1]}; {hint}" in said, said[-3000:]
    assert f"training cancelled; newest checkpoint {saved[-1].name} in {out}; {hint}" in said
    assert f"done: step {k}, no evaluation ran after step 0 (eval_every 1000)" in said

    if launcher == "ray":  # the two-node prefix; the resume from it is the [local] case's
        expected = reference(k)
        logged = steps_logged(out)
        for step in range(1, k + 1):
            assert logged[step]["batch_hashes"] == expected[step], step
        return

    # what the cancel said: the same run_name, resume: auto; one node with twice the
    # accumulation (the same global batch), MORE steps past the checkpoint
    result = dg.materialize(
        [defs.get_assets_def("pretrained_model")],
        resources={"lance_store": LanceStore(data_dir=str(data_root)),
                   "pipes_subprocess_client": TorchrunPipesClient(termination_timeout_seconds=55)},
        run_config={"ops": {"pretrained_model": {"config": {
            **CONFIG, "steps": k + MORE, "grad_accum": 2, "resume": "auto",
            "run_name": run_name}}}})
    assert result.success
    meta = result.asset_materializations_for_node("pretrained_model")[0].metadata
    assert meta["step"].value == k + MORE and meta["world_size"].value == 1
    logged = steps_logged(out)
    assert sorted(logged) == list(range(1, k + MORE + 1))
    expected = reference(k + MORE)
    for step in range(1, k + MORE + 1):  # the two-node prefix and the one-node rest
        assert logged[step]["batch_hashes"] == expected[step], step


def test_nnodes_must_divide_the_loader_splits(data_root):
    from lance_assets.definitions import defs
    from lance_assets.defs.resources import LanceStore
    from lance_assets.defs.training.torchrun import TorchrunPipesClient

    result = dg.materialize(
        [defs.get_assets_def("pretrained_model")],
        resources={"lance_store": LanceStore(data_dir=str(data_root)),
                   "pipes_subprocess_client": TorchrunPipesClient()},
        run_config={"ops": {"pretrained_model": {"config": {
            **CONFIG, "nnodes": 3, "run_name": "three"}}}}, raise_on_error=False)
    assert not result.success
    failure = result.get_step_failure_events()[0].event_specific_data.error.message
    assert "nnodes x nproc_per_node = 3 must divide num_splits 8" in failure
    assert not (data_root / "train" / "three").exists()


def test_local_agents_get_their_own_gpus():
    """Each agent numbers its devices from LOCAL_RANK 0: on one machine they need disjoint
    CUDA_VISIBLE_DEVICES, or two ranks land on one GPU (which NCCL refuses)."""
    from lance_assets.launch.torchrun import local_agent_gpus

    assert local_agent_gpus(2, 2, 4) == [{"CUDA_VISIBLE_DEVICES": "0,1"},
                                         {"CUDA_VISIBLE_DEVICES": "2,3"}]
    assert local_agent_gpus(2, 1, 0) == [{}, {}]  # CPU: nothing to split
    assert local_agent_gpus(1, 8, 8) == [{}]  # one agent sees every GPU
    with pytest.raises(ValueError, match="needs 4 GPUs, it has 2"):
        local_agent_gpus(2, 2, 2)


def test_local_agents_split_the_cores_between_their_ranks():
    """Several one-process agents on one machine would each take every core (torchrun sets one
    thread per worker only for several workers per agent); they share them, unless the user
    chose a thread count."""
    from lance_assets.launch.torchrun import local_agent_threads

    assert local_agent_threads(2, 1, 16, environ={}) == {"OMP_NUM_THREADS": "8"}
    assert local_agent_threads(4, 2, 2, environ={}) == {"OMP_NUM_THREADS": "1"}
    assert local_agent_threads(1, 1, 16, environ={}) == {}  # one agent: torchrun's own rule
    assert local_agent_threads(2, 1, 16, environ={"OMP_NUM_THREADS": "3"}) == {}
