import os

import pytest

from lance_assets_tests.helpers import quiet

os.environ.setdefault("LANCE_LOG", "error")


@pytest.fixture
def root(tmp_path):
    return tmp_path / "data"


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
