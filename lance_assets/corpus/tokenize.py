"""The ``input_ids`` (list<int32>) and ``n_tokens`` (int32) columns.

Documents are stored without EOS: the loader joins them with the tokenizer's EOS id when it
packs sequences. The tokenizer's name, ids and hash live in the table's config (manifest key/value metadata), so the
trainer and the sampler read them from the table itself, and mixing tokenizers is refused.
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable, Iterator

import lance
import pyarrow as pa
import pyarrow.compute as pc

from lance_assets import paths
from lance_assets.corpus.columns import ColumnWriteReport, fragments_missing, write_columns
from lance_assets.corpus.table import get_json_config, set_json_config
from lance_assets.corpus.tokenizers import TokenizerInfo, load_tokenizer

INPUT_IDS = pa.field("input_ids", pa.list_(pa.int32()))
N_TOKENS = pa.field("n_tokens", pa.int32())
TOKENIZER_KEY = "lance_assets.tokenizer"
ENCODE_BATCH_ROWS = 1024


class TokenizerMismatchError(ValueError):
    pass


def table_tokenizer(ds: lance.LanceDataset) -> TokenizerInfo | None:
    meta = get_json_config(ds, TOKENIZER_KEY)
    return TokenizerInfo(**meta) if meta else None


def token_ids(
    root: str | Path,
    tokenizer: str = "byte",
    *,
    fragments_per_commit: int = 4,
    log: Callable[[str], None] = print,
) -> tuple[ColumnWriteReport, TokenizerInfo, int]:
    """Tokenize every fragment lacking ``input_ids``; returns (report, tokenizer, tokens written)."""
    uri = paths.table_uri(root)
    tok = load_tokenizer(tokenizer)
    ds = lance.dataset(uri)
    current = table_tokenizer(ds)
    if current is not None and current.sha256 != tok.info.sha256:
        has_data = "input_ids" in ds.schema.names and len(
            fragments_missing(ds, ["input_ids", "n_tokens"])) < len(ds.get_fragments())
        if has_data:
            raise TokenizerMismatchError(
                f"{uri}: input_ids were written with tokenizer {current.name!r} "
                f"(sha256 {current.sha256[:12]}), not {tokenizer!r}. One column holds one "
                f"tokenizer: keep tokenizer={current.name!r}, or re-tokenize into a fresh table "
                "(a new LANCE_ASSETS_DATA) or after dropping the columns "
                "(lance.dataset(uri).drop_columns(['input_ids', 'n_tokens']))."
            )
    if current != tok.info:
        set_json_config(ds, TOKENIZER_KEY, tok.info.to_dict())
    tokens = 0

    def compute(frag) -> Iterator[pa.RecordBatch]:
        nonlocal tokens
        for batch in frag.to_batches(columns=["text"], batch_size=ENCODE_BATCH_ROWS):
            ids = tok.encode_batch(batch.column("text"))
            lengths = pc.list_value_length(ids).cast(pa.int32())
            tokens += pc.sum(lengths).as_py() or 0
            yield pa.RecordBatch.from_arrays([ids, lengths], schema=pa.schema([INPUT_IDS, N_TOKENS]))

    report = write_columns(
        uri, [INPUT_IDS, N_TOKENS], compute, fragments_per_commit=fragments_per_commit, log=log
    )
    return report, tok.info, tokens
