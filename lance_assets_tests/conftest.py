import os

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

os.environ.setdefault("LANCE_LOG", "error")


def quiet(_msg: str) -> None:
    pass


@pytest.fixture
def root(tmp_path):
    return tmp_path / "data"


def write_fineweb_parquet(path, texts, start_id=0, extra=None):
    """A FineWeb-Edu-shaped parquet file: text, id, url, dump, score, int_score, ..."""
    n = len(texts)
    cols = {
        "text": pa.array(texts, pa.string()),
        "id": pa.array([f"<urn:uuid:{start_id + i:08d}>" for i in range(n)]),
        "dump": pa.array(["CC-MAIN-2024-10"] * n),
        "url": pa.array([f"https://site{i % 7}.example/{start_id + i}" for i in range(n)]),
        "score": pa.array([2.5 + (i % 5) / 2 for i in range(n)], pa.float64()),
        "int_score": pa.array([2 + i % 3 for i in range(n)], pa.int64()),
        "language": pa.array(["en"] * n),
    }
    cols.update(extra or {})
    pq.write_table(pa.table(cols), path)
    return path


@pytest.fixture(scope="session")
def tokenized_root(tmp_path_factory):
    """A small synthetic corpus, deduplicated, curated (quality signals and near-duplicate
    flags, so the default training filter, the curation rules, applies) and byte-tokenized
    (shared, read-only)."""
    from lance_assets.curation.dedup_flag import dedup_flag
    from lance_assets.curation.near_dup import near_dup
    from lance_assets.curation.quality_signals import quality_signals
    from lance_assets.ingest.raw_text import ingest
    from lance_assets.tokens.token_ids import token_ids

    root = tmp_path_factory.mktemp("tokenized") / "data"
    ingest(root, "synthetic:1500", rows_per_fragment=500, log=quiet)
    dedup_flag(root, log=quiet)
    quality_signals(root, log=quiet)
    near_dup(root, log=quiet)
    token_ids(root, "byte", log=quiet)
    return root


@pytest.fixture(scope="session")
def bpe_root(tmp_path_factory):
    """The demo corpus (synthetic, 2,000 docs), deduplicated, with a BPE trained on it and no
    token columns yet (shared: copy it before writing)."""
    from lance_assets.curation.dedup_flag import dedup_flag
    from lance_assets.ingest.raw_text import ingest
    from lance_assets.tokens.bpe import train_bpe

    root = tmp_path_factory.mktemp("bpe") / "data"
    ingest(root, "synthetic", rows_per_fragment=500, log=quiet)
    dedup_flag(root, log=quiet)
    train_bpe(root, log=quiet)
    return root
