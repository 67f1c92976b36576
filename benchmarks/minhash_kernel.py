"""The MinHash kernel alone: documents per CPU-second of each step, version 1 against version 2
against rensa used the way its own documentation shows, on the same texts in one run.

    RAYON_NUM_THREADS=1 python -m benchmarks.minhash_kernel --docs 8192 [--batch 2048]

Texts: the first ``--docs`` documents of ``synthetic-web`` (FineWeb-shaped, ~4.6 KB mean), in
batches of ``--batch`` (near_dup's batch). Steps, each timed with ``time.process_time`` (every
thread of the process; the best of ``--repeat`` runs):

- ``shingles``: :func:`minhash.shingle_stream` (simplify, split, word hashes, 5-gram hashes);
- ``signatures``: :func:`minhash.signatures` (112 values) on those shingles;
- ``band keys``: :func:`minhash.band_keys` (14 of 8);
- ``minhash_batch``: the three in one call, as near_dup's per-fragment task runs them;
- ``shingle sets``: :func:`minhash.shingles` (sorted, unique: what Jaccard confirmation uses);
- rensa's token-set path (``benchmarks/peers/rensa_arm.py``): the same pyarrow simplification,
  Python word 5-gram strings, ``RMinHash.digest_matrix_from_token_sets``; then its LSH insert.

Prints a table and the ratio of each version's ``minhash_batch`` to rensa's token-set path
(``--json`` also writes it).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import pyarrow as pa

REPO = Path(__file__).resolve().parent.parent


def texts_of(n: int) -> pa.Array:
    from lance_assets.ingest import synthetic_web as sw

    spec = sw.WebSpec(rows=n)
    parts = [sw.generate_block(spec, b).column("text").combine_chunks()
             for b in range(spec.n_blocks)]
    return pa.concat_arrays(parts)[:n]


def cpu_seconds(fn, repeat: int) -> float:
    best = float("inf")
    for _ in range(repeat):
        t0 = time.process_time()
        fn()
        best = min(best, time.process_time() - t0)
    return best


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--docs", type=int, default=8192)
    p.add_argument("--batch", type=int, default=2048)
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--json", default=None)
    args = p.parse_args(argv)

    from lance_assets.curation import minhash

    texts = texts_of(args.docs)
    batches = [texts[lo:lo + args.batch] for lo in range(0, len(texts), args.batch)]
    n = len(texts)
    rows: dict[str, float] = {}

    def timed(name: str, fn) -> None:
        rows[name] = n / cpu_seconds(lambda: [fn(b) for b in batches], args.repeat)

    for version in (1, 2):
        s = minhash.MinHashSettings(version=version)
        minhash.minhash_batch(batches[0], s)  # warm: version 1's word cache, rensa's import
        streams = [minhash.shingle_stream(b, s.ngram, version=version) for b in batches]
        sigs = [minhash.signatures(d, sh, len(b), s) for (d, sh), b in zip(streams, batches)]
        timed(f"v{version} shingles", lambda b, v=version: minhash.shingle_stream(b, 5, version=v))
        rows[f"v{version} signatures"] = n / cpu_seconds(
            lambda s=s, st=streams: [minhash.signatures(d, sh, len(b), s)
                                     for (d, sh), b in zip(st, batches)], args.repeat)
        rows[f"v{version} band keys"] = n / cpu_seconds(
            lambda s=s, sg=sigs: [minhash.band_keys(x, s) for x in sg], args.repeat)
        timed(f"v{version} minhash_batch", lambda b, s=s: minhash.minhash_batch(b, s))
        timed(f"v{version} shingle sets", lambda b, v=version: minhash.shingles(b, 5, version=v))

    rensa_ok = True
    try:
        import rensa
        sys.path.insert(0, str(REPO / "benchmarks" / "peers"))
        import rensa_arm
    except ImportError:
        rensa_ok = False
    if rensa_ok:
        sets = [rensa_arm.shingle_sets(b) for b in batches]
        perm = rensa_arm.BANDS * rensa_arm.ROWS_PER_BAND
        timed("rensa shingle strings", rensa_arm.shingle_sets)
        rows["rensa digest (token sets)"] = n / cpu_seconds(
            lambda: [rensa.RMinHash.digest_matrix_from_token_sets(x, perm, rensa_arm.SEED)
                     for x in sets], args.repeat)

        def rensa_whole(b):
            lsh = rensa.RMinHashLSH(0.8, perm, rensa_arm.BANDS)
            m = rensa.RMinHash.digest_matrix_from_token_sets(rensa_arm.shingle_sets(b), perm,
                                                             rensa_arm.SEED)
            lsh.insert_matrix_and_query_duplicate_flags(m, start_key=0)

        timed("rensa token-set path + LSH", rensa_whole)

    print(f"{n:,} synthetic-web documents in batches of {args.batch}, "
          f"RAYON_NUM_THREADS={os.environ.get('RAYON_NUM_THREADS', 'unset')}; "
          "documents per CPU-second (best of "
          f"{args.repeat}):")
    for name, rate in rows.items():
        print(f"  {name:>28} {rate:12,.0f}")
    out = {"docs": n, "batch": args.batch, "docs_per_cpu_s": {k: round(v) for k, v in rows.items()}}
    if rensa_ok:
        ref = rows["rensa token-set path + LSH"]
        for v in (1, 2):
            ratio = rows[f"v{v} minhash_batch"] / ref
            out[f"v{v}_over_rensa"] = round(ratio, 2)
            print(f"  v{v} minhash_batch / rensa token-set path + LSH: {ratio:.2f}x")
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=2))
    return out


if __name__ == "__main__":
    main()
