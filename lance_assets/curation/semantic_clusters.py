"""The clusters ``semantic_dup`` compares within: a hashed training sample and the blocked
comparison of new rows with the earlier rows of a cluster (pure numpy, one task's work, locally
or as a Ray task). The rows themselves live in ``embeddings/vector_files`` (the files) and
``semantic_store`` (the state that lists them, in a side Lance dataset)::

    state.lance                                   the state in force (a compare-and-swap)
    g<gen>/c<cluster>/<first>-<last>-<rows>.bin   a cluster's rows
    g<gen>/r<cluster>/<first>-<last>-<rows>.bin   a run's new rows of a group of clusters
"""

from __future__ import annotations

import numpy as np

from lance_assets.embeddings.int8_vectors import cosines

NEW_BLOCK = 1024  # new rows per matrix product
OLD_BLOCK = 8192  # candidate rows per matrix product: 1024 x 8192 cosines (32 MB)
NONE = np.int64(-1)


# ---------------------------------------------------------------------------- sampling

def hashed_sample(ids: np.ndarray, rate: float, seed: int) -> np.ndarray:
    """The rows kept by a sample of ``rate``: a hash of (id, seed), so the same rows are kept
    whichever task reads them."""
    if rate >= 1:
        return np.ones(len(ids), bool)
    h = (ids.astype(np.uint64) + np.uint64(seed) * np.uint64(0x9E3779B97F4A7C15))
    h = (h ^ (h >> np.uint64(31))) * np.uint64(0xBF58476D1CE4E5B9)
    h ^= h >> np.uint64(29)
    return (h >> np.uint64(11)).astype(np.float64) / float(1 << 53) < rate


# ---------------------------------------------------------------------------- comparing

def best_earlier(new_ids: np.ndarray, x: np.ndarray, xi: np.ndarray, cand_ids: np.ndarray,
                 yt: np.ndarray, yi: np.ndarray, allowed: np.ndarray | None = None
                 ) -> tuple[np.ndarray, np.ndarray, int]:
    """For each new row (ids ascending; ``x`` int8 vectors (rows, 384), ``xi`` 1 / their norms),
    its best cosine with a candidate of smaller id (``cand_ids`` ascending, ``yt`` their int8
    vectors by dimension (384, rows), ``yi`` 1 / their norms; ``allowed``: a (rows, candidates)
    mask of the pairs to compare, default all) and that candidate's position (-1 and -inf when
    there is none); ties go to the smallest id. Returns also the pairs compared."""
    n = len(new_ids)
    best = np.full(n, -np.inf, np.float32)
    best_at = np.full(n, -1, np.int64)
    if n == 0 or len(cand_ids) == 0:
        return best, best_at, 0
    pairs = 0
    for clo in range(0, len(cand_ids), OLD_BLOCK):
        c_ids = cand_ids[clo:clo + OLD_BLOCK]
        yb, yib = yt[:, clo:clo + OLD_BLOCK], yi[clo:clo + OLD_BLOCK]
        for lo in range(0, n, NEW_BLOCK):
            ids = new_ids[lo:lo + NEW_BLOCK]
            if c_ids[0] >= ids[-1]:
                continue
            s = cosines(x[lo:lo + NEW_BLOCK], xi[lo:lo + NEW_BLOCK], yb, yib)
            if c_ids[-1] < ids[0] and allowed is None:  # every candidate is earlier (stored rows)
                pairs += s.size
            else:
                later = c_ids[None, :] >= ids[:, None]
                if allowed is not None:
                    later |= ~allowed[lo:lo + NEW_BLOCK, clo:clo + OLD_BLOCK]
                s[later] = -np.inf
                pairs += s.size - int(np.count_nonzero(later))
            j = np.argmax(s, axis=1)  # the first of equal values: the smallest id
            v = s[np.arange(len(ids)), j]
            better = v > best[lo:lo + NEW_BLOCK]  # an earlier block has smaller ids: keeps ties
            best[lo:lo + NEW_BLOCK][better] = v[better]
            best_at[lo:lo + NEW_BLOCK][better] = clo + j[better]
    return best, best_at, pairs


def merge_best(best: np.ndarray, best_id: np.ndarray, v: np.ndarray, vid: np.ndarray) -> None:
    """Keep, per row, the higher cosine of two candidates' sets (ties: the smaller id)."""
    take = (vid >= 0) & ((v > best) | ((v == best) & ((best_id < 0) | (vid < best_id))))
    best[take] = v[take]
    best_id[take] = vid[take]
