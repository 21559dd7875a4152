"""Layer-wise trimming of a sampled homogeneous batch: each layer computes only the nodes the
next one reads.

A GLT batch lists its nodes hop by hop (the seeds, then each hop's new nodes) and its edges hop
by hop (hop h's edges point from its sampled neighbours into hop h-1's nodes), and says how many
of each (``num_sampled_nodes``: hops + 1 counts, ``num_sampled_edges``: hops counts). An L-layer
encoder's output is read at the seeds only, so layer l (0-based) needs outputs for hops
0 … L-1-l alone, computed from the edges into them (hops 1 … L-l) and their sources (hops
0 … L-l). Computing every layer on every node, as a plain forward does, spends most of its
work on the last hop's nodes (about five in six of a [15, 10] batch's), whose outputs nothing reads.

The seeds' outputs are the same as the untrimmed forward's, to float rounding.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class LayerSlice:
    """What one layer reads and writes: the first ``sources`` nodes, the first ``edges`` edges
    (every edge into the first ``targets`` nodes), and outputs for the first ``targets`` nodes."""

    sources: int
    targets: int
    edges: int


def _node_count(store) -> int:
    """A batch's (or a node type's) node count from its ids or features: PyG's ``num_nodes``
    may read a GLT batch's ``batch`` (its seeds) instead."""
    if "node" in store:
        return int(store.node.numel())
    return int(store.x.size(0)) if "x" in store else int(store.num_nodes)


def _ends(counts, length: int) -> list[int]:
    """Cumulative counts of ``length`` hops, the hops a batch does not list being empty."""
    return torch.tensor(([int(c) for c in counts] + [0] * length)[:length]).cumsum(0).tolist()


def layer_slices(batch, num_layers: int) -> list[LayerSlice] | None:
    """Per layer, the prefix of nodes and edges it needs; None when the batch does not say its
    hops (full-graph blocks, a batch built by hand) or its counts do not add up to its tensors."""
    nodes, edges = getattr(batch, "num_sampled_nodes", None), getattr(batch, "num_sampled_edges", None)
    if nodes is None or edges is None or isinstance(nodes, dict):
        return None
    node_counts = [int(n) for n in nodes]
    edge_counts = [int(e) for e in edges]
    if sum(node_counts) != _node_count(batch) or sum(edge_counts) != batch.edge_index.size(1):
        return None
    if not node_counts or len(edge_counts) != len(node_counts) - 1:
        return None
    # A batch whose sampling stopped early (no new neighbours) has fewer hops: the missing ones are empty.
    node_ends, edge_ends = _ends(node_counts, num_layers + 1), _ends(edge_counts, num_layers)
    return [
        LayerSlice(
            sources=node_ends[num_layers - layer], targets=node_ends[num_layers - 1 - layer], edges=edge_ends[num_layers - 1 - layer]
        )
        for layer in range(num_layers)
    ]


def trimmed_inputs(x: torch.Tensor, edge_index: torch.Tensor, layer: LayerSlice) -> tuple[tuple[torch.Tensor, torch.Tensor], torch.Tensor]:
    """((sources, d) source states, (targets, d) target states) and the (2, edges) edges a
    bipartite convolution of ``layer`` takes. x: (n, d) states of at least ``sources`` nodes."""
    return (x[: layer.sources], x[: layer.targets]), edge_index[:, : layer.edges]


@dataclass(frozen=True)
class TypedLayerSlice:
    """:class:`LayerSlice` per node type (sources, targets) and per edge type (edges)."""

    sources: dict[str, int]
    targets: dict[str, int]
    edges: dict[tuple[str, str, str], int]


def typed_layer_slices(batch, num_layers: int) -> list[TypedLayerSlice] | None:
    """Per layer, the prefix of each node type's nodes and each edge type's edges it needs, for a
    heterogeneous batch (GLT: ``num_sampled_nodes`` per node type, ``num_sampled_edges`` per edge
    type, each hop by hop); None when the batch does not say its hops or they do not add up."""
    nodes, edges = getattr(batch, "num_sampled_nodes", None), getattr(batch, "num_sampled_edges", None)
    if not isinstance(nodes, dict) or not isinstance(edges, dict):
        return None
    node_ends, edge_ends = {}, {}
    for node_type in batch.node_types:
        counts = nodes.get(node_type)
        if counts is None or sum(int(c) for c in counts) != _node_count(batch[node_type]) or len(counts) > num_layers + 1:
            return None
        node_ends[node_type] = _ends(counts, num_layers + 1)
    for edge_type in batch.edge_types:
        counts = edges.get(edge_type)
        if counts is None or sum(int(c) for c in counts) != batch[edge_type].edge_index.size(1) or len(counts) > num_layers:
            return None
        edge_ends[edge_type] = _ends(counts, num_layers)
    return [
        TypedLayerSlice(
            sources={t: ends[num_layers - layer] for t, ends in node_ends.items()},
            targets={t: ends[num_layers - 1 - layer] for t, ends in node_ends.items()},
            edges={e: ends[num_layers - 1 - layer] for e, ends in edge_ends.items()},
        )
        for layer in range(num_layers)
    ]


def typed_from_homogeneous(slices: list[LayerSlice], node_type: str, edge_type: tuple[str, str, str]) -> list[TypedLayerSlice]:
    """A homogeneous batch's slices in the per-type form (one node type, one edge type)."""
    return [TypedLayerSlice({node_type: s.sources}, {node_type: s.targets}, {edge_type: s.edges}) for s in slices]
