"""The ``input_ids`` (list<int32>) + ``n_tokens`` (int32) columns, and ``n_bytes`` (int32).

Documents are stored without EOS: the loader joins them with the tokenizer's EOS id when it
packs sequences. ``n_bytes`` is the UTF-8 length of ``text`` (its own column group, independent
of the tokenizer), so training can report bits per byte. The tokenizer's name, ids and sha256
live in the table's config (manifest key/value metadata), so the trainer and the sampler read
them from the table itself, and mixing tokenizers in one column is refused.

Speed: while fragment *i* is written and committed, the next fragment is read and encoded on a
background thread; encoding runs on ``num_threads`` threads (tiktoken's Rust core releases the
GIL) straight into numpy buffers. Under the ``ray`` executor each fragment is encoded by a Ray
task instead (one tokenizer thread per task, the tokenizer loaded once per worker). Per
fragment, checkpointed and resumable like every column write (``write_columns``).

``redact_pii``: the text handed to the tokenizer has every span of ``pii_spans`` (the ``personal_data``
asset) replaced by its placeholder (``<EMAIL>``, ``<PHONE>``, ``<IP_ADDRESS>``,
``<CARD_NUMBER>``); ``text`` itself never changes, and ``n_bytes`` stays the length of ``text``.
Whether ``input_ids`` were redacted is recorded in the table's config next to the tokenizer, and
mixing redacted and unredacted fragments in one column is refused like a tokenizer change.
"""

from __future__ import annotations

import dataclasses
import os
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import asdict, dataclass
from typing import Union

import lance
import pyarrow as pa
import pyarrow.compute as pc

from lance_assets import keys
from lance_assets.curation.personal_data import PII_SPANS, PLACEHOLDERS, redact
from lance_assets.markdown import markdown_table
from lance_assets.table import Table, get_json_config
from lance_assets.table.columns import (
    ColumnWriteReport,
    ensure_columns,
    fragments_missing,
    write_columns,
)
from lance_assets.table.executor import executor_name
from lance_assets.table.producer import ColumnProducer, Markdown, Produced, WriteOptions, setting
from lance_assets.tokens.tokenizers import (
    BPE_PREFIX,
    TokenizerInfo,
    choose_tokenizer,
    has_token_data,
    keep_bpe_file,
    load_tokenizer,
    table_tokenizer,
)

INPUT_IDS = pa.field(keys.INPUT_IDS, pa.list_(pa.int32()))
N_TOKENS = pa.field(keys.N_TOKENS, pa.int32())
N_BYTES = pa.field(keys.N_BYTES, pa.int32())
DESCRIPTIONS = {
    INPUT_IDS.name: "Token ids of `text` under the tokenizer recorded in the table's config; "
                    "no EOS (the loader adds it when packing).",
    N_TOKENS.name: "Length of `input_ids`.",
    N_BYTES.name: "UTF-8 bytes of `text` (for bits per byte, independent of the tokenizer).",
}
TOKEN_COLUMNS = [INPUT_IDS.name, N_TOKENS.name]
ENCODE_BATCH_ROWS = 2048
FRAGMENTS_AHEAD = 1  # fragments encoded ahead of the one being written


class TokenizerMismatchError(ValueError):
    pass


def redaction_setting(redact_pii: bool) -> dict:
    """What the table's config records about redaction (placeholders included: other
    placeholders are other tokens)."""
    return {"redact_pii": bool(redact_pii), "placeholders": dict(PLACEHOLDERS) if redact_pii else {}}


def table_redaction(ds: lance.LanceDataset) -> dict:
    """The redaction ``input_ids`` hold; tables tokenized before redaction existed are not."""
    return get_json_config(ds, keys.TOKEN_REDACTION_KEY) or redaction_setting(False)


def _redaction_message(uri: str, current: dict, wanted: dict) -> str:
    said = "with" if current["redact_pii"] else "without"
    return (f"{uri}: input_ids were tokenized {said} PII redaction ({current}), not {wanted}; one "
            "column holds one kind of text. Run token_ids with the stored redact_pii, or with "
            "replace: true to drop input_ids/n_tokens in a new table version and tokenize every "
            "fragment again.")


@dataclass
class TokenIdsReport(ColumnWriteReport):
    tokenizer_choice: str = ""  # which tokenizer was used, and why
    bytes_tokenized: int = 0
    n_bytes_fragments_written: int = 0
    replaced: bool = False  # token columns of another tokenizer were dropped first

    @property
    def nothing_to_do(self) -> bool:
        return not self.fragments_written and not self.n_bytes_fragments_written


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


_TOKENIZERS: dict[tuple, object] = {}


@dataclass(frozen=True)
class TokenEncoder:
    """``input_ids`` + ``n_tokens`` of one fragment. Picklable: a Ray worker loads the tokenizer
    itself (once per process) by name from the data root, and checks it is the driver's."""

    name: str
    root: str
    sha256: str
    num_threads: int | None = None
    redact_pii: bool = False

    @property
    def key(self) -> tuple:
        return (self.name, self.root, self.sha256, self.num_threads)

    def tokenizer(self):
        if self.key not in _TOKENIZERS:
            tok = load_tokenizer(self.name, self.root, num_threads=self.num_threads)
            if tok.info.sha256 != self.sha256:
                raise TokenizerMismatchError(
                    f"tokenizer {self.name!r} under {self.root} has sha256 "
                    f"{tok.info.sha256[:12]} here, {self.sha256[:12]} on the driver; every "
                    "worker must see the same data root")
            _TOKENIZERS[self.key] = tok
        return _TOKENIZERS[self.key]

    def __call__(self, frag) -> list[pa.RecordBatch]:
        tok = self.tokenizer()
        batches = []
        columns = ["text", PII_SPANS.name] if self.redact_pii else ["text"]
        for batch in frag.to_batches(columns=columns, batch_size=ENCODE_BATCH_ROWS):
            text = batch.column("text")
            if self.redact_pii:
                spans = batch.column(PII_SPANS.name)
                if spans.null_count:
                    raise ValueError(f"fragment {frag.fragment_id}: {spans.null_count} row(s) "
                                     "have no pii_spans; materialize `personal_data` before token_ids "
                                     "with redact_pii")
                text = redact(text, spans)
            ids = tok.encode_batch(text)
            lengths = pc.list_value_length(ids).cast(pa.int32())
            batches.append(pa.RecordBatch.from_arrays(
                [ids, lengths], schema=pa.schema([INPUT_IDS, N_TOKENS])))
        return batches


class EncodeAhead:
    """The local path: while fragment *i* is written and committed, the next ones are encoded
    on a background thread (``write_columns`` asks for fragments in ``order``)."""

    def __init__(self, encoder: TokenEncoder, order: list, pool: ThreadPoolExecutor) -> None:
        self.encoder, self.order, self.pool = encoder, order, pool
        self.position = {f.fragment_id: i for i, f in enumerate(order)}
        self.pending: dict[int, Future] = {}

    def __call__(self, frag) -> list[pa.RecordBatch]:
        i = self.position.get(frag.fragment_id)
        if i is None:
            return self.encoder(frag)
        for nxt in self.order[i : i + 1 + FRAGMENTS_AHEAD]:
            if nxt.fragment_id not in self.pending:
                self.pending[nxt.fragment_id] = self.pool.submit(self.encoder, nxt)
        return self.pending.pop(frag.fragment_id).result()


def _written_totals(table: Table, fragment_ids: list[int]) -> tuple[int, int]:
    """(tokens, bytes) of the fragments this run wrote, read back from the table."""
    if not fragment_ids:
        return 0, 0
    ds = table.newest()
    wanted = set(fragment_ids)
    frags = [f for f in ds.get_fragments() if f.fragment_id in wanted]
    t = ds.scanner(columns=[N_TOKENS.name, N_BYTES.name], fragments=frags).to_table()
    return (int(pc.sum(t.column(N_TOKENS.name)).as_py() or 0),
            int(pc.sum(t.column(N_BYTES.name)).as_py() or 0))


def token_ids(
    table: Union[Table, str, os.PathLike],
    tokenizer: str = "auto",
    *,
    fragments_per_commit: int | None = None,
    replace: bool = False,
    num_threads: int | None = None,
    redact_pii: bool = False,
    executor: str | None = None,
    log: Callable[[str], None] = print,
) -> tuple[TokenIdsReport, TokenizerInfo, int]:
    """Write ``n_bytes`` and the token columns for every fragment lacking them; returns
    (report, tokenizer, tokens written). ``redact_pii``: tokenize the text with the ``personal_data``
    spans replaced by placeholders. ``table``: a ``Table`` or a data root (the tokenizers live
    under the table's data root)."""
    start = time.perf_counter()
    table = Table.of(table)
    root = table.root
    uri = table.uri
    ds = table.newest()  # a clear error when raw_text has not run yet
    name, why = choose_tokenizer(root, tokenizer, ds)
    tok = load_tokenizer(name, root, num_threads=num_threads)
    keep_bpe_file(root, name, tok)
    current = table_tokenizer(ds)
    redaction, current_redaction = redaction_setting(redact_pii), table_redaction(ds)
    if redact_pii and PII_SPANS.name not in ds.schema.names:
        raise ValueError(f"{uri} has no pii_spans: materialize `personal_data` before token_ids with "
                         "redact_pii")
    replaced = False
    other_tokenizer = current is not None and current.sha256 != tok.info.sha256
    if (other_tokenizer or current_redaction != redaction) and has_token_data(ds):
        if not replace:
            raise TokenizerMismatchError(_mismatch_message(uri, current, name) if other_tokenizer
                                         else _redaction_message(uri, current_redaction,
                                                                 redaction))
        log(f"replace: dropping {TOKEN_COLUMNS} ({current.name}) at version {ds.version}; "
            "older versions keep them")
        table.commit("drop token columns", lambda ds: ds.drop_columns(
            [c for c in TOKEN_COLUMNS if c in ds.schema.names]))
        ds = table.newest()
        replaced = True
    if current != tok.info:
        table.set_config(keys.TOKENIZER_KEY, tok.info.to_dict())
        ds = table.newest()
    if get_json_config(ds, keys.TOKEN_REDACTION_KEY) != redaction:
        table.set_config(keys.TOKEN_REDACTION_KEY, redaction)
    log(f"tokenizer {tok.info.name} ({why}){', PII redacted' if redact_pii else ''}")

    bytes_report = write_columns(table, [N_BYTES], _n_bytes, fragments_per_commit=fragments_per_commit,
                                 executor=executor, log=log)

    encoder = TokenEncoder(tok.info.name if tok.info.name.startswith(BPE_PREFIX) else name,
                           str(root), tok.info.sha256, num_threads, redact_pii)
    ds = ensure_columns(table, [INPUT_IDS, N_TOKENS])
    if executor_name(executor) == "ray":
        # one task per CPU: the parallelism is in the tasks, not in each task's threads
        compute = dataclasses.replace(encoder, num_threads=1)
        ahead = None
    else:
        _TOKENIZERS[encoder.key] = tok  # already loaded: the local path reuses it
        ahead = ThreadPoolExecutor(1, thread_name_prefix="token_ids")
        compute = EncodeAhead(encoder, fragments_missing(ds, TOKEN_COLUMNS), ahead)
    try:
        report = write_columns(table, [INPUT_IDS, N_TOKENS], compute,
                               fragments_per_commit=fragments_per_commit, executor=executor,
                               log=log)
    finally:
        if ahead is not None:
            ahead.shutdown(wait=True, cancel_futures=True)
    tokens, n_bytes = _written_totals(table, report.fragments_written)
    out = TokenIdsReport(**asdict(report), tokenizer_choice=why, bytes_tokenized=n_bytes,
                         n_bytes_fragments_written=len(bytes_report.fragments_written),
                         replaced=replaced)
    out.version = table.newest().version
    out.duration_s = time.perf_counter() - start
    return out, tok.info, tokens


@dataclass(frozen=True)
class TokenIdsSettings:
    tokenizer: str = setting(
        "auto", "`auto` (the tokenizer `input_ids` already hold, else the trained BPE of the "
        "`tokenizer` asset, else `byte`), `byte`, `bpe` (the newest trained BPE), "
        "`bpe:<sha256>`, or a tiktoken encoding available offline (`cl100k_base`; `gpt2`, "
        "`r50k_base` when in tiktoken's cache).")
    replace: bool = setting(
        False, "When `input_ids` hold another tokenizer: drop them in a new table version and "
        "tokenize every fragment again (otherwise that is refused).")
    redact_pii: bool = setting(
        False, "Tokenize the text with the `personal_data` spans replaced by placeholders "
        "(<EMAIL>, <PHONE>, <IP_ADDRESS>, <CARD_NUMBER>); `text` never changes. Recorded in the "
        "table's config: switching it on or off later needs `replace: true`.")


def write(table: Table, settings: TokenIdsSettings, options: WriteOptions) -> Produced:
    report, info, tokens = token_ids(
        table, settings.tokenizer, fragments_per_commit=options.fragments_per_commit,
        replace=settings.replace, redact_pii=settings.redact_pii, executor=options.executor,
        log=options.log)
    seconds = report.duration_s
    return Produced(write=report, summary={
        "tokens_written": tokens,
        "tokens_per_s": round(tokens / seconds, 1) if seconds else 0.0,
        "mb_per_s": round(report.bytes_tokenized / 1e6 / seconds, 2) if seconds else 0.0,
        "bytes_per_token": round(report.bytes_tokenized / tokens, 3) if tokens else None,
        "tokenizer_choice": report.tokenizer_choice,
        "replaced": report.replaced,
        "pii_redacted": settings.redact_pii,
        "tokenizer": Markdown(markdown_table([info.to_dict()])),
        "tokenizer_name": info.name,
        "tokenizer_sha256": info.sha256,
        "eos_id": info.eos_id,
        "pad_id": info.pad_id,
        "vocab_size": info.vocab_size,
    })


PRODUCER = ColumnProducer(
    name="token_ids",
    doc="`input_ids` (list<int32>, no EOS: the loader adds it when packing), `n_tokens` (int32) "
        "and `n_bytes` (int32, UTF-8 length of `text`, for bits per byte). The tokenizer (name, "
        "EOS/PAD ids, sha256) is recorded in the table's config; by default the trained BPE.",
    fields=[N_BYTES, INPUT_IDS, N_TOKENS], descriptions=DESCRIPTIONS, write=write,
    settings=TokenIdsSettings, deps=("dedup_flag", "tokenizer", "personal_data"), group="corpus",
    version="2")
