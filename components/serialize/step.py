"""Step ``serialize``: preprocessed tables → TFRecord shards of ``tf.train.Example``.

One record per node (``node_id``, ``label``, ``split`` as int64; ``features`` as one packed
float list) and per edge (``edge_id``, ``src``, ``dst``, ``split``; ``features``); an edge's id is
its position within its type, so later steps can name edges (partition books, edge features). Each type is cut into
shards of about equal size so N workers can read disjoint shard subsets in parallel.

Output (published atomically)::

    nodes/<type>/shard-00000-of-00004.tfrecord
    edges/<src>__<rel>__<dst>/shard-*.tfrecord
    id_maps/<type>/part-*.parquet      copied from preprocess, for mapping results back
    graph_metadata.json                the schema every later step reads (files: shards)
    config.resolved.yaml
"""

from __future__ import annotations

import dataclasses
import itertools
import logging
import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from components import storage
from components.config import GnnflowConfig, SerializeSpec
from components.preprocess.step import STEP as PREPROCESS_STEP
from components.preprocess.step import read_graph_schema
from components.runlog import progress, rate, timed
from components.schema import GraphSchema
from components.tfrecord import encode_examples

log = logging.getLogger("gnnflow.serialize")

STEP = "serialize"
METADATA_FILE = "graph_metadata.json"
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
        with storage.open_read(preprocessed.uri(rel)) as f:
            yield from pq.ParquetFile(f).iter_batches(batch_size=8192)


def _features(batch: pa.RecordBatch, dim: int) -> np.ndarray:
    """(rows, dim) float32 from a fixed-size-list column (absent when dim is 0)."""
    if dim == 0:
        return np.zeros((batch.num_rows, 0), dtype=np.float32)
    column = batch.column(batch.schema.get_field_index("features"))
    return column.flatten().to_numpy(zero_copy_only=False).reshape(batch.num_rows, dim)  # flatten honours slices


def _encode_batch(batch: pa.RecordBatch, int_columns: Sequence[str], dim: int, first_row: int) -> bytes:
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
                    writer.write(_encode_batch(piece, plan.int_columns, plan.dim, done))
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


def serialize(
    config: GnnflowConfig | None, preprocessed_uri: storage.Uri | str, output: storage.Uri | str, image: str | None = None
) -> storage.PublishedOutput:
    """Runs the step over a published preprocess output; returns the published TFRecords.
    With ``preprocess.engine: beam`` the shards are written by Beam workers in parallel."""
    options = config.serialize if config else SerializeSpec()
    preprocessed = storage.open_published(preprocessed_uri, step=PREPROCESS_STEP)
    schema = read_graph_schema(preprocessed)
    output = storage.parse_uri(output)
    engine = config.preprocess.engine if config else "local"
    log.info("serialize: %s → %s (engine %s)", preprocessed.root, output, engine)
    plans = plan_shards(schema, options)
    with timed() as elapsed, storage.staged_output(output, STEP) as staging:
        if engine == "beam":
            from components.serialize.beam_engine import write_with_beam

            assert config is not None
            written = write_with_beam(config, preprocessed, plans, staging, image)
        else:
            written = {}
            for folder, plan in plans.items():
                written[folder] = write_shards(staging, plan, iter_part_batches(preprocessed, plan.parts))
            for node in schema.node_types.values():
                for rel in node.id_map_files:
                    storage.copy_file(preprocessed.uri(rel), staging.uri(rel))
        for node in schema.node_types.values():
            staging.add_entries({rel: preprocessed.manifest.files[rel] for rel in node.id_map_files})
        published = _publish(staging, config, preprocessed, schema, plans, written)
    total = sum(published.manifest.counts.values())
    log.info("serialize: published %s: %d records, %s", output, total, rate(total, elapsed[0]))
    return published


def _publish(
    staging: storage.OutputStaging,
    config: GnnflowConfig | None,
    preprocessed: storage.PublishedOutput,
    schema: GraphSchema,
    plans: dict[str, TypeShards],
    written: dict[str, tuple[list[str], list[int]]],
) -> storage.PublishedOutput:
    record_format: dict[str, dict] = {"node_types": {}, "edge_types": {}}
    node_types, edge_types = {}, {}
    for name, node in schema.node_types.items():
        shards, rows = written[f"nodes/{name}"]
        node_types[name] = dataclasses.replace(node, files=shards, file_rows=rows, id_map_files=list(node.id_map_files))
        record_format["node_types"][name] = plans[f"nodes/{name}"].record_format
        log.info("nodes[%s]: %d records in %d shard(s)", name, node.count, len(shards))
    for name, edge in schema.edge_types.items():
        shards, rows = written[f"edges/{name}"]
        edge_types[name] = dataclasses.replace(edge, files=shards, file_rows=rows)
        record_format["edge_types"][name] = plans[f"edges/{name}"].record_format
        log.info("edges[%s]: %d records in %d shard(s)", name, edge.count, len(shards))
    metadata = GraphSchema(schema.task_type, schema.target, node_types, edge_types, record_format)
    staging.write_bytes(METADATA_FILE, metadata.to_json().encode())
    if config is not None:
        staging.write_bytes("config.resolved.yaml", config.to_yaml().encode())
    counts = {f"nodes.{k}": v.count for k, v in node_types.items()} | {f"edges.{k}": v.count for k, v in edge_types.items()}
    return staging.publish(
        counts=counts, metadata={"source": str(preprocessed.root), "source_generation": preprocessed.manifest.generation}
    )


def read_graph_metadata(serialized: storage.PublishedOutput) -> GraphSchema:
    return GraphSchema.from_json(serialized.read_bytes(METADATA_FILE).decode(), str(serialized.uri(METADATA_FILE)))
