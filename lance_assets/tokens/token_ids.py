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
fragment, checkpointed and resumable like every column write (``write_columns``), on one pinned
version: rows ingested meanwhile wait for the next run.

``redact_pii``: the text handed to the tokenizer has every span of ``pii_spans`` (the ``personal_data``
asset) replaced by its placeholder (``<EMAIL>``, ``<PHONE>``, ``<IP_ADDRESS>``,
``<CARD_NUMBER>``); ``text`` itself never changes, and ``n_bytes`` stays the length of ``text``.
Whether ``input_ids`` were redacted is recorded in the table's config next to the tokenizer, and
mixing redacted and unredacted fragments in one column is refused like a tokenizer change.
"""

from __future__ import annotations

import dataclasses
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import asdict, dataclass
from typing import Any

import lance
import pyarrow as pa
import pyarrow.compute as pc

from lance_assets import keys
from lance_assets.curation.personal_data import PII_SPANS, PLACEHOLDERS, redact
from lance_assets.markdown import Markdown, markdown_table
from lance_assets.table import Table, get_json_config
from lance_assets.table.columns import ColumnWriteReport, ensure_columns, fragments_missing
from lance_assets.table.producer import ColumnProducer, Run, Step, setting
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
    """The token step's write, counting the ``n_bytes`` fragments too, with the tokenizer."""

    tokenizer: TokenizerInfo | None = None
    tokenizer_choice: str = ""  # which tokenizer was used, and why
    tokens_written: int = 0
    bytes_tokenized: int = 0
    n_bytes_fragments_written: int = 0
    replaced: bool = False  # token columns of another tokenizer were dropped first
    pii_redacted: bool = False

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

    def close(self) -> None:
        """When the write ends (done or failed): stop encoding ahead."""
        self.pool.shutdown(wait=True, cancel_futures=True)

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
    num_threads: int | None = setting(
        None, "Tokenizer threads in this process (default: its cores).", run_config=False)


@dataclass
class Tokenizer:
    """The first step's state: the tokenizer this run writes with, recorded in the table's
    config (the token columns of another one dropped first, when asked)."""

    tok: Any
    name: str  # as chosen (``bpe:<sha256>``, ``byte``...)
    why: str
    replaced: bool


def prepare_tokenizer(run: Run, before: None) -> Tokenizer:
    """The first step's state, on the pinned version: choose and load the tokenizer, refuse to
    mix tokenizers or redactions in one column (or drop the old columns with ``replace``), and
    record it in the table's config before the first value is written."""
    table, settings, log = run.table, run.settings, run.log
    root, uri, ds = table.root, table.uri, run.pinned
    redact_pii = settings.redact_pii
    name, why = choose_tokenizer(root, settings.tokenizer, ds)
    tok = load_tokenizer(name, root, num_threads=settings.num_threads)
    keep_bpe_file(root, name, tok)
    current = table_tokenizer(ds)
    redaction, current_redaction = redaction_setting(redact_pii), table_redaction(ds)
    if redact_pii and PII_SPANS.name not in ds.schema.names:
        raise ValueError(f"{uri} has no pii_spans: materialize `personal_data` before token_ids with "
                         "redact_pii")
    replaced = False
    other_tokenizer = current is not None and current.sha256 != tok.info.sha256
    if (other_tokenizer or current_redaction != redaction) and has_token_data(ds):
        if not settings.replace:
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
    return Tokenizer(tok, name, why, replaced)


@dataclass
class BytesCounted:
    """The ``n_bytes`` step's result: the tokenizer, and the fragments it wrote."""

    tokenizer: Tokenizer
    fragments_written: int


@dataclass
class Encoding:
    """The token step's state: its compute, and what the steps before gave."""

    compute: TokenEncoder | EncodeAhead
    counted: BytesCounted


def plan_encoding(run: Run, counted: BytesCounted) -> Encoding:
    """The token step's state (its compute): a Ray task per fragment, one tokenizer thread
    each; locally, the next fragments encoded ahead on a thread while one is committed."""
    tok, name = counted.tokenizer.tok, counted.tokenizer.name
    encoder = TokenEncoder(tok.info.name if tok.info.name.startswith(BPE_PREFIX) else name,
                           str(run.table.root), tok.info.sha256, run.settings.num_threads,
                           run.settings.redact_pii)
    ds = ensure_columns(run.table, [INPUT_IDS, N_TOKENS])
    if run.where == "ray":
        # one task per CPU: the parallelism is in the tasks, not in each task's threads
        return Encoding(dataclasses.replace(encoder, num_threads=1), counted)
    _TOKENIZERS[encoder.key] = tok  # already loaded: the local path reuses it
    pinned = {f.fragment_id: f.physical_rows for f in run.pinned.get_fragments()}
    order = [f for f in fragments_missing(ds, TOKEN_COLUMNS)
             if pinned.get(f.fragment_id) == f.physical_rows]  # what the write asks for
    pool = ThreadPoolExecutor(1, thread_name_prefix="token_ids")
    return Encoding(EncodeAhead(encoder, order, pool), counted)


def token_report(run: Run, encoding: Encoding, written: ColumnWriteReport) -> TokenIdsReport:
    """The run's report: the token step's write, counting the ``n_bytes`` fragments too, with
    the tokens and bytes of the fragments it wrote."""
    tokenizer = encoding.counted.tokenizer
    tokens, n_bytes = _written_totals(run.table, written.fragments_written)
    out = TokenIdsReport(**asdict(written), tokenizer=tokenizer.tok.info,
                         tokenizer_choice=tokenizer.why, tokens_written=tokens,
                         bytes_tokenized=n_bytes,
                         n_bytes_fragments_written=encoding.counted.fragments_written,
                         replaced=tokenizer.replaced, pii_redacted=run.settings.redact_pii)
    out.version = run.table.newest().version
    return out


STEPS = (
    Step(fields=[N_BYTES], state=prepare_tokenizer, compute=lambda settings, tokenizer: _n_bytes,
         after=lambda run, tokenizer, written: BytesCounted(tokenizer,
                                                            len(written.fragments_written))),
    Step(fields=[INPUT_IDS, N_TOKENS], state=plan_encoding,
         compute=lambda settings, encoding: encoding.compute, after=token_report),
)


def summary(table: Table, report: TokenIdsReport) -> dict:
    info, tokens, seconds = report.tokenizer, report.tokens_written, report.duration_s
    return {
        "tokens_written": tokens,
        "tokens_per_s": round(tokens / seconds, 1) if seconds else 0.0,
        "mb_per_s": round(report.bytes_tokenized / 1e6 / seconds, 2) if seconds else 0.0,
        "bytes_per_token": round(report.bytes_tokenized / tokens, 3) if tokens else None,
        "tokenizer_choice": report.tokenizer_choice,
        "replaced": report.replaced,
        "pii_redacted": report.pii_redacted,
        "tokenizer": Markdown(markdown_table([info.to_dict()])),
        "tokenizer_name": info.name,
        "tokenizer_sha256": info.sha256,
        "eos_id": info.eos_id,
        "pad_id": info.pad_id,
        "vocab_size": info.vocab_size,
    }


PRODUCER = ColumnProducer(
    name="token_ids",
    doc="`input_ids` (list<int32>, no EOS: the loader adds it when packing), `n_tokens` (int32) "
        "and `n_bytes` (int32, UTF-8 length of `text`, for bits per byte). The tokenizer (name, "
        "EOS/PAD ids, sha256) is recorded in the table's config; by default the trained BPE.",
    descriptions=DESCRIPTIONS, steps=STEPS, summary=summary, settings=TokenIdsSettings,
    deps=("dedup_flag", "tokenizer", "personal_data"), group="tokens",
    version="2")
