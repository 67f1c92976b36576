"""Every collective the trainer runs is on the training device, under a mixed-backend group.

NCCL cannot reduce CPU tensors, and no GPU runs in CI: so the trainer routes every collective
through ``Collectives`` (which refuses a tensor on another device), nothing else in the trainer
calls torch.distributed directly, and a real 2-process run under the mixed ``cpu:gloo,cuda:*``
group records the device of every tensor a collective was handed.
"""

import ast
import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

import lance_assets.train
from lance_assets.train.collectives import Collectives, backend_for

TRAIN_DIR = Path(lance_assets.train.__file__).parent
COLLECTIVES = {"all_reduce", "all_gather", "all_gather_object", "all_gather_into_tensor",
               "broadcast", "broadcast_object_list", "reduce", "reduce_scatter",
               "reduce_scatter_tensor", "gather", "gather_object", "scatter", "all_to_all",
               "barrier", "send", "recv", "isend", "irecv", "monitored_barrier"}

RECORDER = textwrap.dedent("""
    import json, os, sys
    import torch
    import torch.distributed as dist

    calls = []

    def recording(name, fn):
        def wrapper(*args, **kwargs):
            for a in list(args) + list(kwargs.values()):
                for t in (a if isinstance(a, (list, tuple)) else [a]):
                    if isinstance(t, torch.Tensor):
                        calls.append({"op": name, "device": str(t.device)})
            if name.endswith("_object"):
                calls.append({"op": name, "device": None})
            return fn(*args, **kwargs)
        return wrapper

    for name in ("all_reduce", "all_gather", "all_gather_object", "broadcast", "reduce",
                 "all_gather_into_tensor", "reduce_scatter_tensor", "broadcast_object_list"):
        setattr(dist, name, recording(name, getattr(dist, name)))

    from lance_assets.train.trainer import main
    backend = {}
    real_init = dist.init_process_group
    def init(*args, **kwargs):
        real_init(*args, **kwargs)
        backend["name"] = dist.get_backend()
    dist.init_process_group = init
    rc = main(sys.argv[2:])
    with open(f"{sys.argv[1]}/rank{os.environ['RANK']}.json", "w") as fh:
        json.dump({"rc": rc, "backend": backend.get("name"), "calls": calls}, fh)
""")


def test_collectives_refuse_a_tensor_off_the_training_device():
    comm = Collectives(torch.device("meta"), rank=0, world=2, group_open=True)
    with pytest.raises(RuntimeError, match="training device is meta"):
        comm.sum(torch.zeros(2))  # a CPU tensor on a "GPU" run: refused before NCCL sees it
    assert comm.tensor([1.0, 2.0]).device == torch.device("meta")


def test_backend_serves_both_devices():
    backend = backend_for(torch.device("cpu"))
    assert backend.startswith("cpu:gloo,cuda:")


def test_no_trainer_module_calls_torch_distributed_directly():
    """Only collectives.py may: a new collective elsewhere could hand NCCL a CPU tensor unseen."""
    offenders = []
    for path in TRAIN_DIR.glob("*.py"):
        if path.name == "collectives.py":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if (isinstance(node, ast.Attribute) and node.attr in COLLECTIVES
                    and isinstance(node.value, ast.Name) and node.value.id in {"dist", "distributed"}):
                offenders.append(f"{path.name}:{node.lineno} {node.attr}")
            if isinstance(node, ast.ImportFrom) and node.module == "torch.distributed":
                offenders += [f"{path.name}:{node.lineno} {a.name}" for a in node.names
                              if a.name in COLLECTIVES]
    assert offenders == []


def test_two_ranks_run_every_collective_on_the_training_device(tokenized_root, tmp_path):
    script = tmp_path / "record.py"
    script.write_text(RECORDER)
    out = tmp_path / "run"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
           str(script), str(tmp_path), "--data", str(tokenized_root), "--out", str(out),
           "--steps", "4", "--seq-len", "32", "--batch-size", "4", "--eval-every", "2",
           "--ckpt-every", "2", "--log-batch-hashes"]
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr[-3000:]
    for rank in (0, 1):
        got = json.loads((tmp_path / f"rank{rank}.json").read_text())
        assert got["rc"] == 0
        assert got["backend"] == backend_for(torch.device("cpu"))  # mixed: cpu:gloo,cuda:...
        ops = {c["op"] for c in got["calls"]}
        # stop flag, step totals and validation totals; loader states and batch hashes
        assert {"all_reduce", "all_gather_object"} <= ops
        devices = {c["device"] for c in got["calls"] if c["device"] is not None}
        assert devices == {"cpu"}, got["calls"]
        # 4 steps: a stop-flag check and the step totals each, 3 validation passes
        assert sum(c["op"] == "all_reduce" for c in got["calls"]) == 4 * 2 + 3
