"""Is ``token_ids`` as fast as tiktoken itself? And how long does the corpus BPE take to train?

    python -m lance_assets.bench.tokenize_bench [--mb 200] [--train-mb 100] [--vocab 32768]

1. Builds a corpus of real text found on this machine, offline: Python sources and docs of the
   installed packages and the standard library, and the (gzipped) Debian docs under
   /usr/share/doc, in a fixed shuffled order, one file per document, until ``--mb`` MB
   (or ``--source``: any ``LANCE_ASSETS_SOURCE`` path or glob). Ingests it, flags duplicates.
2. Trains the BPE (``--vocab`` ids) on up to ``--train-mb`` MB of it: the training time.
3. Tokenizes the whole table with ``token_ids`` (read ``text`` from Lance, encode, write
   ``n_bytes`` + ``input_ids`` + ``n_tokens``, commit per fragment group) and, in the same run,
   the same texts already in memory with tiktoken's ``Encoding.encode_ordinary_batch`` on the
   same encoding and thread count: the baseline. A third arm encodes the in-memory texts the way
   ``token_ids`` does (``encode_batch``: numpy buffers, no Python int lists), which isolates the
   cost of the Lance reads and writes. The arms alternate ``--repeats`` times; ratios use each
   arm's best time (the CPU may be shared).
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import platform
import random
import sysconfig
import tempfile
import time
from pathlib import Path

import lance
import pyarrow as pa
import pyarrow.parquet as pq

from lance_assets import paths
from lance_assets.corpus import bpe
from lance_assets.corpus.dedup import dedup_flag
from lance_assets.corpus.ingest import ingest
from lance_assets.corpus.tokenize import N_BYTES, TOKEN_COLUMNS, token_ids
from lance_assets.corpus.tokenizers import load_tokenizer

TEXT_SUFFIXES = (".py", ".pyi", ".md", ".rst", ".txt")
MAX_DOC_BYTES = 1_000_000


def local_text_files() -> list[Path]:
    roots = {Path(sysconfig.get_paths()["purelib"]), Path(sysconfig.get_paths()["stdlib"])}
    files = [p for r in sorted(roots) if r.is_dir() for p in r.rglob("*")
             if p.suffix in TEXT_SUFFIXES and p.is_file()]
    doc = Path("/usr/share/doc")
    if doc.is_dir():
        files += [p for p in doc.rglob("*.gz") if p.is_file()]
    files = sorted(set(files))
    random.Random(0).shuffle(files)
    return files


def build_corpus(out: Path, target_bytes: int) -> tuple[Path, int, int]:
    """A parquet file of local texts totalling at least ``target_bytes`` UTF-8 bytes."""
    texts, total = [], 0
    for path in local_text_files():
        try:
            raw = gzip.decompress(path.read_bytes()) if path.suffix == ".gz" else path.read_bytes()
            text = raw.decode("utf-8")
        except (OSError, UnicodeDecodeError, EOFError, gzip.BadGzipFile):
            continue
        if not text.strip() or len(raw) > MAX_DOC_BYTES:
            continue
        texts.append(text)
        total += len(raw)
        if total >= target_bytes:
            break
    if total < target_bytes:
        print(f"note: only {total / 1e6:.0f} MB of local text found (asked for "
              f"{target_bytes / 1e6:.0f} MB)")
    out.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.table({"text": pa.array(texts, pa.string())}), out)
    return out, len(texts), total


def timed(fn):
    start = time.perf_counter()
    value = fn()
    return time.perf_counter() - start, value


def drop_token_columns(root: Path) -> None:
    ds = lance.dataset(paths.table_uri(root))
    ds.drop_columns([c for c in [*TOKEN_COLUMNS, N_BYTES.name] if c in ds.schema.names])


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m lance_assets.bench.tokenize_bench",
                                description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--mb", type=float, default=200, help="corpus size to build (MB of UTF-8)")
    p.add_argument("--source", default=None, help="ingest this instead of local text files")
    p.add_argument("--train-mb", type=float, default=100, help="BPE training sample bound (MB)")
    p.add_argument("--vocab", type=int, default=32768, help="BPE ids, including EOS and PAD")
    p.add_argument("--tokenizer", default="bpe",
                   help="what token_ids and the baseline use: bpe (the one trained here), "
                        "cl100k_base, ...")
    p.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    p.add_argument("--repeats", type=int, default=2, help="alternating runs of each arm")
    p.add_argument("--work", default=None, help="working folder (default: a temp dir)")
    p.add_argument("--json", default=None, help="also write the figures to this file")
    args = p.parse_args(argv)
    quiet = lambda _m: None  # noqa: E731

    work = Path(args.work or tempfile.mkdtemp(prefix="tokenize_bench_"))
    root = work / "data"
    print(f"machine: {platform.platform()}, {os.cpu_count()} CPUs, python "
          f"{platform.python_version()}; threads {args.threads}; work {work}")
    source = args.source
    if source is None:
        seconds, (source, docs, nbytes) = timed(
            lambda: build_corpus(work / "corpus" / "local_text.parquet", int(args.mb * 1e6)))
        print(f"corpus: {docs:,} local text files, {nbytes / 1e6:.1f} MB ({seconds:.1f}s)")
    if not Path(paths.table_uri(root)).exists():
        seconds, rep = timed(lambda: ingest(root, str(source), log=quiet))
        print(f"ingest: {rep.rows_added:,} rows, {rep.bytes_added / 1e6:.1f} MB ({seconds:.1f}s)")
        seconds, _ = timed(lambda: dedup_flag(root, log=quiet))
        print(f"dedup_flag: {seconds:.1f}s")

    # -- tokenizer training ---------------------------------------------------------------------
    report = bpe.train_bpe(root, vocab_size=args.vocab, max_train_bytes=int(args.train_mb * 1e6),
                           log=quiet)
    bpt = report.bytes_per_token
    print(f"\nBPE training: {report.vocab_size:,} ids from {report.train_docs:,} docs, "
          f"{report.train_bytes / 1e6:.1f} MB: {report.train_s:.1f}s"
          f"{' (reused, not retrained)' if report.nothing_to_do else ''}")
    print(f"held-out bytes/token ({report.heldout_bytes / 1e6:.1f} MB): "
          + ", ".join(f"{k} {v}" for k, v in bpt.items())
          + f"; BPE vs byte {bpt['bpe'] / bpt['byte']:.2f}x")

    # -- token_ids vs encode_ordinary_batch -----------------------------------------------------
    drop_token_columns(root)
    tok = load_tokenizer(args.tokenizer, root, num_threads=args.threads)
    texts = lance.dataset(paths.table_uri(root)).to_table(columns=["text"]).column("text")
    total_bytes = sum(len(t.encode("utf-8")) for t in texts.to_pylist())
    texts_py = texts.to_pylist()
    baseline, in_memory, ours, tokens = [], [], [], 0
    for _ in range(args.repeats):
        seconds, ids = timed(lambda: tok.enc.encode_ordinary_batch(texts_py, num_threads=args.threads))
        baseline_tokens = sum(len(x) for x in ids)
        del ids
        baseline.append(seconds)
        seconds, _ = timed(lambda: tok.encode_batch(texts))
        in_memory.append(seconds)
        drop_token_columns(root)
        seconds, (rep, info, tokens) = timed(
            lambda: token_ids(root, args.tokenizer, num_threads=args.threads, log=quiet))
        ours.append(seconds)
    if tokens != baseline_tokens:
        raise SystemExit(f"token counts differ: token_ids {tokens} vs baseline {baseline_tokens}")
    b, m, o = min(baseline), min(in_memory), min(ours)
    rows = [("encode_ordinary_batch (in memory)", b),
            ("tokenizer.encode_batch (in memory)", m), ("token_ids (Lance -> Lance)", o)]
    print(f"\ntokenizer {info.name[:20]}, {len(texts_py):,} docs, {total_bytes / 1e6:.1f} MB, "
          f"{tokens:,} tokens ({total_bytes / tokens:.2f} bytes/token), best of {args.repeats}")
    print(f"{'':36} {'seconds':>8} {'Mtokens/s':>10} {'MB/s':>7}")
    for name, s in rows:
        print(f"{name:36} {s:8.2f} {tokens / s / 1e6:10.3f} {total_bytes / s / 1e6:7.2f}")
    print(f"ratio token_ids / encode_ordinary_batch: {b / o:.2f}; token_ids / the same encode "
          f"in memory: {m / o:.2f} (all runs, s: baseline "
          f"{', '.join(f'{s:.1f}' for s in baseline)}; in memory "
          f"{', '.join(f'{s:.1f}' for s in in_memory)}; token_ids "
          f"{', '.join(f'{s:.1f}' for s in ours)})")
    if args.json:
        Path(args.json).write_text(json.dumps({
            "docs": len(texts_py), "bytes": total_bytes, "tokens": tokens,
            "baseline_s": baseline, "in_memory_s": in_memory, "token_ids_s": ours,
            "ratio": b / o, "ratio_vs_in_memory": m / o,
            "bpe": {"vocab_size": report.vocab_size, "train_s": report.train_s,
                    "train_bytes": report.train_bytes, "bytes_per_token": bpt},
        }, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
