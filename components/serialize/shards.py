"""How serialize cuts each node and edge type into TFRecord shards and encodes their records;
shared by the local engine (:func:`write_shards`) and the Beam engine."""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from components import storage
from components.config import SerializeSpec
from components.runtime.runlog import progress
from components.schema import GraphSchema
from components.tfrecord import encode_examples

# Framing, keys and three small ints: what a record costs beyond its float payload.
_RECORD_OVERHEAD_BYTES = 64


def shard_count(rows: int, feature_dim: int, options: SerializeSpec) -> int:
    """Shards for one type: the configured number, or enough to keep each near the target size."""
    if options.num_shards is not None:
        return max(1, min(options.num_shards, rows)) if rows else 1
    total = rows * (4 * feature_dim + _RECORD_OVERHEAD_BYTES)
    return max(1, min(rows, math.ceil(total / options.target_shard_bytes))) if rows else 1


def iter_part_batches(preprocessed: storage.PublishedOutput, files: Sequence[str]) -> Iterator[pa.RecordBatch]:
    for rel in files:
        # A part whole (parts are written whole too): Parquet reads its footer first, so a stream
        # could not be checked as it is read; these bytes are, before Parquet sees them.
        yield from pq.ParquetFile(pa.BufferReader(preprocessed.read_bytes(rel))).iter_batches(batch_size=8192)


def _features(batch: pa.RecordBatch, dim: int) -> np.ndarray:
    """(rows, dim) float32 from a fixed-size-list column (absent when dim is 0)."""
    if dim == 0:
        return np.zeros((batch.num_rows, 0), dtype=np.float32)
    column = batch.column(batch.schema.get_field_index("features"))
    return column.flatten().to_numpy(zero_copy_only=False).reshape(batch.num_rows, dim)  # flatten honours slices


def encode_batch(batch: pa.RecordBatch, int_columns: Sequence[str], dim: int, first_row: int) -> bytes:
    """Records of one batch; ``edge_id`` is not a column but the row's position in its type."""
    ints = {
        name: np.arange(first_row, first_row + batch.num_rows, dtype=np.int64)
        if name == "edge_id"
        else batch.column(batch.schema.get_field_index(name)).to_numpy().astype(np.int64)
        for name in int_columns
    }
    return encode_examples(ints, {"features": _features(batch, dim)})


def _shard_pieces(batches: Iterator[pa.RecordBatch], per_shard: int, num_shards: int) -> Iterator[tuple[int, pa.RecordBatch]]:
    """Cuts the batch stream at shard boundaries: (shard index, rows for it), in order."""
    shard, in_shard = 0, 0
    for batch in batches:
        start = 0
        while start < batch.num_rows:
            if in_shard == per_shard and shard + 1 < num_shards:
                shard, in_shard = shard + 1, 0
            room = batch.num_rows - start if shard + 1 == num_shards else per_shard - in_shard
            take = min(room, batch.num_rows - start)
            yield shard, batch.slice(start, take)
            start += take
            in_shard += take


def write_shards(staging: storage.OutputStaging, plan: TypeShards, batches: Iterator[pa.RecordBatch]) -> tuple[list[str], list[int]]:
    """Streams the type's batches into its shards (near-equal row counts); returns their paths
    and record counts."""
    paths = plan.shard_paths()
    counts = [0] * plan.num_shards
    done = 0
    with progress(plan.folder, total=plan.rows) as bar:
        for shard, group in itertools.groupby(_shard_pieces(batches, plan.per_shard, plan.num_shards), key=lambda piece: piece[0]):
            with staging.open_write(paths[shard]) as writer:
                for _, piece in group:
                    writer.write(encode_batch(piece, plan.int_columns, plan.dim, done))
                    counts[shard] += piece.num_rows
                    done += piece.num_rows
                    bar.update(piece.num_rows)
    for shard, count in enumerate(counts):  # fewer rows than shards: empty shards
        if count == 0:
            staging.write_bytes(paths[shard], b"")
    return paths, counts


@dataclass(frozen=True)
class TypeShards:
    """How one node or edge type is cut into shards."""

    folder: str  # "nodes/<type>" or "edges/<name>"
    parts: list[str]  # the preprocessed Parquet parts, in row order
    part_rows: list[int]  # rows per part (empty: unknown)
    rows: int
    num_shards: int
    int_columns: list[str]
    dim: int

    def shard_paths(self) -> list[str]:
        return [f"{self.folder}/shard-{i:05d}-of-{self.num_shards:05d}.tfrecord" for i in range(self.num_shards)]

    @property
    def per_shard(self) -> int:
        """Rows of every shard but the last (which takes the rest)."""
        return math.ceil(self.rows / self.num_shards) if self.rows else 0

    def shard_ranges(self) -> list[tuple[int, int]]:
        """[start, stop) rows of every shard: what :func:`write_shards` puts in each."""
        per_shard = self.per_shard
        return [(min(i * per_shard, self.rows), min((i + 1) * per_shard, self.rows)) for i in range(self.num_shards)]

    @property
    def record_format(self) -> dict:
        return {"int64": {c: 1 for c in self.int_columns}, "float": {"features": self.dim}}


def plan_shards(schema: GraphSchema, options: SerializeSpec) -> dict[str, TypeShards]:
    """Every type's shards, keyed by folder (nodes first, in schema order)."""
    plans: list[TypeShards] = []
    for name, node in schema.node_types.items():
        ints = ["node_id", *(["label"] if node.label_vocabulary is not None else []), "split"]
        plans.append(
            TypeShards(
                f"nodes/{name}",
                node.files,
                node.file_rows,
                node.count,
                shard_count(node.count, node.feature_dim, options),
                ints,
                node.feature_dim,
            )
        )
    for name, edge in schema.edge_types.items():
        plans.append(
            TypeShards(
                f"edges/{name}",
                edge.files,
                edge.file_rows,
                edge.count,
                shard_count(edge.count, edge.feature_dim, options),
                ["edge_id", "src", "dst", "split"],
                edge.feature_dim,
            )
        )
    return {p.folder: p for p in plans}
