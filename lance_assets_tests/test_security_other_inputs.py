"""The remaining doors for user text and files: the forensics pin reading a checkpoint someone
handed over, and the tokenizer asset's training-sample filter."""

import subprocess
import sys

import pytest
import torch

from lance_assets import paths
from lance_assets.forensics import pinned
from lance_assets.ingest.raw_text import ingest
from lance_assets.table import Table
from lance_assets.tokens.bpe import train_bpe
from lance_assets.train.checkpoint import CheckpointError
from lance_assets_tests.helpers import WritesAMarker, quiet


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    root = tmp_path_factory.mktemp("inputs") / "data"
    ingest(Table.of(root), "synthetic:200", rows_per_fragment=100, log=quiet)
    return root


def test_a_pinned_checkpoint_that_would_run_code_is_refused(root, tmp_path):
    """A run folder without summary.json: the pin reads the checkpoint itself, weights-only."""
    marker = tmp_path / "pwned"
    run = paths.train_dir(root) / "handed-over"
    run.mkdir(parents=True)
    evil = run / "ckpt_0000010.pt"
    torch.save({"step": 10, "table_version": 1, "payload": WritesAMarker(str(marker))}, evil)
    paths.latest_checkpoint_pointer(root).write_text(str(evil))
    with pytest.raises(CheckpointError, match="refused"):
        pinned.model_run(Table.of(root))
    assert not marker.exists()
    proc = subprocess.run([sys.executable, "-m", "lance_assets.forensics", "search", "anything",
                           "--data", str(root)], capture_output=True, text=True, timeout=300)
    assert not marker.exists()
    assert proc.returncode == 1 and "Traceback" not in proc.stderr
    assert proc.stderr.startswith("error: ") and "refused" in proc.stderr, proc.stderr
    paths.latest_checkpoint_pointer(root).unlink()


@pytest.mark.parametrize("hostile", [
    "1=1); DROP TABLE corpus; --",
    "id IN (SELECT id FROM read_text('/etc/passwd'))",
    "n_chars > 0) OR (1=1",
])
def test_the_tokenizer_sample_filter_is_parsed_not_pasted(root, hostile):
    with pytest.raises(ValueError, match="filter"):
        train_bpe(Table.of(root), vocab_size=300, filter=hostile, log=quiet)
    assert not paths.tokenizers_dir(root).exists() or not any(paths.tokenizers_dir(root).iterdir())
