"""Every loader A/B arm (benchmarks/) trains on the same blocks as the on-the-fly Lance loader."""

import hashlib
import subprocess
import textwrap

import pytest

from benchmarks.blocks import iter_blocks
from benchmarks.build_packed_datasets import MDS_PYTHON, ROOT, build, epoch_blocks
from benchmarks.train_arm import train_arm


def digests(batches):
    return sorted(hashlib.blake2b(row.numpy().astype("int64").tobytes(), digest_size=8).hexdigest()
                  for b in batches for row in b)


@pytest.fixture(scope="module")
def packed(tokenized_root, tmp_path_factory):
    out = tmp_path_factory.mktemp("packed")
    manifest = build(str(tokenized_root), out, seq_len=32, mds=MDS_PYTHON.exists())
    return out, manifest


def test_every_arm_holds_the_on_the_fly_epoch(tokenized_root, packed):
    out, manifest = packed
    blocks, source = epoch_blocks(str(tokenized_root), seq_len=32)
    reference = digests([__import__("torch").from_numpy(blocks)])
    assert manifest["n_blocks"] == len(blocks) == len(reference) > 100
    assert manifest["extra_copies"] >= 3 and manifest["source"]["table_version"] == source["table_version"]
    for mode in ("lance", "parquet-random", "parquet-seq"):
        got = digests(iter_blocks(mode, out, batch=512, seed=3, drop_last=False))
        assert got == reference, mode
    # the shuffle differs between epochs but the set of blocks does not
    first = next(iter_blocks("lance", out, batch=64, seed=3, epoch=0))
    second = next(iter_blocks("lance", out, batch=64, seed=3, epoch=1))
    assert not (first == second).all()


def test_mds_arm_holds_the_same_blocks(tokenized_root, packed):
    if not MDS_PYTHON.exists():
        pytest.skip("the MDS environment (scripts/mds_venv.sh) is not built")
    out, _ = packed
    blocks, _ = epoch_blocks(str(tokenized_root), seq_len=32)
    reference = digests([__import__("torch").from_numpy(blocks)])
    code = textwrap.dedent(f"""
        import hashlib, json
        from benchmarks.blocks import iter_blocks
        rows = [r for b in iter_blocks("mosaic", {str(out)!r}, batch=512, drop_last=False) for r in b]
        print(json.dumps(sorted(hashlib.blake2b(r.numpy().astype("int64").tobytes(),
                                                 digest_size=8).hexdigest() for r in rows)))
    """)
    res = subprocess.run([str(MDS_PYTHON), "-c", code], check=True, capture_output=True, text=True,
                         cwd=ROOT)
    assert __import__("json").loads(res.stdout.strip().splitlines()[-1]) == reference


def test_trainer_step_trains_on_a_prepacked_arm(tokenized_root, packed):
    """The benchmark feeds the trainer's own step function; no production flag reads the copies."""
    out, _ = packed
    result = train_arm("parquet-seq", str(tokenized_root), str(out), steps=3, batch=8, seq_len=32)
    assert result["tokens_per_s"] > 0 and 0 <= result["data_wait_share"] < 1


def test_production_trainer_has_no_prepacked_mode():
    from lance_assets.train.config import build_parser

    flags = build_parser().format_help()
    assert "--blocks-mode" not in flags and "--blocks-path" not in flags
