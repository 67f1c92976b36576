import pytest
import torch

from lance_assets.train import checkpoint
from lance_assets_tests.helpers import WritesAMarker


def test_atomic_save_keeps_newest_and_ignores_partial_files(tmp_path):
    for step in (10, 20, 30):
        checkpoint.save_atomic({"step": step}, tmp_path, step, keep=2)
    # a write killed half-way leaves only a hidden temp file: never taken for a checkpoint
    (tmp_path / ".ckpt_0000040.pt.tmp-123").write_bytes(b"\x80partial")
    names = [p.name for p in checkpoint.list_checkpoints(tmp_path)]
    assert names == ["ckpt_0000020.pt", "ckpt_0000030.pt"]
    newest = checkpoint.resolve_resume("auto", tmp_path)
    assert checkpoint.load(newest)["step"] == 30
    assert checkpoint.resolve_resume("auto", tmp_path / "empty") is None
    assert checkpoint.resolve_resume(None, tmp_path) is None
    with pytest.raises(FileNotFoundError, match="no such checkpoint"):
        checkpoint.resolve_resume(str(tmp_path / "nope.pt"), tmp_path)


def test_a_checkpoint_whose_unpickling_runs_code_is_refused(tmp_path):
    marker = tmp_path / "pwned"
    evil = tmp_path / "ckpt_0000010.pt"
    torch.save({"step": 10, "model": {}, "payload": WritesAMarker(str(marker))}, evil)
    with pytest.raises(checkpoint.CheckpointError, match="refused"):
        checkpoint.load(evil)
    assert not marker.exists()
    # --resume auto does not run it either: it is skipped, and nothing else is there
    logged = []
    assert checkpoint.load_for_resume("auto", tmp_path, log=logged.append) == (None, None)
    assert not marker.exists() and "skipping" in logged[0]


def resumable(step: int) -> dict:
    """A state holding every key a resume reads."""
    return {**dict.fromkeys(checkpoint.RESUME_KEYS, 0), "step": step,
            "model": {"w": torch.ones(2)}, "model_config": {}}


def test_resume_auto_skips_a_corrupt_newest_checkpoint(tmp_path):
    checkpoint.save_atomic(resumable(10), tmp_path, 10)
    newest = checkpoint.save_atomic(resumable(20), tmp_path, 20)
    newest.write_bytes(newest.read_bytes()[: 100])  # e.g. a disk that lost the tail
    logged = []
    path, state = checkpoint.load_for_resume("auto", tmp_path, log=logged.append)
    assert path.name == "ckpt_0000010.pt" and state["step"] == 10
    assert len(logged) == 1 and "ckpt_0000020.pt" in logged[0] and "skipping" in logged[0]
    # a checkpoint named explicitly must load
    with pytest.raises(checkpoint.CheckpointError, match="ckpt_0000020.pt"):
        checkpoint.load_for_resume(str(newest), tmp_path)


def test_a_file_that_is_not_a_checkpoint_is_refused(tmp_path):
    other = tmp_path / "weights.pt"
    torch.save([torch.ones(2)], other)
    with pytest.raises(checkpoint.CheckpointError, match="not a lance_assets checkpoint"):
        checkpoint.load(other)
