"""The ``input_ids`` (list<int32>) + ``n_tokens`` (int32) columns, and ``n_bytes`` (int32).

Documents are stored without EOS: the loader joins them with the tokenizer's EOS id when it
packs sequences. ``n_bytes`` is the UTF-8 length of ``text`` (its own column group, independent
of the tokenizer), so training can report bits per byte. The tokenizer's name, ids and sha256
live in the table's config (manifest key/value metadata), so the trainer and the sampler read
them from the table itself, and mixing tokenizers in one column is refused.

Speed: while fragment *i* is written and committed, the next fragment is read and encoded on a
background thread; encoding runs on ``num_threads`` threads (tiktoken's Rust core releases the
GIL) straight into numpy buffers. Per fragment, checkpointed and resumable like every column
write (``write_columns``).
"""

from __future__ import annotations

import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable

import lance
import pyarrow as pa
import pyarrow.compute as pc

from lance_assets import paths, storage
from lance_assets.corpus.columns import (
    ColumnWriteReport, ensure_columns, fragments_missing, write_columns,
)
from lance_assets.corpus.table import commit_retrying, get_json_config, set_json_config
from lance_assets.corpus.tokenizers import BPE_PREFIX, TokenizerInfo, load_tokenizer

INPUT_IDS = pa.field("input_ids", pa.list_(pa.int32()))
N_TOKENS = pa.field("n_tokens", pa.int32())
N_BYTES = pa.field("n_bytes", pa.int32())
TOKEN_COLUMNS = [INPUT_IDS.name, N_TOKENS.name]
TOKENIZER_KEY = "lance_assets.tokenizer"
ENCODE_BATCH_ROWS = 2048
FRAGMENTS_AHEAD = 1  # fragments encoded ahead of the one being written


class TokenizerMismatchError(ValueError):
    pass


@dataclass
class TokenIdsReport(ColumnWriteReport):
    tokenizer_choice: str = ""  # which tokenizer was used, and why
    bytes_tokenized: int = 0
    n_bytes_fragments_written: int = 0
    replaced: bool = False  # token columns of another tokenizer were dropped first

    @property
    def nothing_to_do(self) -> bool:
        return not self.fragments_written and not self.n_bytes_fragments_written


def table_tokenizer(ds: lance.LanceDataset) -> TokenizerInfo | None:
    meta = get_json_config(ds, TOKENIZER_KEY)
    return TokenizerInfo(**meta) if meta else None


def has_token_data(ds: lance.LanceDataset) -> bool:
    """True when at least one fragment holds ``input_ids`` values."""
    return INPUT_IDS.name in ds.schema.names and len(
        fragments_missing(ds, TOKEN_COLUMNS)) < len(ds.get_fragments())


def choose_tokenizer(root: str | Path, requested: str, ds: lance.LanceDataset) -> tuple[str, str]:
    """(tokenizer name, why). ``auto``: the tokenizer the column already holds, else the trained
    BPE (``tokenizer`` asset), else ``byte``."""
    from lance_assets.corpus.bpe import latest_sha

    if requested != "auto":
        return requested, f"requested: {requested}"
    current = table_tokenizer(ds)
    if current is not None and has_token_data(ds):
        return current.name, "auto: the tokenizer input_ids already hold"
    sha = latest_sha(root)
    if sha:
        return BPE_PREFIX + sha, "auto: the trained BPE (tokenizer asset, tokenizers/LATEST)"
    return "byte", "auto: byte (no trained BPE under tokenizers/; materialize `tokenizer`)"


def _keep_bpe_file(root: str | Path, name: str, tok) -> None:
    """A BPE loaded from elsewhere is copied under DATA/tokenizers/ so its name resolves there."""
    if not tok.info.name.startswith(BPE_PREFIX):
        return
    from lance_assets.corpus.bpe import resolve_path

    target = paths.tokenizers_dir(root) / f"{tok.info.sha256}.json"
    if not target.is_file():
        storage.write_atomic(target, resolve_path(name, root).read_bytes())


def _mismatch_message(uri: str, current: TokenizerInfo, name: str) -> str:
    return (
        f"{uri}: input_ids hold tokenizer {current.name!r} (sha256 {current.sha256[:12]}), not "
        f"{name!r}; one column holds one tokenizer. To re-tokenize, either run token_ids with "
        "replace=True (asset run config `replace: true`): input_ids/n_tokens are dropped in a new "
        "table version (older versions, and training runs pinned to them, keep the old tokens) "
        "and every fragment is tokenized again; or tokenize into a new table (another "
        f"LANCE_ASSETS_DATA). To keep the current tokens use tokenizer='auto' or {current.name!r}."
    )


def _n_bytes(frag) -> list[pa.RecordBatch]:
    text = frag.to_table(columns=["text"]).column("text")
    lengths = pc.binary_length(text).cast(pa.int32())
    return [pa.RecordBatch.from_arrays([lengths.combine_chunks()], schema=pa.schema([N_BYTES]))]


def token_ids(
    root: str | Path,
    tokenizer: str = "auto",
    *,
    fragments_per_commit: int = 4,
    replace: bool = False,
    num_threads: int | None = None,
    log: Callable[[str], None] = print,
) -> tuple[TokenIdsReport, TokenizerInfo, int]:
    """Write ``n_bytes`` and the token columns for every fragment lacking them; returns
    (report, tokenizer, tokens written)."""
    start = time.perf_counter()
    uri = paths.table_uri(root)
    ds = lance.dataset(uri)
    name, why = choose_tokenizer(root, tokenizer, ds)
    tok = load_tokenizer(name, root, num_threads=num_threads)
    _keep_bpe_file(root, name, tok)
    current = table_tokenizer(ds)
    replaced = False
    if current is not None and current.sha256 != tok.info.sha256 and has_token_data(ds):
        if not replace:
            raise TokenizerMismatchError(_mismatch_message(uri, current, name))
        log(f"replace: dropping {TOKEN_COLUMNS} ({current.name}) at version {ds.version}; "
            "older versions keep them")
        commit_retrying("drop token columns", lambda: lance.dataset(uri).drop_columns(
            [c for c in TOKEN_COLUMNS if c in lance.dataset(uri).schema.names]))
        ds = lance.dataset(uri)
        replaced = True
    if current != tok.info:
        set_json_config(ds, TOKENIZER_KEY, tok.info.to_dict())
    log(f"tokenizer {tok.info.name} ({why})")

    bytes_report = write_columns(uri, [N_BYTES], _n_bytes,
                                 fragments_per_commit=fragments_per_commit, log=log)

    totals = {"tokens": 0, "bytes": 0}

    def encode_fragment(frag) -> tuple[list[pa.RecordBatch], int, int]:
        batches, tokens, n_bytes = [], 0, 0
        for batch in frag.to_batches(columns=["text"], batch_size=ENCODE_BATCH_ROWS):
            text = batch.column("text")
            ids = tok.encode_batch(text)
            lengths = pc.list_value_length(ids).cast(pa.int32())
            tokens += len(ids.values)
            n_bytes += int(pc.sum(pc.binary_length(text)).as_py() or 0)
            batches.append(pa.RecordBatch.from_arrays(
                [ids, lengths], schema=pa.schema([INPUT_IDS, N_TOKENS])))
        return batches, tokens, n_bytes

    ds = ensure_columns(uri, [INPUT_IDS, N_TOKENS])
    order = fragments_missing(ds, TOKEN_COLUMNS)
    position = {f.fragment_id: i for i, f in enumerate(order)}
    ahead = ThreadPoolExecutor(1, thread_name_prefix="token_ids")
    pending: dict[int, Future] = {}

    def compute(frag):
        # write_columns asks for fragments in `order`; keep the next ones encoding meanwhile.
        i = position.get(frag.fragment_id)
        if i is None:
            batches, tokens, n_bytes = encode_fragment(frag)
        else:
            for nxt in order[i : i + 1 + FRAGMENTS_AHEAD]:
                if nxt.fragment_id not in pending:
                    pending[nxt.fragment_id] = ahead.submit(encode_fragment, nxt)
            batches, tokens, n_bytes = pending.pop(frag.fragment_id).result()
        totals["tokens"] += tokens
        totals["bytes"] += n_bytes
        return batches

    try:
        report = write_columns(uri, [INPUT_IDS, N_TOKENS], compute,
                               fragments_per_commit=fragments_per_commit, log=log)
    finally:
        ahead.shutdown(wait=True, cancel_futures=True)
    out = TokenIdsReport(**asdict(report), tokenizer_choice=why, bytes_tokenized=totals["bytes"],
                         n_bytes_fragments_written=len(bytes_report.fragments_written),
                         replaced=replaced)
    out.version = lance.dataset(uri).version
    out.duration_s = time.perf_counter() - start
    return out, tok.info, totals["tokens"]
