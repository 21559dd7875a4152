"""The graph schema every step after ``preprocess`` reads: types, counts, dims, vocabularies, files.

``preprocess`` writes it as ``graph_schema.json`` (files: Parquet parts) and ``serialize``
as ``graph_metadata.json`` (files: TFRecord shards, plus the record layout).
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from typing import Any

from components.errors import GnnflowError

SPLIT_CODES: dict[str, int] = {"train": 0, "val": 1, "test": 2}
NO_SPLIT = -1
NO_LABEL = -1


@dataclass(frozen=True)
class NodeTypeSchema:
    """One node type: ``count`` nodes with ids ``0..count-1``."""

    name: str
    count: int
    feature_names: list[str]
    label_vocabulary: list[str] | None
    split_sizes: dict[str, int]
    files: list[str]
    id_map_files: list[str] = field(default_factory=list)
    file_rows: list[int] = field(default_factory=list)  # records per file, when known
    # How partitions store the feature rows (components.feature_storage); older schemas: float32.
    feature_storage: str = "float32"
    feature_quantization: dict[str, list[float]] | None = None  # int8: {"scale": [...], "zero_point": [...]}

    @property
    def feature_dim(self) -> int:
        return len(self.feature_names)

    @property
    def num_classes(self) -> int:
        return len(self.label_vocabulary or [])


@dataclass(frozen=True)
class EdgeTypeSchema:
    """One edge type; ``undirected`` edges are stored once and stand for both directions."""

    src_type: str
    relation: str
    dst_type: str
    count: int
    feature_names: list[str]
    undirected: bool
    split_sizes: dict[str, int]
    files: list[str]
    dropped_unknown_endpoints: int = 0
    file_rows: list[int] = field(default_factory=list)  # records per file, when known
    role: str = "message"  # message (carries messages), positive_label or negative_label (supervision only)
    feature_storage: str = "float32"  # as for node types
    feature_quantization: dict[str, list[float]] | None = None

    @property
    def name(self) -> str:
        return f"{self.src_type}__{self.relation}__{self.dst_type}"

    @property
    def feature_dim(self) -> int:
        return len(self.feature_names)


@dataclass(frozen=True)
class GraphSchema:
    """The whole graph as a later step sees it."""

    task_type: str
    target: str
    node_types: dict[str, NodeTypeSchema]
    edge_types: dict[str, EdgeTypeSchema]
    record_format: dict[str, Any] = field(default_factory=dict)
    format_version: int = 1

    @property
    def message_edge_types(self) -> dict[str, EdgeTypeSchema]:
        """The edge types of the graph messages flow over (label edge tables are not among them)."""
        return {name: e for name, e in self.edge_types.items() if e.role == "message"}

    def label_edge_type(self, role: str) -> str | None:
        """The name of the ``positive_label`` or ``negative_label`` edge table, if the task has one."""
        return next((name for name, e in self.edge_types.items() if e.role == role), None)

    @property
    def is_heterogeneous(self) -> bool:
        return len(self.node_types) > 1 or len(self.message_edge_types) > 1

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=2)

    @staticmethod
    def from_json(text: str, source: str) -> GraphSchema:
        try:
            raw = json.loads(text)
            return GraphSchema(
                task_type=raw["task_type"],
                target=raw["target"],
                node_types={k: NodeTypeSchema(**v) for k, v in raw["node_types"].items()},
                edge_types={k: EdgeTypeSchema(**v) for k, v in raw["edge_types"].items()},
                record_format=raw.get("record_format", {}),
                format_version=raw.get("format_version", 1),
            )
        except (ValueError, KeyError, TypeError) as exc:
            raise GnnflowError(f"{source} is not a valid graph schema: {exc}") from exc


def stored_edge_types(metadata: GraphSchema) -> dict[str, tuple[str, str, str]]:
    """Every edge type a partition stores, name → (src type, relation, dst type).

    The schema's message edge types (label edge tables are stored too, but carry no messages), plus
    ``<dst>__rev_<relation>__<src>`` for each undirected edge type
    between two different node types (its rows reversed, same edge ids): GLT samples along
    stored edges only, so without it nodes at the destination end never reach the sources.
    """
    types: dict[str, tuple[str, str, str]] = {}
    for name, edge in metadata.message_edge_types.items():
        types[name] = (edge.src_type, edge.relation, edge.dst_type)
        if edge.undirected and edge.src_type != edge.dst_type:
            types[f"{edge.dst_type}__rev_{edge.relation}__{edge.src_type}"] = (edge.dst_type, f"rev_{edge.relation}", edge.src_type)
    return types
