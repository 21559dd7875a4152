"""The trained encoder on a :class:`~components.serving.neighbourhood.Subgraph`: its seeds' embeddings.

The subgraph lists nodes and edges hop by hop, as a GLT batch does, so the encoders run
layer-trimmed (:mod:`components.gnn.hop_trimming`): each layer computes only the nodes the next
one reads. GCN, APPNP and GCNII run on the whole subgraph, as sampled training ran them.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch
from torch import nn

from components.gnn.hop_trimming import LayerSlice, TypedLayerSlice
from components.gnn.model import HeteroEncoder, HomogeneousGCN, HomogeneousSAGE
from components.gnn.propagation import PropagationEncoder, TypedPropagationEncoder
from components.serving.neighbourhood import Subgraph

# node type, (n,) ids (new nodes negative) → (n, width) float32 input rows
InputRows = Callable[[str, np.ndarray], np.ndarray]


def typed_slices(sub: Subgraph, layers: int) -> list[TypedLayerSlice]:
    """Per layer, the prefix of each type's nodes and each edge type's edges it reads."""
    node_ends = {t: np.cumsum(c).tolist() for t, c in sub.node_counts.items()}
    edge_ends = {e: np.cumsum(c).tolist() if c else [0] * layers for e, c in sub.edge_counts.items()}
    return [
        TypedLayerSlice(
            sources={t: ends[layers - layer] for t, ends in node_ends.items()},
            targets={t: ends[layers - 1 - layer] for t, ends in node_ends.items()},
            edges={e: ends[layers - 1 - layer] for e, ends in edge_ends.items()},
        )
        for layer in range(layers)
    ]


def prepare(encoder: nn.Module) -> None:
    """Featureless types read their rows from the inputs (as sharded tables do), whichever way the
    model stored them: the server supplies trained rows, and the cold-start row for new nodes."""
    if isinstance(encoder, (HeteroEncoder, TypedPropagationEncoder)):
        encoder.sharded = set(encoder.sharded) | set(encoder.embedding.keys())


def whole_subgraph(encoder: nn.Module) -> bool:
    """Whether ``encoder`` reads its whole subgraph at once (GCN, APPNP, GCNII: degrees and propagation
    over every node of it), so that a seed's embedding depends on the other seeds it is batched with."""
    return isinstance(encoder, (HomogeneousGCN, PropagationEncoder, TypedPropagationEncoder))


@torch.inference_mode()
def encode_seeds(encoder: nn.Module, sub: Subgraph, inputs: InputRows, layers: int) -> dict[str, torch.Tensor]:
    """Node type → (seeds of the type, hidden) embeddings, in seed order."""
    seeds = {t: c[0] for t, c in sub.node_counts.items()}
    if isinstance(encoder, (HomogeneousSAGE, HomogeneousGCN, PropagationEncoder)):
        (node_type,) = sub.nodes
        (edge_type,) = sub.edges
        features = torch.from_numpy(inputs(node_type, sub.nodes[node_type]))
        edge_index = torch.from_numpy(sub.edges[edge_type])
        if isinstance(encoder, (HomogeneousGCN, PropagationEncoder)):
            return {node_type: encoder(features, edge_index)[: seeds[node_type]]}
        slices = [LayerSlice(s.sources[node_type], s.targets[node_type], s.edges[edge_type]) for s in typed_slices(sub, layers)]
        return {node_type: encoder.forward_trimmed(features, edge_index, slices)}
    assert isinstance(encoder, (HeteroEncoder, TypedPropagationEncoder))  # the typed appnp/gcnii ignore the slices
    reads = set(encoder.project) | set(encoder.sharded)
    x = {t: torch.from_numpy(inputs(t, ids)) for t, ids in sub.nodes.items() if t in reads}
    nodes = {t: torch.from_numpy(ids) for t, ids in sub.nodes.items()}
    edges = {e: torch.from_numpy(v) for e, v in sub.edges.items()}
    out = encoder(x, edges, nodes, None, typed_slices(sub, layers))
    return {t: v[: seeds[t]] for t, v in out.items()}
