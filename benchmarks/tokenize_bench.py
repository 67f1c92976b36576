"""Is ``token_ids`` as fast as tiktoken itself? And how long does the corpus BPE take to train?

    python -m benchmarks.tokenize_bench [--mb 200] [--train-mb 100] [--vocab 32768]

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
   arm's best wall-clock time and, because the CPU may be shared with other work, also its best
   CPU time (all threads of the process): throughput per CPU second.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import platform
import random
import resource
import sysconfig
import tempfile
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from lance_assets.curation import dedup_flag
from lance_assets.ingest.raw_text import ingest
from lance_assets.table import Table
from lance_assets.table.producer import produce
from lance_assets.tokens import bpe, token_ids
from lance_assets.tokens.token_ids import N_BYTES, TOKEN_COLUMNS
from lance_assets.tokens.tokenizers import load_tokenizer

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


def local_texts():
    """``(path, raw bytes, text)`` of every readable local text file (gzip ones decompressed)
    that is not empty and at most ``MAX_DOC_BYTES``, in ``local_text_files``' order."""
    for path in local_text_files():
        try:
            raw = gzip.decompress(path.read_bytes()) if path.suffix == ".gz" else path.read_bytes()
            text = raw.decode("utf-8")
        except (OSError, UnicodeDecodeError, EOFError, gzip.BadGzipFile):
            continue
        if text.strip() and len(raw) <= MAX_DOC_BYTES:
            yield path, raw, text


def build_corpus(out: Path, target_bytes: int) -> tuple[Path, int, int]:
    """A parquet file of local texts totalling at least ``target_bytes`` UTF-8 bytes."""
    texts, total = [], 0
    for _path, raw, text in local_texts():
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


def cpu_seconds() -> float:
    """CPU time of this process, every thread (Lance's and tiktoken's included)."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def measured(fn):
    """(wall seconds, CPU seconds, value)."""
    cpu = cpu_seconds()
    wall, value = timed(fn)
    return wall, cpu_seconds() - cpu, value


def drop_token_columns(root: Path) -> None:
    Table.of(root).commit("drop token columns", lambda ds: ds.drop_columns(
        [c for c in [*TOKEN_COLUMNS, N_BYTES.name] if c in ds.schema.names]))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.tokenize_bench",
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
    if not Table.of(root).exists():
        seconds, rep = timed(lambda: ingest(Table.of(root), str(source), log=quiet))
        print(f"ingest: {rep.rows_added:,} rows, {rep.bytes_added / 1e6:.1f} MB ({seconds:.1f}s)")
        seconds, _ = timed(lambda: produce(dedup_flag.PRODUCER, Table.of(root), log=quiet))
        print(f"dedup_flag: {seconds:.1f}s")

    # -- tokenizer training ---------------------------------------------------------------------
    report = bpe.train_bpe(Table.of(root), vocab_size=args.vocab, max_train_bytes=int(args.train_mb * 1e6),
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
    texts = Table.of(root).newest().to_table(columns=["text"]).column("text")
    total_bytes = sum(len(t.encode("utf-8")) for t in texts.to_pylist())
    texts_py = texts.to_pylist()
    arms = {"encode_ordinary_batch (in memory)": [], "tokenizer.encode_batch (in memory)": [],
            "token_ids (Lance -> Lance)": []}
    baseline, in_memory, ours = arms.values()
    for _ in range(args.repeats):
        wall, cpu, ids = measured(
            lambda: tok.enc.encode_ordinary_batch(texts_py, num_threads=args.threads))
        baseline_tokens = sum(len(x) for x in ids)
        del ids
        baseline.append((wall, cpu))
        wall, cpu, _ = measured(lambda: tok.encode_batch(texts))
        in_memory.append((wall, cpu))
        drop_token_columns(root)
        wall, cpu, rep = measured(
            lambda: produce(token_ids.PRODUCER, Table.of(root),
                            token_ids.TokenIdsSettings(tokenizer=args.tokenizer, num_threads=args.threads),
                            log=quiet))
        info, tokens = rep.tokenizer, rep.tokens_written
        ours.append((wall, cpu))
    if tokens != baseline_tokens:
        raise SystemExit(f"token counts differ: token_ids {tokens} vs baseline {baseline_tokens}")
    best = {name: (min(w for w, _ in runs), min(c for _, c in runs)) for name, runs in arms.items()}
    (b, b_cpu), (m, m_cpu), (o, o_cpu) = best.values()
    print(f"\ntokenizer {info.name[:20]}, {len(texts_py):,} docs, {total_bytes / 1e6:.1f} MB, "
          f"{tokens:,} tokens ({total_bytes / tokens:.2f} bytes/token), best of {args.repeats}")
    print(f"{'':36} {'wall s':>7} {'Mtokens/s':>10} {'MB/s':>7} {'CPU s':>7} {'MB/CPU-s':>9}")
    for name, (wall, cpu) in best.items():
        print(f"{name:36} {wall:7.2f} {tokens / wall / 1e6:10.3f} {total_bytes / wall / 1e6:7.2f} "
              f"{cpu:7.2f} {total_bytes / cpu / 1e6:9.2f}")
    print(f"ratio token_ids / encode_ordinary_batch: {b / o:.2f} wall-clock, {b_cpu / o_cpu:.2f} "
          f"per CPU second; token_ids / the same encode in memory: {m / o:.2f} wall-clock, "
          f"{m_cpu / o_cpu:.2f} per CPU second")
    for name, runs in arms.items():
        print(f"  {name}: " + ", ".join(f"{w:.1f}s wall / {c:.1f}s CPU" for w, c in runs))
    if args.json:
        Path(args.json).write_text(json.dumps({
            "docs": len(texts_py), "bytes": total_bytes, "tokens": tokens,
            "runs_wall_cpu_s": arms, "ratio_wall": b / o, "ratio_cpu": b_cpu / o_cpu,
            "ratio_vs_in_memory_wall": m / o, "ratio_vs_in_memory_cpu": m_cpu / o_cpu,
            "bpe": {"vocab_size": report.vocab_size, "train_s": report.train_s,
                    "train_bytes": report.train_bytes, "bytes_per_token": bpt},
        }, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
