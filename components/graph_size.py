"""A graph's size as the sizing model sees it, and what the model predicts for one step.

``gnnflow plan`` and the checks before a run read row counts and feature widths from the tables
(or a preprocessed output) into a :class:`GraphSize`; each multi-worker step predicts its own
needs from it in its ``sizing`` module (``components/<step>/sizing.py``), as a
:class:`StepPrediction`. Nothing here reads a file: the arithmetic is pure.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from components.schema import GraphSchema, NodeTypeSchema

MiB = 2**20
INT64 = 8
# Bytes per stored feature value of each ``feature_storage`` (graph.nodes[] / graph.edges[]).
STORAGE_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2, "int8": 1}


@dataclass(frozen=True)
class NodeSize:
    """One node type: ``rows`` nodes of ``feature_width`` values, each ``value_bytes`` stored."""

    name: str
    rows: int
    feature_width: int
    value_bytes: int = 4
    labeled: bool = False

    @property
    def row_feature_bytes(self) -> int:
        return self.feature_width * self.value_bytes


@dataclass(frozen=True)
class EdgeSize:
    """One edge table as configured: ``rows`` rows from ``src_type`` to ``dst_type``."""

    src_type: str
    relation: str
    dst_type: str
    rows: int
    undirected: bool = True
    feature_width: int = 0
    value_bytes: int = 4
    role: str = "message"  # message, positive_label or negative_label (supervision only, no CSR)

    @property
    def name(self) -> str:
        return f"{self.src_type}__{self.relation}__{self.dst_type}"


@dataclass(frozen=True)
class StoredEdges:
    """Directed edges a partition stores for one edge type, summed over partitions."""

    name: str
    count: int
    feature_row_bytes: int
    compressed_type: str  # node type whose ids GLT's CSR row pointer runs over
    message: bool  # carries messages (in the CSR); label tables are stored beside it
    forward: str  # the configured edge type whose rows these are (a reverse type's forward type)


@dataclass(frozen=True)
class GraphSize:
    """Row counts and feature widths per node and edge type.

    train_seeds: the target's training rows (labelled nodes or edges in the train split).
    classes: the target's classes (0: unknown or link prediction). estimated: some figures are
    estimates (counts from a sample of a large CSV file, one-hot widths without a vocabulary,
    seeds from the random split's fraction); the text report says so.
    """

    nodes: tuple[NodeSize, ...]
    edges: tuple[EdgeSize, ...]
    train_seeds: int = 0
    classes: int = 0
    estimated: bool = False

    def node(self, name: str) -> NodeSize:
        return next(n for n in self.nodes if n.name == name)

    @property
    def total_nodes(self) -> int:
        return sum(n.rows for n in self.nodes)

    def stored_edges(self, edge_assignment: str = "src") -> tuple[StoredEdges, ...]:
        """What partition stores, as it counts it (components/partition/partitioner.py): an undirected
        type between one node type twice over (both directions), an undirected type between two
        types once forward and once as ``<dst>__rev_<relation>__<src>``, a directed type once."""
        stored = []
        end = 0 if edge_assignment == "src" else 1  # CSR by source, CSC by destination
        for e in self.edges:
            width = e.feature_width * e.value_bytes
            message = e.role == "message"
            same = e.undirected and e.src_type == e.dst_type and message
            stored.append(StoredEdges(e.name, e.rows * (2 if same else 1), width, (e.src_type, e.dst_type)[end], message, e.name))
            if message and e.undirected and e.src_type != e.dst_type:
                reverse = f"{e.dst_type}__rev_{e.relation}__{e.src_type}"
                stored.append(StoredEdges(reverse, e.rows, width, (e.dst_type, e.src_type)[end], True, e.name))
        return tuple(stored)

    def directed_message_edges(self) -> int:
        return sum(s.count for s in self.stored_edges() if s.message)


def share(total: int, world_size: int) -> int:
    """The largest worker's share of ``total`` rows (hash assignment balances them)."""
    return math.ceil(total / world_size)


@dataclass(frozen=True)
class StepPrediction:
    """What one multi-worker step needs at ``world_size`` workers.

    peak_rss_mib_per_worker: the largest worker's peak resident memory (what ``ru_maxrss`` and
    ``/proc`` report; shared-memory pages it touches count). shm_mib_per_worker: what it places in
    ``/dev/shm`` (part of that RSS). disk_mib: the step's published output, all workers together.
    epoch_s: train only, one epoch. parts: the terms of the peak (MiB), for the text report.
    """

    step: str
    world_size: int
    peak_rss_mib_per_worker: float
    shm_mib_per_worker: float
    disk_mib: float
    epoch_s: float | None = None
    parts: tuple[tuple[str, float], ...] = ()

    def as_json(self) -> dict[str, float]:
        out = {
            "peak_rss_mib_per_worker": round(self.peak_rss_mib_per_worker, 1),
            "shm_mib_per_worker": round(self.shm_mib_per_worker, 1),
            "disk_mib": round(self.disk_mib, 1),
        }
        if self.epoch_s is not None:
            out["epoch_s"] = round(self.epoch_s, 1)
        return out


def graph_size_from_schema(schema: GraphSchema, storage: dict[str, int] | None = None) -> GraphSize:
    """The graph's size as a preprocess or serialize output records it (exact counts, fitted
    widths, the target's training rows); ``storage``: bytes per stored value by type name."""
    storage = storage or {}

    def value_bytes(name: str, entry: object) -> int:  # the output's own record first (compressed features), else the config's
        recorded = getattr(entry, "feature_storage", None)
        return STORAGE_BYTES[recorded] if recorded in STORAGE_BYTES else storage.get(name, 4)

    nodes = tuple(
        NodeSize(n.name, n.count, n.feature_dim, value_bytes(n.name, n), n.label_vocabulary is not None) for n in schema.node_types.values()
    )
    edges = tuple(
        EdgeSize(e.src_type, e.relation, e.dst_type, e.count, e.undirected, e.feature_dim, value_bytes(e.name, e), e.role)
        for e in schema.edge_types.values()
    )
    target = schema.node_types.get(schema.target) or schema.edge_types.get(schema.target)
    seeds = target.split_sizes.get("train", 0) if target is not None else 0
    classes = target.num_classes if isinstance(target, NodeTypeSchema) else 0
    return GraphSize(nodes, edges, train_seeds=seeds, classes=classes)
