import pytest

from lance_assets.train import checkpoint


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
