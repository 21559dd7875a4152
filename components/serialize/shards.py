"""How serialize cuts each node and edge type into TFRecord shards and encodes their records;
shared by the local engine (:func:`write_shards`) and the Beam engine."""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import pyarrow as pa
import pyarrow.parquet as pq

from components import storage
from components.config import SerializeSpec
from components.runtime.runlog import progress
from components.schema import GraphSchema
from components.serialize.records import RecordLayout, encode_batch, record_layout

# Framing, keys and three small ints: what a record costs beyond its feature payload.
_RECORD_OVERHEAD_BYTES = 64


def shard_count(rows: int, feature_dim: int, options: SerializeSpec, value_bytes: int = 4) -> int:
    """Shards for one type: the configured number, or enough to keep each near the target size
    (``value_bytes``: bytes of one written feature value)."""
    if options.num_shards is not None:
        return max(1, min(options.num_shards, rows)) if rows else 1
    total = rows * (value_bytes * feature_dim + _RECORD_OVERHEAD_BYTES)
    return max(1, min(rows, math.ceil(total / options.target_shard_bytes))) if rows else 1


def iter_part_batches(preprocessed: storage.PublishedOutput, files: Sequence[str]) -> Iterator[pa.RecordBatch]:
    for rel in files:
        # A part whole (parts are written whole too): Parquet reads its footer first, so a stream
        # could not be checked as it is read; these bytes are, before Parquet sees them.
        yield from pq.ParquetFile(pa.BufferReader(preprocessed.read_bytes(rel))).iter_batches(batch_size=8192)


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


def write_shards(staging: storage.OutputStaging, plan: TypeShards, batches: Iterator[pa.RecordBatch]) -> tuple[list[str], list[int], int]:
    """Streams the type's batches into its shards (near-equal row counts); returns their paths,
    record counts and the feature values clipped to the stored type."""
    paths = plan.shard_paths()
    counts = [0] * plan.num_shards
    done = clipped = 0
    with progress(plan.folder, total=plan.rows) as bar:
        for shard, group in itertools.groupby(_shard_pieces(batches, plan.per_shard, plan.num_shards), key=lambda piece: piece[0]):
            with staging.open_write(paths[shard]) as writer:
                for _, piece in group:
                    data, lost = encode_batch(piece, plan.layout, done, plan.folder)
                    writer.write(data)
                    clipped += lost
                    counts[shard] += piece.num_rows
                    done += piece.num_rows
                    bar.update(piece.num_rows)
    for shard, count in enumerate(counts):  # fewer rows than shards: empty shards
        if count == 0:
            staging.write_bytes(paths[shard], b"")
    return paths, counts, clipped


@dataclass(frozen=True)
class TypeShards:
    """How one node or edge type is cut into shards."""

    folder: str  # "nodes/<type>" or "edges/<name>"
    parts: list[str]  # the preprocessed Parquet parts, in row order
    part_rows: list[int]  # rows per part (empty: unknown)
    rows: int
    num_shards: int
    layout: RecordLayout

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
        return self.layout.record_format


def plan_shards(schema: GraphSchema, options: SerializeSpec) -> dict[str, TypeShards]:
    """Every type's shards, keyed by folder (nodes first, in schema order)."""
    plans: list[TypeShards] = []
    for name, node in schema.node_types.items():
        ints = ["node_id", *(["label"] if node.label_vocabulary is not None else []), "split"]
        layout = record_layout(ints, node.feature_dim, node, node.split_sizes, f"graph schema, node type {name!r}")
        count = shard_count(node.count, node.feature_dim, options, _value_bytes(layout))
        plans.append(TypeShards(f"nodes/{name}", node.files, node.file_rows, node.count, count, layout))
    for name, edge in schema.edge_types.items():
        ints = ["edge_id", "src", "dst", "split"]
        layout = record_layout(ints, edge.feature_dim, edge, edge.split_sizes, f"graph schema, edge type {name!r}")
        count = shard_count(edge.count, edge.feature_dim, options, _value_bytes(layout))
        plans.append(TypeShards(f"edges/{name}", edge.files, edge.file_rows, edge.count, count, layout))
    return {p.folder: p for p in plans}


def _value_bytes(layout: RecordLayout) -> int:
    return layout.codec.value_bytes if layout.codec is not None else 4
