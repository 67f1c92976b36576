"""The partitioned steps of ``near_dup``: band keys shuffled by key, candidate pairs per
partition, and connected components by label propagation over groups of documents.

Pure numpy (and scipy for a group's own components), no table access and no executor: each
function is one task's work, called in this process for the single-process path and as a Ray
task for the distributed one, so both give the same columns by construction.

Semantics (independent of how the corpus is partitioned, and of a run interrupted between
commits): a document's *signature* is a hash of its band keys, equal for copies. A band key's
*representatives* are the first holder (smallest id) of each distinct signature among every
document of the pinned version holding the key, the first :data:`HOLDERS_PER_KEY` of them by
id. Each new document holding the key is a candidate with every representative of smaller id,
ranked by its place among them; it keeps its keys' first holders and its other pairs by rank
then id, :data:`CANDIDATES_PER_DOC` pairs in all (more only when the first holders are more).
More than the first holder, because in a chain A -> B -> C (C a near-copy of B, not of A)
every key C shares with B may also be A's: paired with A alone, C would never meet B.

Candidates are confirmed by exact Jaccard elsewhere; confirmed pairs with a new holder are edges
between new documents, those with an old one attach the new document to that document's
cluster. A connected component of new documents takes the smallest cluster it attaches to,
else its smallest id; every member but an unattached component's smallest id is flagged.
"""

from __future__ import annotations

import numpy as np

from lance_assets.table.executor import group_of

NO_CLUSTER = np.int64(-1)  # a new document's cluster before this run: none yet
NONE = np.iinfo(np.int64).max  # no attachment to an older cluster
# A key's representatives: distinct signatures, the first this many by id. Bounds the pairs a
# key makes (each new holder meets at most this many) and what a written fragment sends.
HOLDERS_PER_KEY = 8
# A new document's candidates at most (its keys' first holders are never dropped): bounds the
# texts read to confirm a document inside a large cluster of distinct variants.
CANDIDATES_PER_DOC = 32

# One partition's share of a fragment: (band key, id, cluster or NO_CLUSTER when new, signature)
Holders = tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]
# Candidate pairs: (new id, holder's id, holder's cluster or NO_CLUSTER, holder's rank)
Pairs = tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]
FNV = np.uint64(0x100000001B3)


def empty_holders() -> Holders:
    return (np.zeros(0, np.int64),) * 4


def empty_pairs() -> Pairs:
    return (np.zeros(0, np.int64),) * 4


def partition_of(keys: np.ndarray, partitions: int) -> np.ndarray:
    """Each key's partition: its high 32 bits scaled to ``[0, partitions)`` (keys are hashes)."""
    high = keys.view(np.uint64) >> np.uint64(32)
    return ((high * np.uint64(partitions)) >> np.uint64(32)).astype(np.int64)


def signature(keys: np.ndarray) -> np.ndarray:
    """[n] int64: a hash of each row of ``keys`` ([n, bands] int64), equal for equal rows."""
    u = np.ascontiguousarray(keys).view(np.uint64)
    h = np.full(len(keys), np.uint64(0xCBF29CE484222325))
    for b in range(u.shape[1] if u.ndim == 2 else 0):
        h = (h ^ u[:, b]) * FNV
        h ^= h >> np.uint64(29)
    return h.view(np.int64)


def split_by(part: np.ndarray, parts: int, *arrays: np.ndarray) -> list[tuple[np.ndarray, ...]]:
    """``arrays`` cut into ``parts`` pieces by ``part`` (each piece keeps the input order)."""
    if parts == 1:
        return [tuple(arrays)]
    order = np.argsort(part, kind="stable")
    bounds = np.searchsorted(part[order], np.arange(parts + 1))
    return [tuple(a[order[lo:hi]] for a in arrays) for lo, hi in zip(bounds[:-1], bounds[1:])]


def _by_key(k: np.ndarray, i: np.ndarray, *more: np.ndarray) -> tuple[np.ndarray, ...]:
    """Rows sorted by (key, id), each (key, id) once."""
    order = np.lexsort((i, k))
    k, i, more = k[order], i[order], [a[order] for a in more]
    keep = np.r_[True, (k[1:] != k[:-1]) | (i[1:] != i[:-1])] if len(k) else np.zeros(0, bool)
    return (k[keep], i[keep], *[a[keep] for a in more])


def _ranks(k: np.ndarray, i: np.ndarray, s: np.ndarray) -> tuple[np.ndarray, ...]:
    """For rows sorted by (key, id): whether a row is the first of its signature in its key,
    how many such rows of its key come before it (a first one's rank), and its key's first row."""
    n = len(k)
    order = np.lexsort((i, s, k))
    ko, so = k[order], s[order]
    first = np.zeros(n, bool)
    first[order[np.r_[True, (ko[1:] != ko[:-1]) | (so[1:] != so[:-1])]]] = True
    head = np.r_[True, k[1:] != k[:-1]]
    start = np.flatnonzero(head)[np.cumsum(head) - 1]
    before = np.cumsum(first) - first
    return first, before - before[start], start


def holders(ids: np.ndarray, keys: np.ndarray, has_keys: np.ndarray, clusters: np.ndarray | None,
            partitions: int, *, written: bool = False,
            per_key: int = HOLDERS_PER_KEY) -> list[Holders]:
    """The map side: one fragment's (key, id, cluster, signature) rows, one per band of each
    document with keys, split by key partition. ``clusters`` None: new documents. ``written``
    (documents already written): only the fragment's own representatives of each key, the only
    rows a partition step can use (a key's representative is one in its fragment too, as
    early there as it is in the table, or earlier)."""
    rows = np.flatnonzero(has_keys)
    bands = keys.shape[1] if keys.ndim == 2 else 0
    k = keys[rows].reshape(-1)
    i = np.repeat(ids[rows], bands)
    s = np.repeat(signature(keys[rows]), bands)
    c = (np.repeat(clusters[rows], bands) if clusters is not None
         else np.full(len(k), NO_CLUSTER, dtype=np.int64))
    if written and len(k):
        k, i, c, s = _by_key(k, i, c, s)
        first, rank, _ = _ranks(k, i, s)
        keep = first & (rank < per_key)
        k, i, c, s = k[keep], i[keep], c[keep], s[keep]
    return [tuple(p) for p in split_by(partition_of(k, partitions), partitions, k, i, c, s)]


def _pairs_once(d: np.ndarray, f: np.ndarray, fc: np.ndarray, rank: np.ndarray) -> Pairs:
    """Each (new id, holder) once, at its best rank, sorted by new id then holder."""
    if not len(d):
        return d, f, fc, rank
    order = np.lexsort((rank, f, d))
    d, f, fc, rank = d[order], f[order], fc[order], rank[order]
    keep = np.r_[True, (d[1:] != d[:-1]) | (f[1:] != f[:-1])]
    return d[keep], f[keep], fc[keep], rank[keep]


def candidates(*pieces: Holders, per_key: int = HOLDERS_PER_KEY) -> Pairs:
    """The reduce side of one key partition: each new holder of a key paired with the key's
    representatives of smaller id, each pair once at its best rank."""
    pieces = tuple(p for p in pieces if len(p[0]))
    if not pieces:
        return empty_pairs()
    k, i, c, s = _by_key(*(np.concatenate([p[j] for p in pieces]) for j in range(4)))
    first, before, start = _ranks(k, i, s)
    rep = first & (before < per_key)
    # a new row meets its key's first min(before, per_key) representatives, all of smaller id
    n = np.where(c == NO_CLUSTER, np.minimum(before, per_key), 0)
    row = np.repeat(np.arange(len(k)), n)
    rank = np.arange(len(row)) - np.repeat(np.cumsum(n) - n, n)
    reps_before_key = (np.cumsum(rep) - rep)[start]
    at = np.flatnonzero(rep)[reps_before_key[row] + rank]
    return _pairs_once(i[row], i[at], c[at], rank.astype(np.int64))


def route_pairs(pairs: Pairs, starts: np.ndarray) -> list[Pairs]:
    """Candidate pairs split by the group of their new document (``len(starts) + 1`` pieces)."""
    return [tuple(p) for p in split_by(group_of(pairs[0], starts), len(starts) + 1, *pairs)]


def merge_pairs(*pieces: Pairs, per_doc: int = CANDIDATES_PER_DOC) -> tuple[np.ndarray, ...]:
    """One group's candidate pairs from every partition, each pair once: (new id, holder,
    holder's cluster), sorted. A document keeps every pair with a key's first holder (rank 0)
    and, of the others, the best by rank then holder id up to ``per_doc`` pairs in all."""
    pieces = tuple(p for p in pieces if len(p[0]))
    if not pieces:
        return (np.zeros(0, np.int64),) * 3
    d, f, fc, rank = _pairs_once(*(np.concatenate([p[j] for p in pieces]) for j in range(4)))
    order = np.lexsort((f, rank, d))
    head = np.r_[True, d[order][1:] != d[order][:-1]]
    place = np.arange(len(d)) - np.flatnonzero(head)[np.cumsum(head) - 1]
    keep = np.sort(order[(rank[order] == 0) | (place < per_doc)])
    return d[keep], f[keep], fc[keep]


# ---------------------------------------------------------------------------- components

# Messages to one group: (node, root, oldest cluster)
Messages = tuple[np.ndarray, np.ndarray, np.ndarray]


def empty_messages() -> Messages:
    return (np.zeros(0, np.int64),) * 3


class GroupState:
    """One group's nodes (new documents with a confirmed pair, sorted) with their labels: the
    smallest id and the smallest older cluster seen in their component so far; and the group's
    edges, both directions, from its own nodes."""

    def __init__(self, nodes: np.ndarray, root: np.ndarray, oldc: np.ndarray,
                 src: np.ndarray, dst: np.ndarray) -> None:
        self.nodes, self.root, self.oldc, self.src, self.dst = nodes, root, oldc, src, dst

    def lookup(self, ids: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(is a node, root, oldest cluster) for ``ids``."""
        if not len(self.nodes):
            n = len(ids)
            return np.zeros(n, bool), ids.copy(), np.full(n, NONE, np.int64)
        pos = np.minimum(np.searchsorted(self.nodes, ids), len(self.nodes) - 1)
        hit = self.nodes[pos] == ids
        return hit, np.where(hit, self.root[pos], ids), np.where(hit, self.oldc[pos], NONE)


def confirmed_edges(d: np.ndarray, f: np.ndarray, fc: np.ndarray, ok: np.ndarray,
                    starts: np.ndarray) -> tuple[tuple, list[tuple[np.ndarray, np.ndarray]]]:
    """Split one group's confirmed pairs: (its edges between new documents, its attachments to
    older clusters) for itself, and the reverse edges for each group (their new holders live
    there)."""
    d, f, fc = d[ok], f[ok], fc[ok]
    new = fc == NO_CLUSTER
    own = ((d[new], f[new]), (d[~new], fc[~new]))
    rd, rf = f[new], d[new]
    reverse = [tuple(p) for p in split_by(group_of(rd, starts), len(starts) + 1, rd, rf)]
    return own, reverse


def init_group(own: tuple, *reverse: tuple[np.ndarray, np.ndarray]) -> GroupState:
    """A group's state from its confirmed edges and attachments and the reverse edges routed to
    it: every node its own root, attached nodes their smallest older cluster."""
    (ed, ef), (ad, ac) = own
    rs = [r for r in reverse if len(r[0])]
    src = np.concatenate([ed] + [r[0] for r in rs])
    dst = np.concatenate([ef] + [r[1] for r in rs])
    nodes = np.unique(np.concatenate([src, ad]))
    oldc = np.full(len(nodes), NONE, np.int64)
    if len(ad):
        np.minimum.at(oldc, np.searchsorted(nodes, ad), ac)
    return GroupState(nodes, nodes.copy(), oldc, src, dst)


def step(state: GroupState, starts: np.ndarray, first: bool,
         *incoming: Messages) -> tuple[GroupState, int, list[Messages]]:
    """One round of label propagation for one group: take the smaller labels sent to its nodes,
    settle its own components (scipy, in one go), and send the labels that changed along the
    edges that leave the group. Returns the new state, how many labels changed, and the
    messages for each group. ``first``: every label counts as changed (the first round)."""
    from scipy.sparse import coo_matrix
    from scipy.sparse.csgraph import connected_components

    nodes, root, oldc = state.nodes, state.root.copy(), state.oldc.copy()
    n_groups = len(starts) + 1
    for node, r, o in incoming:
        if len(node):
            pos = np.searchsorted(nodes, node)
            np.minimum.at(root, pos, r)
            np.minimum.at(oldc, pos, o)
    if not len(nodes):
        return state, 0, [empty_messages() for _ in range(n_groups)]
    src_pos = np.searchsorted(nodes, state.src)
    dst_pos = np.minimum(np.searchsorted(nodes, state.dst), len(nodes) - 1)
    local = nodes[dst_pos] == state.dst
    if local.any():
        graph = coo_matrix((np.ones(int(local.sum()), np.int8),
                            (src_pos[local], dst_pos[local])), shape=(len(nodes), len(nodes)))
        _, comp = connected_components(graph, directed=False)
        for labels in (root, oldc):
            best = np.full(comp.max() + 1, NONE, np.int64)
            np.minimum.at(best, comp, labels)
            labels[:] = best[comp]
    changed = (root != state.root) | (oldc != state.oldc)
    if first:
        changed[:] = True
    out = GroupState(nodes, root, oldc, state.src, state.dst)
    leaving = ~local & changed[src_pos]
    to, r, o = state.dst[leaving], root[src_pos[leaving]], oldc[src_pos[leaving]]
    messages = [tuple(p) for p in split_by(group_of(to, starts), n_groups, to, r, o)]
    return out, int(leaving.sum()), messages


def assign(ids: np.ndarray, state: GroupState) -> tuple[np.ndarray, np.ndarray]:
    """Cluster and flag of new documents from their group's settled labels: a component
    attached to older clusters joins the smallest of them (all its members flagged), else it is
    named after its smallest id (the only member not flagged)."""
    hit, root, oldc = state.lookup(ids)
    joined = hit & (oldc != NONE)
    cluster = np.where(joined, oldc, root)
    flag = joined | (hit & (root != ids))
    return cluster.astype(np.int64), flag
