"""The partitioned steps of ``near_dup``: band keys shuffled by key, candidate pairs per
partition, and connected components by label propagation over groups of documents.

Pure numpy (and scipy for a group's own components), no table access and no executor: each
function is one task's work, called in this process for the single-process path and as a Ray
task for the distributed one, so both give the same columns by construction. Arrays only cross
task boundaries; nothing here holds state between calls.

Semantics (what makes the result independent of how the corpus is partitioned, and of a run
interrupted between commits): for each band key, the *first holder* is the document with the
smallest id among every document of the pinned version that has that key (rows already written
and this run's new rows alike). Each new document that holds the key and is not its first holder
becomes a candidate with the first holder. Candidates are confirmed by exact Jaccard elsewhere;
confirmed pairs with a new first holder are edges between new documents, those with an old one
attach the new document to that document's cluster. A connected component of new documents
then takes the smallest cluster it attaches to, else its smallest id; every member but an
unattached component's smallest id is flagged.
"""

from __future__ import annotations

import numpy as np

from lance_assets.table.executor import group_of

NO_CLUSTER = np.int64(-1)  # a new document's cluster before this run: none yet
NONE = np.iinfo(np.int64).max  # no attachment to an older cluster

# One partition's share of a fragment: (band key, id, cluster or NO_CLUSTER when new)
Holders = tuple[np.ndarray, np.ndarray, np.ndarray]
# Candidate pairs: (new id, first holder's id, first holder's cluster or NO_CLUSTER)
Pairs = tuple[np.ndarray, np.ndarray, np.ndarray]


def empty_holders() -> Holders:
    return (np.zeros(0, np.int64),) * 3


def partition_of(keys: np.ndarray, partitions: int) -> np.ndarray:
    """Each key's partition: its high 32 bits scaled to ``[0, partitions)`` (keys are hashes)."""
    high = keys.view(np.uint64) >> np.uint64(32)
    return ((high * np.uint64(partitions)) >> np.uint64(32)).astype(np.int64)


def split_by(part: np.ndarray, parts: int, *arrays: np.ndarray) -> list[tuple[np.ndarray, ...]]:
    """``arrays`` cut into ``parts`` pieces by ``part`` (each piece keeps the input order)."""
    if parts == 1:
        return [tuple(arrays)]
    order = np.argsort(part, kind="stable")
    bounds = np.searchsorted(part[order], np.arange(parts + 1))
    return [tuple(a[order[lo:hi]] for a in arrays) for lo, hi in zip(bounds[:-1], bounds[1:])]


def holders(ids: np.ndarray, keys: np.ndarray, has_keys: np.ndarray, clusters: np.ndarray | None,
            partitions: int, first_only: bool = False) -> list[Holders]:
    """The map side: one fragment's (key, id, cluster) triples, one per band of each document
    with keys, split by key partition. ``clusters`` None: new documents. ``first_only`` (for
    documents already written, ids ascending): only the first holder of each key in the
    fragment, the only one a later partition step can use."""
    rows = np.flatnonzero(has_keys)
    bands = keys.shape[1] if keys.ndim == 2 else 0
    k = keys[rows].reshape(-1)
    i = np.repeat(ids[rows], bands)
    c = (np.repeat(clusters[rows], bands) if clusters is not None
         else np.full(len(k), NO_CLUSTER, dtype=np.int64))
    if first_only and len(k):
        order = np.lexsort((i, k))
        head = np.r_[True, k[order][1:] != k[order][:-1]]
        keep = order[head]
        k, i, c = k[keep], i[keep], c[keep]
    return [tuple(p) for p in split_by(partition_of(k, partitions), partitions, k, i, c)]


def candidates(*pieces: Holders) -> Pairs:
    """The reduce side of one key partition: every (new document, first holder) pair of its
    keys, once per pair, sorted by new id then first holder."""
    pieces = tuple(p for p in pieces if len(p[0]))
    if not pieces:
        return (np.zeros(0, np.int64),) * 3
    k = np.concatenate([p[0] for p in pieces])
    i = np.concatenate([p[1] for p in pieces])
    c = np.concatenate([p[2] for p in pieces])
    order = np.lexsort((i, k))
    k, i, c = k[order], i[order], c[order]
    head = np.r_[True, k[1:] != k[:-1]]
    first = np.flatnonzero(head)[np.cumsum(head) - 1]  # each row's first holder (position)
    pick = ~head & (c == NO_CLUSTER) & (i != i[first])
    d, f, fc = i[pick], i[first[pick]], c[first[pick]]
    if not len(d):
        return d, f, fc
    order = np.lexsort((f, d))
    d, f, fc = d[order], f[order], fc[order]
    keep = np.r_[True, (d[1:] != d[:-1]) | (f[1:] != f[:-1])]
    return d[keep], f[keep], fc[keep]


def route_pairs(pairs: Pairs, starts: np.ndarray) -> list[Pairs]:
    """Candidate pairs split by the group of their new document (``len(starts) + 1`` pieces)."""
    return [tuple(p) for p in split_by(group_of(pairs[0], starts), len(starts) + 1, *pairs)]


def merge_pairs(*pieces: Pairs) -> Pairs:
    """One group's candidate pairs from every partition, each pair once."""
    pieces = tuple(p for p in pieces if len(p[0]))
    if not pieces:
        return (np.zeros(0, np.int64),) * 3
    d, f, fc = (np.concatenate([p[j] for p in pieces]) for j in range(3))
    order = np.lexsort((f, d))
    d, f, fc = d[order], f[order], fc[order]
    keep = np.r_[True, (d[1:] != d[:-1]) | (f[1:] != f[:-1])]
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
    older clusters) for itself, and the reverse edges for each group (their new first holders
    live there)."""
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
