"""Where link prediction's supervision comes from, and what it may not leak.

Positives are the ``positive_label`` edge table's pairs when the graph has one (stored with
their anchor, the source), else the target edges' own split. Hard negatives are the
``negative_label`` table's pairs of each anchor. Validation and test positives never carry
messages: without label tables the target's validation and test edges are left out of the
sampled graph (both stored directions); with them, every message edge that joins the same two
nodes as a held-out positive is left out, found on whichever worker stores it.
"""

from __future__ import annotations

import torch

from components.partition.output import StoredPartition, range_ends, range_owner
from components.runtime.collectives import exchange
from components.schema import SPLIT_CODES, GraphSchema

HELD_OUT = (SPLIT_CODES["val"], SPLIT_CODES["test"])


def target_edge_names(schema: GraphSchema) -> set[str]:
    """The stored edge types that hold target edges: the target, and the reverse copy of an
    undirected target between two node types."""
    edge = schema.edge_types[schema.target]
    reverse = f"{edge.dst_type}__rev_{edge.relation}__{edge.src_type}"
    return {schema.target} | ({reverse} if edge.undirected and edge.src_type != edge.dst_type else set())


def positive_pairs(part: StoredPartition, split: str) -> tuple[torch.Tensor, torch.Tensor]:
    """((2, m) partition ids [source; destination], (m,) stable edge ids) of this partition's
    ``split`` positives: label-table rows, or target edges (each undirected edge once)."""
    schema = part.metadata.schema
    table = schema.label_edge_type("positive_label")
    edges = part.edges[table or schema.target]
    keep = edges["split"] == SPLIT_CODES[split]
    if table is None:
        keep &= edges["source_edge_id"] < schema.edge_types[schema.target].count
    return edges["edge_index"][:, keep], edges["source_edge_id"][keep]


def hard_negative_pairs(part: StoredPartition, split: str) -> torch.Tensor:
    """(2, h) partition ids [anchor; negative] of this partition's ``split`` hard negatives
    (none without a negative_label table)."""
    table = part.metadata.schema.label_edge_type("negative_label")
    if table is None:
        return torch.zeros((2, 0), dtype=torch.int64)
    edges = part.edges[table]
    return edges["edge_index"][:, edges["split"] == SPLIT_CODES[split]]


def _pair_keys(a: torch.Tensor, b: torch.Tensor, b_count: int) -> torch.Tensor:
    return a * b_count + b


def _held_out_message_pairs(part: StoredPartition, world_size: int) -> dict[str, torch.Tensor]:
    """Per stored target type, the (2, k) [source; destination] pairs of its message edges that
    repeat a held-out positive label and are stored on this worker (collective)."""
    schema, meta = part.metadata.schema, part.metadata
    edge = schema.edge_types[schema.target]
    labels = part.edges[schema.label_edge_type("positive_label")]  # type: ignore[index]
    held = labels["edge_index"][:, torch.isin(labels["split"], torch.tensor(HELD_OUT, dtype=labels["split"].dtype))]
    u, v = held
    wanted: dict[str, tuple[torch.Tensor, torch.Tensor, str, str]] = {schema.target: (u, v, edge.src_type, edge.dst_type)}
    if edge.undirected and edge.src_type == edge.dst_type:
        wanted[schema.target] = (torch.cat([u, v]), torch.cat([v, u]), edge.src_type, edge.dst_type)
    elif edge.undirected:
        wanted[f"{edge.dst_type}__rev_{edge.relation}__{edge.src_type}"] = (v, u, edge.dst_type, edge.src_type)
    stored: dict[str, torch.Tensor] = {}
    for name in sorted(wanted):  # the same order on every worker: each name is one collective
        a, b, a_type, b_type = wanted[name]
        by_source = meta.edge_assignment == "src"
        owner = range_owner(a, range_ends(meta.node_counts[a_type])) if by_source else range_owner(b, range_ends(meta.node_counts[b_type]))
        got = exchange({"a": a, "b": b}, owner, world_size)
        stored[name] = torch.stack([got["a"], got["b"]])
    return stored


def training_edges(part: StoredPartition, schema: GraphSchema, world_size: int) -> dict[str, torch.Tensor]:
    """Edge mask per stored message type for the graph messages flow over (collective when the
    graph has a positive_label table): no validation or test positive carries messages."""
    masks = {
        name: torch.ones(len(part.edges[name]["edge_id"]), dtype=torch.bool)
        for name in part.edges
        if schema.edge_types.get(name) is None or schema.edge_types[name].role == "message"
    }
    if schema.label_edge_type("positive_label") is None:
        for name in target_edge_names(schema):
            masks[name] = part.edges[name]["split"] == SPLIT_CODES["train"]
        return masks
    for name, pairs in _held_out_message_pairs(part, world_size).items():
        edges = part.edges[name]["edge_index"]
        b_count = sum(part.metadata.node_counts[name.split("__")[2]])
        masks[name] &= ~torch.isin(_pair_keys(edges[0], edges[1], b_count), _pair_keys(pairs[0], pairs[1], b_count))
    return masks
