"""Embedding backends on real text: chunks per CPU-second and agreement with PyTorch float32.

    python -m benchmarks.embed_backends [--docs 400] [--chunks 3000] [--threads 2] [--repeats 2]

1. Real text found on this machine, offline (the tokenizer benchmark's corpus: the Python sources
   and docs installed here and /usr/share/doc, one file per document, in a fixed order).
2. Cuts it into ``chunk_embeddings``' chunks (128 word pieces, overlap 32: the column's default
   ``ChunkSpec``) and keeps the first ``--chunks`` of them.
3. Embeds those chunks with each backend (``torch``: sentence-transformers float32, the path
   before backends; ``torch-bf16``; ``onnx-fp32``; ``onnx-int8``), each on ``--threads``
   threads, after one warm-up batch, ``--repeats`` times in alternation. Throughput is per
   CPU-second of the process (every thread) and per wall second; ratios use each arm's best run
   against ``torch``'s in the same run.
4. Agreement: the cosine of each chunk's vector with its ``torch`` vector (median, 1st
   percentile, minimum).
5. ``--quality-score``: what the vectors change downstream for ``quality_score``: the demo
   corpus (``synthetic:2000``) embedded by ``torch``, ``torch-bf16`` and ``onnx-int8``, the
   head trained on each, its held-out error.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import time

import numpy as np

from benchmarks.tokenize_bench import MAX_DOC_BYTES, local_text_files
from lance_assets.embeddings.chunk_embeddings import ChunkSpec, shared_chunker
from lance_assets.embeddings.embeddings import Embedder
from lance_assets.embeddings.onnx_backend import BACKENDS
from lance_assets.table import Table
from lance_assets.table.producer import produce


def real_chunks(docs: int, limit: int) -> tuple[list[str], int]:
    texts = []
    for path in local_text_files():
        if path.suffix == ".gz":
            continue
        try:
            raw = path.read_bytes()
            text = raw.decode("utf-8")
        except (OSError, UnicodeDecodeError):
            continue
        if text.strip() and len(raw) <= MAX_DOC_BYTES:
            texts.append(text)
        if len(texts) >= docs:
            break
    spans = shared_chunker(ChunkSpec()).spans(texts)
    chunks = [t[s:e] for t, row in zip(texts, spans) for s, e in row]
    return chunks[:limit], len(texts)


def quality_score_by_backend(rows: int = 2000) -> dict:
    import shutil
    import tempfile

    from lance_assets.curation import quality_score
    from lance_assets.embeddings import embeddings
    from lance_assets.ingest.raw_text import ingest

    out = {}
    print("\n| backend | held-out rows | MAE | MAE of the mean | accuracy | F1 |")
    print("|---|---|---|---|---|---|")
    for backend in ("torch", "torch-bf16", "onnx-int8"):
        work = tempfile.mkdtemp(prefix="embed-backends-")
        try:
            ingest(Table.of(work), f"synthetic:{rows}", log=lambda _m: None)
            produce(embeddings.PRODUCER, Table.of(work), embeddings.EmbeddingsSettings(backend=backend),
                    log=lambda _m: None)
            held = produce(quality_score.PRODUCER, Table.of(work), log=lambda _m: None).model["heldout"]
        finally:
            shutil.rmtree(work, ignore_errors=True)
        out[backend] = held
        print(f"| {backend} | {held.get('rows')} | {held.get('mae', 0):.3f} | "
              f"{held.get('mae_of_mean_baseline', 0):.3f} | "
              f"{held.get('accuracy', 0):.3f} | {held.get('f1', 0):.3f} |")
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--docs", type=int, default=400)
    ap.add_argument("--chunks", type=int, default=3000)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--json-out", default=None)
    ap.add_argument("--quality-score", action="store_true")
    args = ap.parse_args()
    import torch

    torch.set_num_threads(args.threads)
    chunks, n_docs = real_chunks(args.docs, args.chunks)
    print(f"{len(chunks)} chunks of {n_docs} real documents; {args.threads} threads; "
          f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores")
    models = {}
    for backend in BACKENDS:
        t = time.perf_counter()
        models[backend] = Embedder(128, device="cpu", backend=backend)
        models[backend].encode(chunks[:64])  # warm-up
        print(f"  {backend}: loaded and warmed up in {time.perf_counter() - t:.1f}s")
    best: dict[str, dict] = {}
    vecs: dict[str, np.ndarray] = {}
    for _ in range(args.repeats):
        for backend, model in models.items():
            c, w = time.process_time(), time.perf_counter()
            vecs[backend] = model.encode(chunks)
            cpu, wall = time.process_time() - c, time.perf_counter() - w
            row = {"chunks_per_cpu_s": len(chunks) / cpu, "chunks_per_s": len(chunks) / wall}
            if backend not in best or row["chunks_per_cpu_s"] > best[backend]["chunks_per_cpu_s"]:
                best[backend] = row
    base = best["torch"]
    print("\n| backend | chunks / CPU-second | chunks / s | per CPU-second vs torch | "
          "cosine to torch: median | 1st percentile | min |")
    print("|---|---|---|---|---|---|---|")
    for backend in BACKENDS:
        cos = np.sum(vecs[backend] * vecs["torch"], axis=1)
        best[backend].update(ratio=best[backend]["chunks_per_cpu_s"] / base["chunks_per_cpu_s"],
                             cos_median=float(np.median(cos)),
                             cos_p1=float(np.percentile(cos, 1)), cos_min=float(cos.min()))
        b = best[backend]
        print(f"| {backend} | {b['chunks_per_cpu_s']:.1f} | {b['chunks_per_s']:.1f} | "
              f"{b['ratio']:.2f}x | {b['cos_median']:.5f} | {b['cos_p1']:.5f} | "
              f"{b['cos_min']:.5f} |")
    if args.quality_score:
        best["quality_score"] = quality_score_by_backend()
    if args.json_out:
        with open(args.json_out, "w") as f:
            json.dump({"chunks": len(chunks), "docs": n_docs, "threads": args.threads,
                       "arms": best}, f, indent=2)


if __name__ == "__main__":
    main()
