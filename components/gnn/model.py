"""Encoders (GraphSAGE, GATv2, R-GCN over typed nodes and edges) with classification and link heads.

Every encoder answers ``encode_batch(batch) -> {node type: (n_type, hidden) embeddings}`` for a
GLT batch (a PyG ``Data`` or ``HeteroData`` of partition ids), so the tasks and inference handle
homogeneous and heterogeneous graphs, and every model type, alike.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import nn
from torch_geometric.nn import GATv2Conv, GraphConv, HeteroConv, SAGEConv
from torch_geometric.nn.conv import MessagePassing
from torch_geometric.nn.models import GCN, MLP, GraphSAGE

from components.config import ModelSpec
from components.errors import GnnflowError
from components.feature_storage.codec import FLOAT32, FeatureCodec
from components.gnn.hop_trimming import (
    LayerSlice,
    TypedLayerSlice,
    layer_slices,
    trimmed_inputs,
    typed_from_homogeneous,
    typed_layer_slices,
)

EdgeType = tuple[str, str, str]


def set_feature_codecs(encoder: nn.Module, nodes: dict[str, FeatureCodec], edges: dict[EdgeType, FeatureCodec]) -> None:
    """Tells ``encoder`` how batches store each node type's and edge type's feature rows
    (``feature_storage``): it decodes them to float32 before its first layer. Not weights: no
    state dict changes, and a model without them reads float32 rows."""
    # Plain attributes (nn.Module.__setattr__ keeps non-tensor values as they are).
    object.__setattr__(encoder, "feature_codecs", dict(nodes))
    object.__setattr__(encoder, "edge_codecs", dict(edges))


def decoded_features(encoder: nn.Module, node_type: str, x: torch.Tensor) -> torch.Tensor:
    """(n, d) rows of ``node_type`` as a batch carries them → (n, d) float32 (see :func:`set_feature_codecs`)."""
    return getattr(encoder, "feature_codecs", {}).get(node_type, FLOAT32).decode(x)


def decoded_edge_features(encoder: nn.Module, edge_type: EdgeType, attr: torch.Tensor) -> torch.Tensor:
    """(e, d_e) edge rows of a batch's ``edge_type`` → (e, d_e) float32."""
    return getattr(encoder, "edge_codecs", {}).get(edge_type, FLOAT32).decode(attr)


@dataclass(frozen=True)
class NodeInput:
    """What a node type brings to the encoder: ``feature_dim`` input features, or, when it has
    none, a learnable embedding of each of its ``count`` nodes: a module parameter, or, when
    ``sharded``, rows that batches carry as the type's features (see ``gnn.learnt_embeddings``)."""

    feature_dim: int
    count: int
    sharded: bool = False


class HomogeneousSAGE(GraphSAGE):
    """PyG's GraphSAGE stack ((n, in_dim) features, (2, e) edges → (n, hidden)) on one node type.

    Kept as the plain stack so that exact inference can run its convolutions layer by layer.
    A sampled batch that says its hops is encoded layer-trimmed (``gnn.hop_trimming``): the
    output then holds the seeds' rows only, the rows every caller reads.
    """

    def __init__(self, node_type: str, in_dim: int, spec: ModelSpec) -> None:
        super().__init__(in_dim, spec.hidden_channels, spec.num_layers, dropout=spec.dropout, aggr=spec.aggregation)
        self.node_type = node_type

    def input_layers(self) -> list[nn.Module]:
        return [self.convs[0]]

    def encode_batch(self, batch) -> dict[str, torch.Tensor]:
        slices = layer_slices(batch, self.num_layers)
        x = decoded_features(self, self.node_type, batch.x)
        if slices is None:
            return {self.node_type: self(x, batch.edge_index)}
        return {self.node_type: self.forward_trimmed(x, batch.edge_index, slices)}

    def forward_trimmed(self, x: torch.Tensor, edge_index: torch.Tensor, slices: list[LayerSlice]) -> torch.Tensor:
        """(n, in_dim) features of a batch listed hop by hop, its (2, e) edges → (seeds, hidden):
        the plain forward's layers (convolution, then ReLU and dropout between layers), each on
        its slice of nodes and edges."""
        for i, (conv, layer) in enumerate(zip(self.convs, slices)):
            pair, edges = trimmed_inputs(x, edge_index, layer)
            x = conv(pair, edges)
            if i < self.num_layers - 1:
                x = self.dropout(self.act(x))
        return x


class HomogeneousGCN(GCN):
    """PyG's GCN stack (symmetric-normalised sum over neighbours and the node itself, GCNConv) on
    one node type: (n, in_dim) features, (2, e) edges → (n, hidden). ``model.aggregation`` does
    not apply to it."""

    def __init__(self, node_type: str, in_dim: int, spec: ModelSpec) -> None:
        super().__init__(in_dim, spec.hidden_channels, spec.num_layers, dropout=spec.dropout)
        self.node_type = node_type

    def input_layers(self) -> list[nn.Module]:
        return [self.convs[0]]

    def encode_batch(self, batch) -> dict[str, torch.Tensor]:
        return {self.node_type: self(decoded_features(self, self.node_type, batch.x), batch.edge_index)}


def _convolution(spec: ModelSpec, edge_dim: int) -> MessagePassing:
    hidden = spec.hidden_channels
    if spec.type == "gat":
        # No self-loops (they do not exist between two node types); the residual keeps a node's own state.
        return GATv2Conv(
            hidden,
            hidden // spec.attention_heads,
            heads=spec.attention_heads,
            add_self_loops=False,
            edge_dim=edge_dim or None,
            residual=True,
        )
    if spec.type == "rgcn":
        return GraphConv(hidden, hidden, aggr=spec.aggregation)  # a weight per relation; summed over relations below
    return SAGEConv(hidden, hidden, aggr=spec.aggregation)


def typed_input(encoder: nn.Module, node_type: str, x: dict[str, torch.Tensor], node: dict[str, torch.Tensor]) -> torch.Tensor:
    """(n, hidden) layer-0 state of a type's nodes in a typed encoder (``HeteroEncoder``, the typed
    propagation encoder): its ``project[type]`` layer on the features, the rows a sharded learnt
    embedding put in ``x``, or its replicated ``embedding[type]`` rows of the batch's node ids."""
    if node_type in encoder.project:
        return encoder.project[node_type](x[node_type])
    if node_type in encoder.sharded:
        return x[node_type]
    return encoder.embedding[node_type](node[node_type])


class HeteroEncoder(nn.Module):
    """Message passing over typed nodes and edges: per layer one convolution per edge type
    (``model.type``), summed over the edge types that reach a node type.

    Node types with features are projected to ``hidden`` first; node types without get a
    learnable embedding per node (looked up by partition id, or, sharded, read from the batch's
    ``x``), so every type shares one space.
    A homogeneous graph is the case of one node type and one edge type.

    Args:
        inputs: per node type, its feature width and node count.
        edge_types: the edge types of the batches (as GLT names them).
        edge_dims: feature width of the edge types that have edge features (used by ``gat``).
    """

    def __init__(
        self, inputs: dict[str, NodeInput], edge_types: list[EdgeType], spec: ModelSpec, edge_dims: dict[EdgeType, int] | None = None
    ) -> None:
        super().__init__()
        edge_dims = edge_dims or {}
        self.node_types, self.edge_types = list(inputs), list(edge_types)
        self.project = nn.ModuleDict({t: nn.Linear(i.feature_dim, spec.hidden_channels) for t, i in inputs.items() if i.feature_dim})
        learnt = {t: i for t, i in inputs.items() if not i.feature_dim}
        self.embedding = nn.ModuleDict({t: nn.Embedding(i.count, spec.hidden_channels) for t, i in learnt.items() if not i.sharded})
        self.sharded = {t for t, i in learnt.items() if i.sharded}
        self.convs = nn.ModuleList(
            HeteroConv({e: _convolution(spec, edge_dims.get(e, 0)) for e in edge_types}, aggr="sum") for _ in range(spec.num_layers)
        )
        self.dropout = spec.dropout

    def input_layers(self) -> list[nn.Module]:
        """Each featured type's projection and each replicated embedding (sharded rows have their own optimizer)."""
        return [*self.project.values(), *self.embedding.values()]

    def forward(
        self,
        x: dict[str, torch.Tensor],
        edge_index: dict[EdgeType, torch.Tensor],
        node: dict[str, torch.Tensor],
        edge_attr: dict[EdgeType, torch.Tensor] | None = None,
        slices: list[TypedLayerSlice] | None = None,
    ) -> dict[str, torch.Tensor]:
        """x[type]: (n_type, d_type); node[type]: (n_type,) partition ids; edge_attr[etype]: (e, d_e)
        → embeddings[type]: (n_type, hidden), or, given a sampled batch's ``slices``
        (``gnn.hop_trimming``), each type's seeds only: (seeds_type, hidden)."""
        h = {t: typed_input(self, t, x, node) for t in node}
        edge_index = {e: v for e, v in edge_index.items() if e[0] in h and e[2] in h}
        edge_attr = {e: v for e, v in (edge_attr or {}).items() if e in edge_index}
        for i, conv in enumerate(self.convs):
            if slices is None:
                out = conv(h, edge_index, **({"edge_attr_dict": edge_attr} if edge_attr else {}))
                h = {t: out.get(t, h[t]) for t in h}  # a type no edge reaches keeps its embedding
            else:
                layer = slices[i]
                # HeteroConv takes per-edge-type inputs: each convolution reads its slice of sources and targets.
                pairs = {e: (h[e[0]][: layer.sources[e[0]]], h[e[2]][: layer.targets[e[2]]]) for e in edge_index}
                edges = {e: v[:, : layer.edges[e]] for e, v in edge_index.items()}
                attrs = {e: v[: layer.edges[e]] for e, v in edge_attr.items()}
                out = conv(pairs, edges, **({"edge_attr_dict": attrs} if attrs else {}))
                h = {t: out.get(t, h[t][: layer.targets[t]]) for t in h}
            if i < len(self.convs) - 1:
                h = {t: nn.functional.dropout(torch.relu(v), self.dropout, self.training) for t, v in h.items()}
        return h

    def encode_batch(self, batch) -> dict[str, torch.Tensor]:
        """A GLT batch's embeddings per node type; a sampled batch that says its hops is encoded
        layer-trimmed, giving each type's seeds only (the rows the tasks and inference read)."""
        reads_x = set(self.project) | self.sharded
        layers = len(self.convs)
        if hasattr(batch, "node_types"):
            stores = {t: batch[t] for t in batch.node_types if "node" in batch[t]}
            x = {t: decoded_features(self, t, s.x) for t, s in stores.items() if "x" in s and t in reads_x}
            edge_attr = {
                e: decoded_edge_features(self, e, batch[e].edge_attr) for e in batch.edge_types if batch[e].get("edge_attr") is not None
            }
            nodes = {t: s.node for t, s in stores.items()}
            return self(x, batch.edge_index_dict, nodes, edge_attr, typed_layer_slices(batch, layers))
        (node_type,), (edge_type,) = self.node_types, self.edge_types
        x = {node_type: decoded_features(self, node_type, batch.x)} if node_type in reads_x else {}
        attr = {edge_type: decoded_edge_features(self, edge_type, batch.edge_attr)} if batch.get("edge_attr") is not None else None
        slices = layer_slices(batch, layers)
        typed = typed_from_homogeneous(slices, node_type, edge_type) if slices is not None else None
        return self(x, {edge_type: batch.edge_index}, {node_type: batch.node}, attr, typed)


def build_encoder(spec: ModelSpec, inputs: dict[str, NodeInput], edge_types: list[EdgeType], edge_dims: dict[EdgeType, int]) -> nn.Module:
    """PyG's plain GraphSAGE or GCN stack where it fits (one featured node type, one edge type:
    full-graph training and exact inference rebuild it layer by layer), a ``HeteroEncoder`` otherwise."""
    (node_type, node), *others = inputs.items()
    homogeneous = not others and len(edge_types) == 1 and node.feature_dim
    if spec.type in ("appnp", "gcnii"):
        raise GnnflowError(f"model.type {spec.type} is built by components.gnn.propagation (components.gnn.build.build_model)")
    if spec.type == "gcn":
        if not homogeneous:
            raise GnnflowError("model.type gcn supports homogeneous graphs with node features (one node type, one edge type)")
        return HomogeneousGCN(node_type, node.feature_dim, spec)
    if spec.type == "graphsage" and homogeneous:
        return HomogeneousSAGE(node_type, node.feature_dim, spec)
    return HeteroEncoder(inputs, edge_types, spec, edge_dims)


class NodeClassifier(nn.Module):
    """Encoder + linear head over the ``target`` node type."""

    def __init__(self, encoder: nn.Module, hidden: int, num_classes: int, target: str) -> None:
        super().__init__()
        self.encoder, self.head, self.target = encoder, nn.Linear(hidden, num_classes), target

    def forward(self, batch) -> torch.Tensor:
        """Logits (n_target, num_classes) of every target-type node of the batch (seeds first)."""
        return self.classify(self.encoder.encode_batch(batch)[self.target])

    def classify(self, embeddings: torch.Tensor) -> torch.Tensor:
        """(n, hidden) target-type embeddings → (n, num_classes) logits."""
        return self.head(torch.relu(embeddings))


class LinkPredictor(nn.Module):
    """Encoder + edge scorer of ``target`` (src type, relation, dst type) edges.

    ``dot``: the scaled cosine of the two embeddings, ``scale * cos(z_src, z_dst)``, with a learnt
    ``scale`` (starting at ``model.dot_scale``). A plain dot product has a saddle at zero
    embeddings, where its gradient vanishes: a deep encoder with dropout, whose early scores are
    noise, shrinks its outputs there and then trains a constant (logit 0, loss ln 2), as on
    papers with featureless word nodes. Normalised embeddings cannot shrink, and the learnt
    scale sets how confident scores get. ``mlp``: an MLP of the embeddings' product.
    """

    def __init__(self, encoder: nn.Module, hidden: int, decoder: str, target: EdgeType, dot_scale: float = 1.0) -> None:
        super().__init__()
        self.encoder, self.target = encoder, target
        self.mlp = MLP([hidden, hidden, 1], dropout=0.0) if decoder == "mlp" else None
        self.log_scale = nn.Parameter(torch.tensor(math.log(dot_scale))) if decoder == "dot" else None

    def embed(self, z: torch.Tensor) -> torch.Tensor:
        """(n, hidden) encoder outputs → (n, hidden) embeddings in the decoder's space: for
        ``dot``, unit vectors times sqrt(scale), so that the inner product of two of them is the
        logit (what retrieval ranks by). Idempotent: embedding an embedding changes nothing."""
        if self.log_scale is None:
            return z
        return nn.functional.normalize(z, dim=-1) * (self.log_scale / 2).exp()

    def score(self, z_src: torch.Tensor, z_dst: torch.Tensor) -> torch.Tensor:
        """(m, hidden) source and (m, hidden) destination embeddings → (m,) logits of the pairs."""
        product = self.embed(z_src) * self.embed(z_dst)
        return self.mlp(product).squeeze(-1) if self.mlp is not None else product.sum(-1)

    def forward(self, batch, pairs: torch.Tensor) -> torch.Tensor:
        """pairs: (2, m) batch-local indices [source-type node; destination-type node] → (m,) logits."""
        z = self.encoder.encode_batch(batch)
        return self.score(z[self.target[0]][pairs[0]], z[self.target[2]][pairs[1]])
