"""The subgraph a batch of seeds is encoded on: hop by hop, vectorised over the CSR adjacency.

Layout (what GLT batches hold and :mod:`components.gnn.hop_trimming` reads): each node type's
nodes listed hop by hop (the seeds first), each edge type's edges hop by hop (hop h's edges point
from their neighbours into hop h-1's nodes), with the count of each hop. Every node's neighbour
list is drawn once, when it is first reached, and all layers read that one list.

Sampling: a node with more neighbours along a relation than the hop's fan-out keeps the
``fan_out`` of them with the smallest keys, a key being a splitmix64 hash of the edge's
position in the CSR (for a new node's request edges, of the neighbour's id): without
replacement, uniform, and a pure function of the node, so a node's sample does not depend on
which other nodes share its batch, and the same request always gets the same answer. With no
fan-outs every neighbour is taken (full neighbourhoods, what exact inference aggregates).

Seeds may be new nodes: they carry negative ids (-1 - j for the type's j-th new node), and their
first hop is given (the request's edges) instead of read from the adjacency.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from components.gnn.model import EdgeType
from components.serving.graph_store import Adjacency, GraphStore, Relation

_MIX1, _MIX2, _GOLDEN = np.uint64(0xBF58476D1CE4E5B9), np.uint64(0x94D049BB133111EB), np.uint64(0x9E3779B97F4A7C15)


def mix(values: np.ndarray, salt: int) -> np.ndarray:
    """(n,) uint64 splitmix64 of int64 ``values`` under ``salt``."""
    with np.errstate(over="ignore"):
        z = values.astype(np.uint64) + np.uint64(salt) * _GOLDEN
        z = (z ^ (z >> np.uint64(30))) * _MIX1
        z = (z ^ (z >> np.uint64(27))) * _MIX2
        return z ^ (z >> np.uint64(31))


def keep_smallest(segments: np.ndarray, keys: np.ndarray, sizes: np.ndarray, fan_out: int) -> np.ndarray:
    """Indices of the entries to keep: in each segment (``segments`` (n,) sorted segment numbers,
    ``sizes`` entries per segment) the ``fan_out`` entries with the smallest ``keys``."""
    if not len(segments) or int(sizes.max()) <= fan_out:
        return np.arange(len(segments))
    order = np.lexsort((keys, segments))
    first = np.repeat(np.cumsum(sizes) - sizes, sizes)
    rank = np.arange(len(segments)) - first
    return np.sort(order[rank < fan_out])


def expand(adjacency: Adjacency, ids: np.ndarray, fan_out: int | None, salt: int) -> tuple[np.ndarray, np.ndarray]:
    """(which of ``ids`` each neighbour belongs to, neighbour ids) of existing nodes ``ids``."""
    starts = np.asarray(adjacency.indptr[ids], dtype=np.int64)
    sizes = np.asarray(adjacency.indptr[ids + 1], dtype=np.int64) - starts
    total = int(sizes.sum())
    segments = np.repeat(np.arange(len(ids)), sizes)
    positions = np.repeat(starts - (np.cumsum(sizes) - sizes), sizes) + np.arange(total)
    if fan_out is not None:
        kept = keep_smallest(segments, mix(positions, salt), sizes, fan_out)
        segments, positions = segments[kept], positions[kept]
    return segments, np.asarray(adjacency.indices[positions], dtype=np.int64)


@dataclass(frozen=True)
class GivenEdges:
    """A new seed's request edges along one relation: ``seeds`` (m,) positions among the
    aggregating type's seeds, ``neighbours`` (m,) partition ids of the other ends."""

    relation: Relation
    seeds: np.ndarray
    neighbours: np.ndarray


@dataclass(frozen=True)
class Subgraph:
    """Nodes per type (partition ids; new nodes negative) and edges per encoder edge type
    ((2, e) [source position; target position] within their types), with counts per hop."""

    nodes: dict[str, np.ndarray]
    node_counts: dict[str, list[int]]
    edges: dict[EdgeType, np.ndarray]
    edge_counts: dict[EdgeType, list[int]]


class _Positions:
    """One node type's nodes so far, and where each id sits among them."""

    def __init__(self, seeds: np.ndarray) -> None:
        self.ids = [seeds]
        self._all = seeds
        self._order = np.argsort(seeds, kind="stable")

    def add_new(self, candidates: np.ndarray) -> np.ndarray:
        """Appends the candidates not seen yet; returns them (the next frontier)."""
        unique = np.unique(candidates)
        known = self.find(unique) >= 0
        fresh = unique[~known]
        self.ids.append(fresh)
        self._all = np.concatenate([self._all, fresh])
        self._order = np.argsort(self._all, kind="stable")
        return fresh

    def find(self, ids: np.ndarray) -> np.ndarray:
        """Position of each id among the nodes so far (-1: not there)."""
        if not len(self._all):
            return np.full(len(ids), -1, dtype=np.int64)
        ordered = self._all[self._order]
        at = np.minimum(np.searchsorted(ordered, ids), len(ordered) - 1)
        return np.where(ordered[at] == ids, self._order[at], -1)


def fan_out_at(fan_outs: dict[str, list[int]] | None, relation: Relation, hop: int) -> int | None:
    return None if fan_outs is None else fan_outs[relation.stored][hop]


def sample_given(given: list[GivenEdges], fan_outs: dict[str, list[int]] | None, salt: int) -> list[GivenEdges]:
    """The request edges each new seed keeps: at most the first hop's fan-out per relation."""
    out = []
    for edges in given:
        fan_out = fan_out_at(fan_outs, edges.relation, 0)
        order = np.lexsort((edges.neighbours, edges.seeds))
        seeds, neighbours = edges.seeds[order], edges.neighbours[order]
        if fan_out is not None and len(seeds):
            _, sizes = np.unique(seeds, return_counts=True)
            kept = keep_smallest(seeds, mix(neighbours, salt), sizes, fan_out)
            seeds, neighbours = seeds[kept], neighbours[kept]
        out.append(GivenEdges(edges.relation, seeds, neighbours))
    return out


def build_subgraph(
    store: GraphStore,
    seeds: dict[str, np.ndarray],
    given: list[GivenEdges],
    layers: int,
    fan_outs: dict[str, list[int]] | None,
    salt: int = 0,
) -> Subgraph:
    """The ``layers``-hop subgraph of ``seeds`` (type → ids, new seeds negative), sampled with
    ``fan_outs`` (stored edge type → one fan-out per hop) or, with None, every neighbour."""
    types = list(store.counts)
    empty = np.zeros(0, dtype=np.int64)
    nodes = {t: _Positions(np.asarray(seeds.get(t, empty), dtype=np.int64)) for t in types}
    frontier = {t: (0, nodes[t].ids[0]) for t in types}  # (position of its first node, its ids)
    edges: dict[EdgeType, list[np.ndarray]] = {r.batch: [] for r in store.relations}
    for hop in range(layers):
        found: list[tuple[Relation, np.ndarray, np.ndarray]] = []  # (relation, target positions, neighbour ids)
        for relation in store.relations:
            start, ids = frontier[relation.aggregating]
            existing = np.flatnonzero(ids >= 0)
            which, neighbours = expand(store.adjacency[relation.stored], ids[existing], fan_out_at(fan_outs, relation, hop), salt)
            found.append((relation, start + existing[which], neighbours))
        if hop == 0:
            found += [(g.relation, g.seeds, g.neighbours) for g in sample_given(given, fan_outs, salt)]
        reached: dict[str, list[np.ndarray]] = {t: [] for t in types}
        for relation, _, neighbours in found:
            reached[relation.neighbour].append(neighbours)
        fresh = {t: nodes[t].add_new(np.concatenate(reached[t])) if reached[t] else empty for t in types}
        frontier = {t: (sum(len(i) for i in nodes[t].ids[:-1]), fresh[t]) for t in types}
        hop_edges: dict[EdgeType, list[np.ndarray]] = {}
        for relation, targets, neighbours in found:
            hop_edges.setdefault(relation.batch, []).append(np.stack([nodes[relation.neighbour].find(neighbours), targets]))
        for batch in edges:
            parts = hop_edges.get(batch, [])
            edges[batch].append(np.concatenate(parts, axis=1) if parts else np.zeros((2, 0), dtype=np.int64))
    return Subgraph(
        nodes={t: np.concatenate(nodes[t].ids) for t in types},
        node_counts={t: [len(i) for i in nodes[t].ids] for t in types},
        edges={e: np.concatenate(v, axis=1) for e, v in edges.items()},
        edge_counts={e: [v.shape[1] for v in parts] for e, parts in edges.items()},
    )
