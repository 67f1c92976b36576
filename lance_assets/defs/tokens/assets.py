"""``tokenizer``: a BPE trained on the curated text (``tokens/bpe.py``). ``token_ids`` is a
column producer (``tokens/token_ids.py``), made into an asset by ``defs/columns.py``."""

import dagster as dg

from lance_assets.defs.common import DEDUP_FLAG, TABLE_TAGS
from lance_assets.defs.common import TOKENS_GROUP as GROUP
from lance_assets.defs.conditions import ON_NEW_DATA
from lance_assets.defs.config import RunConfig
from lance_assets.defs.metadata import data_version
from lance_assets.defs.resources import LanceStore
from lance_assets.markdown import markdown_table
from lance_assets.tokens import bpe, load_bpe


class TokenizerConfig(RunConfig):
    vocab_size: int = bpe.DEFAULT_VOCAB_SIZE
    """Ids including EOS and PAD. 8192 by default; 32768 recommended for real corpora. The demo's
    synthetic corpus runs out of pairs to merge near 1,060 ids (every distinct word is a token):
    the BPE stops there and says so (`saturated`)."""
    max_train_bytes: int = bpe.DEFAULT_MAX_TRAIN_BYTES
    """Upper bound on the training sample: a fixed 1-in-k subset by id when the corpus is larger."""
    filter: str = bpe.DEFAULT_FILTER
    """SQL over the table: which documents the BPE is trained on (curated text)."""
    heldout_max_bytes: int = bpe.DEFAULT_HELDOUT_MAX_BYTES
    """Held-out text (`id % 20 = 0`, never trained on) used to measure bytes/token."""
    retrain: bool = False
    """Train again even though the newest BPE has these settings and `input_ids` use it (new
    rows since). `token_ids` keeps the old one until run with `replace: true`."""


@dg.asset(deps=[DEDUP_FLAG], group_name=GROUP, kinds={"python", "lance"}, code_version="1",
          tags=TABLE_TAGS, automation_condition=ON_NEW_DATA)
def tokenizer(context: dg.AssetExecutionContext, config: TokenizerConfig, lance_store: LanceStore):
    """A byte-level BPE (rustbpe, GPT-4 split pattern) trained on a bounded sample of the curated
    text, exported as a tiktoken encoding with `<|endoftext|>` (EOS) and `<|pad|>` (PAD). Saved as
    DATA/tokenizers/<sha256>.json; `token_ids` uses it by default. Reports bytes/token on
    held-out text for this BPE, for bytes and for cl100k_base. Re-running trains again only when
    the settings change, or the table changed and its `input_ids` do not use this BPE yet."""
    report = bpe.train_bpe(lance_store.table, vocab_size=config.vocab_size,
                           max_train_bytes=config.max_train_bytes, filter=config.filter,
                           heldout_max_bytes=config.heldout_max_bytes, retrain=config.retrain,
                           log=context.log.info)
    bpt = report.bytes_per_token
    rows = [{"tokenizer": name, "bytes/token": value,
             "vs byte": round(value / bpt["byte"], 2) if value and bpt.get("byte") else None}
            for name, value in bpt.items()]
    tok = load_bpe(report.path)
    # its output is the BPE file: a retrain that learns the same merges keeps the data version
    version = data_version(context, lance_store.table.newest().version, report.sha256[:12])
    return dg.MaterializeResult(data_version=version, metadata={
        "nothing_to_do": report.nothing_to_do,
        "tokenizer_name": report.name,
        "tokenizer_sha256": report.sha256,
        "path": dg.MetadataValue.path(report.path),
        "vocab_size": report.vocab_size,
        "vocab_size_requested": report.vocab_size_requested,
        "saturated": report.saturated,
        "merges": report.merges,
        "eos_id": report.eos_id,
        "pad_id": report.pad_id,
        "train_s": report.train_s,
        "train_docs": report.train_docs,
        "train_bytes": report.train_bytes,
        "heldout_docs": report.heldout_docs,
        "heldout_bytes": report.heldout_bytes,
        "bytes_per_token": dg.MetadataValue.md(markdown_table(rows)),
        **{f"bytes_per_token_{name}": value for name, value in bpt.items()},
        "bpe_vs_byte": round(bpt["bpe"] / bpt["byte"], 2) if bpt.get("bpe") and bpt.get("byte")
        else None,
        # lengths only: a learned token may be a word of one document, which `forget` could
        # not erase from the instance's records
        "longest_token_bytes": dg.MetadataValue.json(bpe.longest_token_lengths(tok)),
        "duration_s": round(report.duration_s, 3),
    })
