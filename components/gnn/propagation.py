"""Propagation encoders: APPNP (``model.type: appnp``) and GCNII (``model.type: gcnii``).

Both transform each node's features first and then propagate over the graph with the
symmetric-normalised adjacency with self-loops, Â = D^-1/2 (A + I) D^-1/2 (PyG's ``gcn_norm``: a
node's self-loops replaced by exactly one, D counted with it), mixing the first representation
back in at every step, which lets them propagate much further than a stack of two or three
layers without every node's state washing out into the same average.

- APPNP (Gasteiger et al., ICLR 2019): h0 = MLP(x) (``model.num_layers`` linear layers, ReLU and
  dropout between them, dropout on the input), then ``model.propagation_steps`` (K) steps of
  personalized PageRank, h_{k+1} = (1 - α) Â h_k + α h0, with teleport α (``model.teleport``).
  The paper propagates class scores; here the MLP ends at ``hidden_channels`` and the embeddings
  are propagated, so that the model gives embeddings (infer, link prediction) and the task's
  head reads them, as it reads every other encoder's.
- GCNII (Chen et al., ICML 2020; PyG's ``GCN2Conv``): h0 = ReLU(Linear(dropout(x))), then
  ``model.num_layers`` layers h ← ((1 - α) Â h + α h0)((1 - β_l) I + β_l W_l) with the initial
  residual α (``model.teleport``) and the identity mapping β_l = log(λ / l + 1) (λ:
  ``model.identity_strength``), dropout before each layer and ReLU between them.

On a sampled batch (``training.mode: sampled``) the propagation runs over the whole sampled
subgraph, as it comes from the sampler: its nodes (the seeds and every hop's neighbours) and its
edges (each pointing from a sampled neighbour to the node that sampled it), normalised with the
degrees *within the subgraph*. That is an approximation of the whole graph's propagation: it
reaches as many hops as ``training.fan_outs`` lists, and a node's degree is at most its fan-out
plus one. The full-graph form (:mod:`components.gnn.full_graph.propagation`) runs the same modules
over the whole graph with its true degrees: exact.

Both need one node type with features and one edge type (no per-relation form yet: the config
refuses them on a heterogeneous graph).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from torch_geometric.nn import APPNP, GCN2Conv
from torch_geometric.nn.conv.gcn_conv import gcn_norm

from components.config import ModelSpec
from components.errors import GnnflowError
from components.gnn.model import EdgeType, NodeInput, decoded_features


class PropagationEncoder(nn.Module):
    """What both encoders share: one node type, and a forward over a whole batch's subgraph
    ((n, in_dim) features, (2, e) edges → (n, hidden)); no hop trimming, since every step reads
    every node of the subgraph."""

    node_type: str
    dropout: nn.Dropout

    def encode_batch(self, batch) -> dict[str, torch.Tensor]:
        return {self.node_type: self(decoded_features(self, self.node_type, batch.x), batch.edge_index)}


def normalised_edges(edge_index: torch.Tensor, num_nodes: int, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """(2, e') edges with one self-loop per node and (e',) weights (deg_src deg_dst)^-1/2: Â, once per forward."""
    edges, weights = gcn_norm(edge_index, None, num_nodes, False, True, "source_to_target", dtype)
    return edges, weights


class APPNPEncoder(PropagationEncoder):
    """MLP, then K steps of personalized-PageRank propagation (see the module docstring)."""

    def __init__(self, node_type: str, in_dim: int, spec: ModelSpec) -> None:
        super().__init__()
        self.node_type = node_type
        widths = [in_dim] + [spec.hidden_channels] * spec.num_layers
        self.lins = nn.ModuleList(nn.Linear(a, b) for a, b in zip(widths, widths[1:]))
        self.dropout = nn.Dropout(spec.dropout)
        self.propagation = APPNP(spec.propagation_steps, spec.teleport, normalize=False)

    @property
    def steps(self) -> int:
        return self.propagation.K

    @property
    def teleport(self) -> float:
        return self.propagation.alpha

    def transform(self, x: torch.Tensor, dropout=None) -> torch.Tensor:
        """(n, in_dim) → (n, hidden) h0, the MLP. ``dropout(h, layer)`` replaces the module's own
        dropout (the full-graph form draws its masks per node id)."""
        drop = dropout or (lambda h, _layer: self.dropout(h))
        last = len(self.lins) - 1
        for i, lin in enumerate(self.lins):
            x = lin(drop(x, i))
            if i < last:
                x = F.relu(x)
        return x

    def forward(self, x: torch.Tensor, edge_index: torch.Tensor) -> torch.Tensor:
        edges, weights = normalised_edges(edge_index, x.size(0), x.dtype)
        return self.propagation(self.transform(x), edges, weights)


class GCNIIEncoder(PropagationEncoder):
    """Linear input layer, then GCN2Conv layers (see the module docstring)."""

    def __init__(self, node_type: str, in_dim: int, spec: ModelSpec) -> None:
        super().__init__()
        self.node_type = node_type
        self.lin = nn.Linear(in_dim, spec.hidden_channels)
        self.convs = nn.ModuleList(
            GCN2Conv(spec.hidden_channels, spec.teleport, spec.identity_strength, layer + 1, shared_weights=True, normalize=False)
            for layer in range(spec.num_layers)
        )
        self.dropout = nn.Dropout(spec.dropout)

    def forward(self, x: torch.Tensor, edge_index: torch.Tensor) -> torch.Tensor:
        edges, weights = normalised_edges(edge_index, x.size(0), x.dtype)
        h = h0 = F.relu(self.lin(self.dropout(x)))
        last = len(self.convs) - 1
        for i, conv in enumerate(self.convs):
            h = conv(self.dropout(h), h0, edges, weights)
            if i < last:
                h = F.relu(h)
        return h


def build_propagation_encoder(spec: ModelSpec, inputs: dict[str, NodeInput], edge_types: list[EdgeType]) -> PropagationEncoder:
    """The ``model.type`` appnp or gcnii encoder of a homogeneous graph with node features."""
    (node_type, node), *others = inputs.items()
    if others or len(edge_types) != 1 or not node.feature_dim:
        raise GnnflowError(
            f"model.type {spec.type} supports homogeneous graphs with node features (one node type, one edge type); "
            f"this graph has {len(inputs)} node types, {len(edge_types)} edge types"
        )
    if spec.type == "appnp":
        return APPNPEncoder(node_type, node.feature_dim, spec)
    if spec.type == "gcnii":
        return GCNIIEncoder(node_type, node.feature_dim, spec)
    raise GnnflowError(f"model.type {spec.type} is not a propagation model (appnp, gcnii)")
