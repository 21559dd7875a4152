"""Where one worker's inference outputs go: a shard stream (:mod:`.shard_stream`) per node type,
with the columns every row needs besides the model's output (original ids, predictions' class
names, cold flags)."""

from __future__ import annotations

import contextlib
import io
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Protocol

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import torch

from components import storage
from components.infer.outputs import NodeOutputs
from components.infer.shard_stream import ROW_GROUP_ROWS, ShardSpec, shard_stream
from components.partition.output import StoredPartition, original_ids_path, part_folder


def original_id_column(partitions: storage.PublishedOutput, index: int, node_type: str) -> pa.Array:
    """(n,) original ids of partition ``index``'s nodes of ``node_type``, in node order, as one
    Arrow string array (a few bytes a node; Python strings would cost about 60)."""
    table = pq.read_table(io.BytesIO(partitions.read_bytes(original_ids_path(part_folder(index), node_type))), columns=["original_id"])
    return table.column("original_id").combine_chunks().cast(pa.string())


class RowSink(Protocol):
    """Where one node type's outputs go as they are computed (a :class:`.shard_stream.ShardStream`, or a holder)."""

    most_early_rows: int

    def add(self, out: NodeOutputs) -> None: ...


@dataclass(frozen=True)
class OutputSinks:
    """One worker's shards: ``originals``: original ids by node type (this partition's, in node
    order); ``cold``: node type → (n,) bool flags of the featureless types on partitions other than
    the model's own (None: the model's own partitions, no ``cold`` column)."""

    staging: storage.OutputStaging
    part: StoredPartition
    originals: dict[str, pa.Array]
    cold: dict[str, torch.Tensor] | None = None
    row_group_rows: int = ROW_GROUP_ROWS

    def spec(self, node_type: str) -> ShardSpec:
        schema = self.part.metadata.schema
        node = schema.node_types[node_type]
        classified = schema.task_type == "node_classification" and node_type == schema.target
        originals = self.originals[node_type]
        flags = None
        if self.cold is not None:
            flags = self.cold[node_type].numpy() if node_type in self.cold else np.zeros(len(originals), dtype=bool)
        return ShardSpec(
            node_type,
            self.part.index,
            self.part.index,
            self.part.node_offset(node_type),
            originals,
            node.label_vocabulary if classified else None,
            flags,
        )

    @contextlib.contextmanager
    def open(self, node_type: str) -> Iterator[RowSink]:
        """The stream of ``node_type``'s shard; see :func:`.shard_stream.shard_stream`."""
        with shard_stream(self.staging, self.spec(node_type), self.row_group_rows) as stream:
            yield stream
