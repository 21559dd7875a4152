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

A graph with several node types or edge types, or a featureless node type, gets the typed form
(:class:`TypedPropagationEncoder`): each node type's input goes through its own input layer to
``hidden_channels`` (appnp: its own MLP; gcnii: its own ReLU(Linear)); a featureless type's input
is its learnt embedding (``gnn.learnt_embeddings``), already ``hidden_channels`` wide. Then the same
propagation runs over the batch's homogeneous view: every node of every type is one node, every
edge of every message edge type one edge, and Â is normalised with the degrees counted over all
of them inside the batch. Propagation needs only one adjacency, so this is well defined; relation
types are not distinguished (rgcn and gat keep one weight per relation). Full-graph training and
exact inference remain homogeneous-only (the config and infer refuse them before any step).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from torch_geometric.nn import APPNP, GCN2Conv
from torch_geometric.nn.conv.gcn_conv import gcn_norm

from components.config import ModelSpec
from components.errors import GnnflowError
from components.gnn.model import EdgeType, NodeInput, decoded_features, typed_input


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

    def input_layers(self) -> list[nn.Module]:
        return [self.lins[0]]

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

    def input_layers(self) -> list[nn.Module]:
        return [self.lin]

    def forward(self, x: torch.Tensor, edge_index: torch.Tensor) -> torch.Tensor:
        edges, weights = normalised_edges(edge_index, x.size(0), x.dtype)
        h = h0 = F.relu(self.lin(self.dropout(x)))
        last = len(self.convs) - 1
        for i, conv in enumerate(self.convs):
            h = conv(self.dropout(h), h0, edges, weights)
            if i < last:
                h = F.relu(h)
        return h


class InputMLP(nn.Module):
    """appnp's per-type input of the typed form: (n, in_dim) → (n, hidden), the homogeneous MLP's
    layers (dropout before each linear layer, ReLU between them)."""

    def __init__(self, in_dim: int, spec: ModelSpec) -> None:
        super().__init__()
        widths = [in_dim] + [spec.hidden_channels] * spec.num_layers
        self.lins = nn.ModuleList(nn.Linear(a, b) for a, b in zip(widths, widths[1:]))
        self.dropout = nn.Dropout(spec.dropout)

    def input_layer(self) -> nn.Module:
        return self.lins[0]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        last = len(self.lins) - 1
        for i, lin in enumerate(self.lins):
            x = lin(self.dropout(x))
            if i < last:
                x = F.relu(x)
        return x


class InputLinear(nn.Module):
    """gcnii's per-type input of the typed form: (n, in_dim) → (n, hidden), ReLU(Linear(dropout(x)))."""

    def __init__(self, in_dim: int, spec: ModelSpec) -> None:
        super().__init__()
        self.lin = nn.Linear(in_dim, spec.hidden_channels)
        self.dropout = nn.Dropout(spec.dropout)

    def input_layer(self) -> nn.Module:
        return self.lin

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.relu(self.lin(self.dropout(x)))


def homogeneous_view(
    h: dict[str, torch.Tensor], edge_index: dict[EdgeType, torch.Tensor], edge_types: list[EdgeType]
) -> tuple[torch.Tensor, torch.Tensor, list[str]]:
    """Per-type rows and typed edges → ((n, d) rows of every type stacked in the order of ``h``,
    (2, e) edges of ``edge_types`` between them, the type order): each type's local indices
    shifted by the rows of the types before it."""
    order = list(h)
    offsets, total = {}, 0
    for node_type in order:
        offsets[node_type] = total
        total += h[node_type].size(0)
    rows = torch.cat([h[t] for t in order])
    parts = [
        edge_index[e] + torch.tensor([[offsets[e[0]]], [offsets[e[2]]]], device=rows.device)
        for e in edge_types
        if e in edge_index and e[0] in offsets and e[2] in offsets
    ]
    edges = torch.cat(parts, dim=1) if parts else torch.empty(2, 0, dtype=torch.long, device=rows.device)
    return rows, edges, order


class TypedPropagationEncoder(nn.Module):
    """appnp or gcnii on typed nodes and edges (see the module docstring): per-type inputs, then
    propagation over the batch's homogeneous view. Answers the ``HeteroEncoder`` interface
    (``project``, ``embedding``, ``sharded``, ``forward(x, edge_index, node, ...)``), so tasks,
    inference, learnt-embedding handling and serving treat it alike; every row of the subgraph is
    computed (no hop trimming: every step reads every node)."""

    def __init__(self, inputs: dict[str, NodeInput], edge_types: list[EdgeType], spec: ModelSpec) -> None:
        super().__init__()
        if spec.type not in ("appnp", "gcnii"):
            raise GnnflowError(f"model.type {spec.type} is not a propagation model (appnp, gcnii)")
        self.node_types, self.edge_types, self.kind = list(inputs), list(edge_types), spec.type
        layer = InputMLP if spec.type == "appnp" else InputLinear
        self.project = nn.ModuleDict({t: layer(i.feature_dim, spec) for t, i in inputs.items() if i.feature_dim})
        learnt = {t: i for t, i in inputs.items() if not i.feature_dim}
        self.embedding = nn.ModuleDict({t: nn.Embedding(i.count, spec.hidden_channels) for t, i in learnt.items() if not i.sharded})
        self.sharded = {t for t, i in learnt.items() if i.sharded}
        self.dropout = nn.Dropout(spec.dropout)
        if spec.type == "appnp":
            self.propagation = APPNP(spec.propagation_steps, spec.teleport, normalize=False)
        else:
            self.convs = nn.ModuleList(
                GCN2Conv(spec.hidden_channels, spec.teleport, spec.identity_strength, i + 1, shared_weights=True, normalize=False)
                for i in range(spec.num_layers)
            )

    def input_layers(self) -> list[nn.Module]:
        """Each featured type's first input layer and each replicated embedding (sharded rows have their own optimizer)."""
        return [*(p.input_layer() for p in self.project.values()), *self.embedding.values()]

    def forward(
        self,
        x: dict[str, torch.Tensor],
        edge_index: dict[EdgeType, torch.Tensor],
        node: dict[str, torch.Tensor],
        edge_attr: dict[EdgeType, torch.Tensor] | None = None,
        slices: object = None,
    ) -> dict[str, torch.Tensor]:
        """x[type]: (n_type, d_type); node[type]: (n_type,) partition ids → (n_type, hidden) per
        type. ``edge_attr`` and ``slices`` are accepted for the interface and not read: propagation
        uses no edge features and runs over the whole subgraph."""
        h0 = {t: typed_input(self, t, x, node) for t in self.node_types if t in node}
        rows, edges, order = homogeneous_view(h0, edge_index, self.edge_types)
        edges, weights = normalised_edges(edges, rows.size(0), rows.dtype)
        if self.kind == "appnp":
            out = self.propagation(rows, edges, weights)
        else:
            out = first = rows
            last = len(self.convs) - 1
            for i, conv in enumerate(self.convs):
                out = conv(self.dropout(out), first, edges, weights)
                if i < last:
                    out = F.relu(out)
        return dict(zip(order, out.split([h0[t].size(0) for t in order])))

    def encode_batch(self, batch) -> dict[str, torch.Tensor]:
        """Every node's embedding of a GLT batch (a ``HeteroData``, or a ``Data`` of one node type)."""
        reads_x = set(self.project) | self.sharded
        if hasattr(batch, "node_types"):
            stores = {t: batch[t] for t in batch.node_types if "node" in batch[t]}
            x = {t: decoded_features(self, t, s.x) for t, s in stores.items() if "x" in s and t in reads_x}
            return self(x, batch.edge_index_dict, {t: s.node for t, s in stores.items()})
        (node_type,), (edge_type,) = self.node_types, self.edge_types
        x = {node_type: decoded_features(self, node_type, batch.x)} if node_type in reads_x else {}
        return self(x, {edge_type: batch.edge_index}, {node_type: batch.node})


def build_propagation_encoder(spec: ModelSpec, inputs: dict[str, NodeInput], edge_types: list[EdgeType]) -> nn.Module:
    """The ``model.type`` appnp or gcnii encoder: the plain homogeneous one (which full-graph
    training and exact inference rebuild) for one node type with features and one edge type, the
    typed form otherwise."""
    if spec.type not in ("appnp", "gcnii"):
        raise GnnflowError(f"model.type {spec.type} is not a propagation model (appnp, gcnii)")
    (node_type, node), *others = inputs.items()
    if others or len(edge_types) != 1 or not node.feature_dim:
        return TypedPropagationEncoder(inputs, edge_types, spec)
    if spec.type == "appnp":
        return APPNPEncoder(node_type, node.feature_dim, spec)
    return GCNIIEncoder(node_type, node.feature_dim, spec)
