"""The rensa arm of ``benchmarks.scale --peers``; runs in rensa's own environment
(``scripts/peers_venv.sh``), needing only rensa, numpy and pyarrow.

    python benchmarks/peers/rensa_arm.py TEXTS.parquet OUT.npy

FineWeb's shingling as a rensa user writes it: the text simplified with the same pyarrow calls
as ``minhash.simplify`` (lowercase, punctuation and symbols removed, digits folded to 0),
split into words, word 5-grams joined as strings; then rensa's bulk APIs: RMinHash digests of
112 permutations (``digest_matrix_from_token_sets``) and an LSH of 14 bands x 8
(``insert_matrix_and_query_duplicate_flags``): a document is flagged when it shares a band with
another one (no Jaccard check; both members of a pair are flagged). Saves the flags; prints
wall and CPU seconds as JSON.
"""

import json
import sys
import time

import numpy as np
import pyarrow.compute as pc
import pyarrow.parquet as pq
import rensa

NGRAM, BANDS, ROWS_PER_BAND, SEED = 5, 14, 8, 1


def simplify(texts):
    out = pc.utf8_lower(texts)
    out = pc.replace_substring_regex(out, r"[\p{P}\p{S}]+", "")
    return pc.replace_substring_regex(out, r"\p{Nd}+", "0")


def shingle_sets(texts) -> list[list[str]]:
    sets = []
    for t in simplify(texts).to_pylist():
        w = t.split()
        if len(w) < NGRAM:
            sets.append([" ".join(w)] if w else [])
        else:
            sets.append([" ".join(w[i:i + NGRAM]) for i in range(len(w) - NGRAM + 1)])
    return sets


def main() -> None:
    src, out = sys.argv[1], sys.argv[2]
    wall, cpu = time.perf_counter(), time.process_time()
    lsh = rensa.RMinHashLSH(0.8, BANDS * ROWS_PER_BAND, BANDS)
    flags, start = [], 0
    for batch in pq.ParquetFile(src).iter_batches(batch_size=2048, columns=["text"]):
        m = rensa.RMinHash.digest_matrix_from_token_sets(
            shingle_sets(batch.column("text")), BANDS * ROWS_PER_BAND, SEED)
        # keys are row numbers, continued across batches
        flags.append(np.asarray(lsh.insert_matrix_and_query_duplicate_flags(m, start_key=start),
                                dtype=bool))
        start += batch.num_rows
    flags = np.concatenate(flags)
    np.save(out, flags)
    print(json.dumps({"wall_s": time.perf_counter() - wall, "cpu_s": time.process_time() - cpu,
                      "flagged": int(flags.sum()), "rensa": getattr(rensa, "__version__", "?")}))


if __name__ == "__main__":
    main()
