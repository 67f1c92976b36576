"""Semantic near-duplicates: pairs of documents whose embeddings are nearly parallel.

MinHash (``near_dup``) finds documents sharing most of their word 5-grams; this finds documents
that *say the same thing* (paraphrases, templated pages, translations of boilerplate), which
word overlap misses. On a uniform random sample of the pinned rows, every pair's cosine
similarity is computed (one matrix product); the report gives the share of pairs at or above
``threshold``, the share of sampled documents with at least one such neighbour, how many of
those pairs involve a document the exact (``is_dup``) or MinHash (``near_dup``) dedup already
flagged, and the closest pairs that neither flagged: what only meaning finds.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

import numpy as np

from lance_assets.embeddings.embeddings import DIM, EMBEDDING
from lance_assets.forensics.pinned import Pin, resolve_pin
from lance_assets.forensics.search import MissingInputError, and_filters, checked_filter, snippet
from lance_assets.table import Table

DEFAULT_THRESHOLD = 0.95
DEFAULT_SAMPLE = 2000


@dataclass
class NearDupReport:
    sample_rows: int
    threshold: float
    pairs: int  # pairs in the sample
    pairs_above: int
    pair_rate: float  # pairs_above / pairs
    rows_with_neighbour_share: float  # sampled rows with >= 1 neighbour at or above threshold
    pairs_above_unflagged: int = 0  # ... where neither document is flagged is_dup / near_dup
    flags: list[str] = field(default_factory=list)  # the dedup flag columns the table has
    closest: list[dict] = field(default_factory=list)  # closest pairs dedup did not flag

    def to_dict(self) -> dict:
        return asdict(self)


def semantic_near_dups(table: Table, *, pin: Pin | None = None,
                       threshold: float = DEFAULT_THRESHOLD, sample: int = DEFAULT_SAMPLE,
                       top: int = 10, seed: int = 0) -> NearDupReport:
    """Near-duplicate pairs by cosine similarity on a random sample of the pinned rows."""
    pin = pin or resolve_pin(table)
    ds = table.newest()
    if EMBEDDING.name not in ds.schema.names:
        raise MissingInputError(f"{ds.uri} has no `embedding` column: materialize `embeddings` "
                                "first")
    flt = and_filters(checked_filter(ds, pin.rows_filter(), "the pinned rows' filter"),
                      checked_filter(ds, f"{EMBEDDING.name} IS NOT NULL", "embedding filter"))
    ids = ds.to_table(columns=["id"], filter=flt).column("id").to_numpy()
    rng = np.random.default_rng(seed)
    picked = np.sort(rng.choice(ids, size=min(sample, len(ids)), replace=False))
    n = len(picked)
    if n < 2:
        return NearDupReport(n, threshold, 0, 0, 0.0, 0.0)
    flags = [c for c in ("is_dup", "near_dup") if c in ds.schema.names]
    tbl = ds.to_table(columns=["id", EMBEDDING.name, "text", *flags],
                      filter=f"id IN ({', '.join(map(str, picked.tolist()))})")
    vecs = tbl.column(EMBEDDING.name).combine_chunks().values.to_numpy(
        zero_copy_only=False).reshape(-1, DIM)
    row_ids = tbl.column("id").to_numpy()
    sims = vecs @ vecs.T
    iu = np.triu_indices(n, k=1)
    pair_sims = sims[iu]
    above = pair_sims >= threshold
    np.fill_diagonal(sims, -1.0)
    with_neighbour = float((sims.max(axis=1) >= threshold).mean())
    flagged = np.zeros(n, bool)
    for c in flags:
        flagged |= np.asarray(tbl.column(c).fill_null(False).to_numpy(zero_copy_only=False), bool)
    unflagged = ~flagged[iu[0]] & ~flagged[iu[1]]
    order = np.flatnonzero(unflagged)[np.argsort(-pair_sims[unflagged], kind="stable")][:top]
    texts = tbl.column("text").to_pylist()
    closest = []
    for p in order:
        a, b = int(iu[0][p]), int(iu[1][p])
        closest.append({"id_a": int(row_ids[a]), "id_b": int(row_ids[b]),
                        "cosine": round(float(pair_sims[p]), 4),
                        "text_a": snippet(texts[a], "", 90), "text_b": snippet(texts[b], "", 90)})
    return NearDupReport(n, threshold, len(pair_sims), int(above.sum()),
                         round(float(above.mean()), 6), round(with_neighbour, 4),
                         int((above & unflagged).sum()), flags, closest)
