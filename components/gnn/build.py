"""The model of a graph and task, built the same way by train and infer.

GLT hands a heterogeneous batch sampled along out-edges under reversed edge type names
((s, r, d) → (d, rev_r, s) across node types, unchanged within one), so messages flow towards
the seeds; in-edge samples keep the stored names. The encoder's edge types are exactly those.
"""

from __future__ import annotations

from torch import nn

from components.config import GnnflowConfig
from components.config.steps import PROPAGATION_TYPES
from components.feature_storage.codec import codec_of
from components.gnn.learnt_embeddings import uses_sharded_embeddings
from components.gnn.model import EdgeType, LinkPredictor, NodeClassifier, NodeInput, build_encoder, set_feature_codecs
from components.gnn.propagation import build_propagation_encoder
from components.schema import GraphSchema, stored_edge_types


def reverse_edge_type(edge_type: EdgeType) -> EdgeType:
    """GLT's reversal: (s, r, d) → (d, rev_r, s) between two node types (rev_r → r); a type
    within one node type keeps its name."""
    src, relation, dst = edge_type
    if src == dst:
        return edge_type
    relation = relation[4:] if relation.startswith("rev_") else f"rev_{relation}"
    return dst, relation, src


def batch_edge_types(schema: GraphSchema, edge_dir: str) -> dict[str, EdgeType]:
    """Stored edge type name → the edge type its sampled edges carry in a batch."""
    stored = stored_edge_types(schema)
    return {name: reverse_edge_type(e) if edge_dir == "out" else e for name, e in stored.items()}


def forward_edge_name(stored_name: str) -> str:
    """The graph's edge type a stored type samples for: itself, or for ``d__rev_r__s`` (the
    reverse copy of an undirected type) ``s__r__d``."""
    src, relation, dst = stored_name.split("__")
    return f"{dst}__{relation[4:]}__{src}" if relation.startswith("rev_") else stored_name


def target_edge_type(schema: GraphSchema) -> EdgeType:
    edge = schema.edge_types[schema.target]
    return edge.src_type, edge.relation, edge.dst_type


def build_model(schema: GraphSchema, config: GnnflowConfig, edge_dir: str) -> nn.Module:
    """A ``NodeClassifier`` or ``LinkPredictor`` for ``schema``'s task, with ``config.model``."""
    spec = config.model
    sharded = uses_sharded_embeddings(config)
    inputs = {t: NodeInput(n.feature_dim, n.count, sharded) for t, n in schema.node_types.items()}
    edge_types = batch_edge_types(schema, edge_dir)
    edge_dims = {edge_types[name]: schema.edge_types[forward_edge_name(name)].feature_dim for name in edge_types}
    if spec.type in PROPAGATION_TYPES:
        encoder: nn.Module = build_propagation_encoder(spec, inputs, list(edge_types.values()))
    else:
        encoder = build_encoder(spec, inputs, list(edge_types.values()), {e: d for e, d in edge_dims.items() if d})
    node_codecs = {t: codec_of(n, f"node type {t!r}") for t, n in schema.node_types.items()}
    edge_codecs = {edge_types[name]: codec_of(schema.edge_types[forward_edge_name(name)], f"edge type {name!r}") for name in edge_types}
    set_feature_codecs(encoder, node_codecs, edge_codecs)
    if schema.task_type == "node_classification":
        return NodeClassifier(encoder, spec.hidden_channels, schema.node_types[schema.target].num_classes, schema.target)
    return LinkPredictor(encoder, spec.hidden_channels, spec.decoder, target_edge_type(schema), spec.dot_scale)


def uses_edge_features(schema: GraphSchema, config: GnnflowConfig) -> bool:
    """Whether batches must carry edge features: the model reads them and some type has them."""
    return config.model.type == "gat" and any(e.feature_dim for e in schema.message_edge_types.values())
