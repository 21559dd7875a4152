"""Shared base of every config section, and the table and task sections of ``graph`` and ``task``."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

TaskType = Literal["node_classification", "link_prediction"]
Transform = Literal["standardize", "passthrough", "row_normalize", "one_hot", "hashing"]
FeatureStorage = Literal["float32", "float16", "bfloat16", "int8"]
_STORAGE_HELP = (
    "How partitions store this type's feature rows, which GLT holds, sends between workers and decodes to float32 just "
    "before the model: float32 (exact); float16 or bfloat16 (half the bytes); int8 (a quarter: per-column affine "
    "quantization fitted in preprocess on the transformed values, kept in the fitted state, error at most half a step of "
    "(column max - min) / 255; values outside a reused state's range are clipped and counted)."
)


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


_URI_HELP = (
    "CSV, gzipped CSV or Parquet file, or a folder/prefix of such files (local or gs://); "
    "or a BigQuery table, bq://project.dataset.table (read with the Storage Read API)."
)
_FORMAT_HELP = "auto: from the file extension (BigQuery tables: auto only)."
_ROW_FILTER_HELP = (
    "BigQuery tables only: a SQL predicate on the table's columns (the Storage Read API's row_restriction, "
    "e.g. \"country = 'DE' AND active\"); only matching rows are read."
)


def _check_table_source(uri: str, fmt: str, row_filter: str | None) -> None:
    """A BigQuery table takes no file format; a row filter needs a BigQuery table."""
    if uri.startswith("bq://"):
        if fmt != "auto":
            raise ValueError(f"uri {uri!r} is a BigQuery table: format must be auto (it is {fmt!r})")
    elif row_filter is not None:
        raise ValueError(f"row_filter is for BigQuery tables (bq://project.dataset.table), but uri is {uri!r}")


class FeatureSpec(_Section):
    """A group of columns that become features with one transform."""

    columns: list[str] = Field(min_length=1, description="Column names or glob patterns (`f*`).")
    transform: Transform = Field(
        "passthrough",
        description="standardize: (x - mean) / std with fitted statistics; passthrough: the number as is; "
        "row_normalize: each row's values in the group divided by their sum of absolute values (all-zero rows stay "
        "zero), as for multi-hot bag-of-words columns; "
        "one_hot: one slot per category seen in the data (up to max_categories, rest in an 'other' slot); "
        "hashing: num_buckets slots chosen by a stable hash of the value.",
    )
    on_missing: Literal["error", "fill"] = Field(
        "error", description="What an empty cell, NaN or inf does: stop with an error naming file, row and column, or take fill_value."
    )
    fill_value: float = Field(0.0, description="Value for missing numbers (before standardizing).")
    max_categories: int = Field(64, gt=0, description="one_hot: most frequent categories kept.")
    num_buckets: int = Field(32, gt=0, description="hashing: number of buckets.")


class NodeTableSpec(_Section):
    """One node type, read from one file or every file below a prefix."""

    type: str = Field("node", description="Node type name.")
    uri: str = Field(description=_URI_HELP)
    format: Literal["auto", "csv", "parquet"] = Field("auto", description=_FORMAT_HELP)
    row_filter: str | None = Field(None, description=_ROW_FILTER_HELP)
    id_column: str = Field("node_id", description="Column with the node id (any type; enumerated to 0..n-1).")
    label_column: str | None = Field(None, description="Class label column (empty cells: unlabeled).")
    split_column: str | None = Field(None, description="Column naming each node's split; random split when absent.")
    features: list[FeatureSpec] = Field(default_factory=list, description="Feature column groups, in output order.")
    feature_storage: FeatureStorage = Field("float32", description=_STORAGE_HELP)

    @model_validator(mode="after")
    def _source(self) -> NodeTableSpec:
        _check_table_source(self.uri, self.format, self.row_filter)
        return self


class EdgeTableSpec(_Section):
    """One edge type (source type, relation, destination type)."""

    type: str = Field("edge", description="Relation name.")
    uri: str = Field(description=_URI_HELP)
    format: Literal["auto", "csv", "parquet"] = Field("auto", description=_FORMAT_HELP)
    row_filter: str | None = Field(None, description=_ROW_FILTER_HELP)
    src_column: str = Field("src", description="Column with the source node id.")
    dst_column: str = Field("dst", description="Column with the destination node id.")
    src_type: str = Field("node", description="Node type of the sources.")
    dst_type: str = Field("node", description="Node type of the destinations.")
    undirected: bool = Field(True, description="Each row stands for both directions.")
    split_column: str | None = Field(None, description="Link prediction: column naming each edge's split.")
    on_unknown_endpoint: Literal["error", "drop"] = Field(
        "error", description="An endpoint missing from the node table: stop with an error naming the row, or drop the edge and count it."
    )
    features: list[FeatureSpec] = Field(default_factory=list, description="Edge feature column groups.")
    feature_storage: FeatureStorage = Field("float32", description=_STORAGE_HELP)
    role: Literal["message", "positive_label", "negative_label"] = Field(
        "message",
        description="message: the edges messages flow over. positive_label / negative_label (link prediction): pairs "
        "(anchor, candidate) of the target's node types that supervise instead: positives to learn and score (their split "
        "column, or the random split; validation and test positives never carry messages) and hard negatives of their "
        "anchor (training.negatives: hard, and evaluation). Label tables are directed and have no features.",
    )

    @model_validator(mode="after")
    def _source(self) -> EdgeTableSpec:
        _check_table_source(self.uri, self.format, self.row_filter)
        return self

    @property
    def name(self) -> str:
        return f"{self.src_type}__{self.type}__{self.dst_type}"


class GraphSpec(_Section):
    nodes: list[NodeTableSpec] = Field(min_length=1, description="One entry per node type.")
    edges: list[EdgeTableSpec] = Field(min_length=1, description="One entry per edge type.")

    @model_validator(mode="after")
    def _types_consistent(self) -> GraphSpec:
        names = [n.type for n in self.nodes]
        if len(set(names)) != len(names):
            raise ValueError(f"node types must be unique, got {names}")
        for e in self.edges:
            for end in (e.src_type, e.dst_type):
                if end not in names:
                    raise ValueError(f"edge type {e.type!r} refers to node type {end!r}, not among {names}")
        edge_names = [e.name for e in self.edges]
        if len(set(edge_names)) != len(edge_names):
            raise ValueError(f"edge types must be unique, got {edge_names}")
        return self


class SplitSpec(_Section):
    """How nodes (classification) or edges (link prediction) are split."""

    train_value: str = Field("train", description="Split column value for training rows.")
    val_value: str = Field("val", description="Split column value for validation rows.")
    test_value: str = Field("test", description="Split column value for test rows.")
    none_values: list[str] = Field(
        default_factory=lambda: ["", "none"],
        description="Split column values that mean 'in no split' (an empty cell is ''); any other value outside "
        "train/val/test_value is an error naming file, row and value (a typo such as 'trian' is not silently unsplit).",
    )
    train: float = Field(0.8, ge=0, le=1, description="Random split: training fraction.")
    val: float = Field(0.1, ge=0, le=1, description="Random split: validation fraction.")
    test: float = Field(0.1, ge=0, le=1, description="Random split: test fraction.")
    seed: int = Field(42, description="Random split: seed (the split of a row depends only on it and the row's id).")

    @model_validator(mode="after")
    def _fractions(self) -> SplitSpec:
        if self.train + self.val + self.test > 1.0 + 1e-9:
            raise ValueError(f"split fractions sum to {self.train + self.val + self.test:g} > 1")
        return self


class TaskSpec(_Section):
    type: TaskType = Field("node_classification", description="node_classification or link_prediction.")
    target: str | None = Field(None, description="Node type (classification) or relation (link prediction); default: the first.")
    split: SplitSpec = Field(default_factory=SplitSpec, description="Split column values, or random split fractions.")
