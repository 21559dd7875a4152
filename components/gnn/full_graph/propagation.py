"""APPNP and GCNII (:mod:`components.gnn.propagation`) over the whole graph: exact propagation.

The same modules and weights as sampled training; each step of propagation, Â h =
D^-1/2 (A + I) D^-1/2 h, is one distributed neighbour sum (:func:`.aggregate.aggregate`, over a
graph built with ``gcn=True``: one self-loop per node, ``gcn_norm`` its deg^-1/2), each worker
scaling its own rows by its nodes' deg^-1/2 before and after. Per-node work (the MLP, GCNII's
input layer and weights) needs no peer. Autograd runs back through every step; the sums keep
nothing fetched for backward, so a worker's memory grows with K (or the layers) times its own
(n, hidden) rows, plus one fetched block.

Dropout masks are drawn per node id (:mod:`.node_dropout`): 1 and N workers compute the same.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from components.errors import GnnflowError
from components.gnn.full_graph.aggregate import aggregate
from components.gnn.full_graph.graph import FullGraph
from components.gnn.full_graph.node_dropout import node_dropout
from components.gnn.full_graph.sparse_input import SparseFeatures, input_dropout, linear
from components.gnn.propagation import APPNPEncoder, GCNIIEncoder, PropagationEncoder


def normalised_sum(h: torch.Tensor, graph: FullGraph) -> torch.Tensor:
    """(n, d) → (n, d) Â h over the whole graph: D^-1/2 (A + I) D^-1/2 h; collective."""
    if graph.gcn_norm is None:
        raise GnnflowError("propagation needs a graph built with gcn=True")
    norm = graph.gcn_norm.unsqueeze(1)
    return norm * aggregate(norm * h, graph.plan, "sum")


def _mlp(encoder: APPNPEncoder, graph: FullGraph, x: torch.Tensor | SparseFeatures, key: int | None) -> torch.Tensor:
    """APPNPEncoder.transform (dropout, then each linear layer, ReLU between), its input dense or sparse."""
    p, training, ids = encoder.dropout.p, encoder.training, graph.dropout_ids
    last = len(encoder.lins) - 1
    h = linear(input_dropout(x, ids, p, training, key, 0), encoder.lins[0].weight, encoder.lins[0].bias)
    for i, lin in enumerate(encoder.lins):
        if i > 0:
            h = lin(node_dropout(h, ids, p, training, key, i))
        if i < last:
            h = F.relu(h)
    return h


def _appnp(encoder: APPNPEncoder, graph: FullGraph, x: torch.Tensor | SparseFeatures, key: int | None) -> torch.Tensor:
    h0 = _mlp(encoder, graph, x, key)
    alpha = encoder.teleport
    h = h0
    for _ in range(encoder.steps):
        h = (1 - alpha) * normalised_sum(h, graph) + alpha * h0
    return h


def _gcnii_layer(conv: nn.Module, h: torch.Tensor, h0: torch.Tensor, graph: FullGraph) -> torch.Tensor:
    """GCN2Conv with shared weights: p = (1 - α) Â h + α h0, then (1 - β) p + β p W."""
    if conv.weight2 is not None:
        raise GnnflowError("full-graph GCNII supports GCN2Conv with shared weights only")
    mixed = (1 - conv.alpha) * normalised_sum(h, graph) + conv.alpha * h0
    return (1 - conv.beta) * mixed + conv.beta * (mixed @ conv.weight1)


def _gcnii(encoder: GCNIIEncoder, graph: FullGraph, x: torch.Tensor | SparseFeatures, key: int | None) -> torch.Tensor:
    p, training = encoder.dropout.p, encoder.training
    h = h0 = F.relu(linear(input_dropout(x, graph.dropout_ids, p, training, key, 0), encoder.lin.weight, encoder.lin.bias))
    last = len(encoder.convs) - 1
    for i, conv in enumerate(encoder.convs):
        h = _gcnii_layer(conv, node_dropout(h, graph.dropout_ids, p, training, key, i + 1), h0, graph)
        if i < last:
            h = F.relu(h)
    return h


def encode_propagation(
    encoder: PropagationEncoder, graph: FullGraph, x: torch.Tensor | SparseFeatures, dropout_key: int | None = None
) -> torch.Tensor:
    """(n, in_dim) features of this worker's nodes → (n, hidden) embeddings; collective."""
    if isinstance(encoder, APPNPEncoder):
        return _appnp(encoder, graph, x, dropout_key)
    if isinstance(encoder, GCNIIEncoder):
        return _gcnii(encoder, graph, x, dropout_key)
    raise GnnflowError(f"no full-graph form of {type(encoder).__name__}")


def describe(encoder: PropagationEncoder) -> str:
    """What a log line says of the encoder's depth."""
    if isinstance(encoder, APPNPEncoder):
        return f"{len(encoder.lins)}-layer MLP, {encoder.steps} propagation steps"
    return f"{len(getattr(encoder, 'convs', ()))} GCNII layers"
