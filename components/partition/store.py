"""Partitions on storage: safetensors files (no pickle) plus JSON metadata.

Layout under a partition output's generation folder::

    part-00000/nodes/<type>.safetensors   node_id, features, label, split
    part-00000/edges/<type>.safetensors   edge_index, edge_id, features, split
    books/nodes/<type>.safetensors        partition (count,) int16
    books/edges/<type>.safetensors        partition (stored edges,) int16; edge types with features only
    id_maps/<type>/part-*.parquet         int id → original id (copied from serialize)
    partition_metadata.json
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass

import torch
from safetensors.torch import load as load_safetensors
from safetensors.torch import save as save_safetensors

from components import storage
from components.errors import GnnflowError
from components.partition.partitioner import GraphPartition
from components.schema import GraphSchema

METADATA_FILE = "partition_metadata.json"


def part_folder(index: int) -> str:
    return f"part-{index:05d}"


def tensor_bytes(tensors: dict[str, torch.Tensor]) -> bytes:
    return save_safetensors({k: v.contiguous() for k, v in tensors.items()})


def write_partition(part: GraphPartition, staging: storage.OutputStaging) -> dict[str, storage.FileEntry]:
    """Writes this worker's partition files; returns what it wrote, for the manifest."""
    folder = part_folder(part.index)
    before = set(staging.entries)
    for name, tensors in part.nodes.items():
        staging.write_bytes(f"{folder}/nodes/{name}.safetensors", tensor_bytes(tensors))
    for name, tensors in part.edges.items():
        staging.write_bytes(f"{folder}/edges/{name}.safetensors", tensor_bytes(tensors))
    return {k: v for k, v in staging.entries.items() if k not in before}


def write_books(part: GraphPartition, staging: storage.OutputStaging) -> None:
    for name, book in part.node_books.items():
        staging.write_bytes(f"books/nodes/{name}.safetensors", tensor_bytes({"partition": book}))
    for name, book in part.edge_books.items():
        staging.write_bytes(f"books/edges/{name}.safetensors", tensor_bytes({"partition": book}))


@dataclass(frozen=True)
class PartitionMetadata:
    """What every partition shares: counts per partition, how edges were assigned, the graph."""

    num_partitions: int
    edge_assignment: str  # "src" or "dst": whose owner holds an edge
    node_counts: dict[str, list[int]]  # type → nodes per partition
    edge_counts: dict[str, list[int]]  # type → stored (directed) edges per partition
    graph: dict  # the serialize step's graph_metadata.json

    @property
    def schema(self) -> GraphSchema:
        return GraphSchema.from_json(json.dumps(self.graph), METADATA_FILE)

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=2)

    @staticmethod
    def from_json(text: str, source: str) -> "PartitionMetadata":
        try:
            return PartitionMetadata(**json.loads(text))
        except (ValueError, TypeError) as exc:
            raise GnnflowError(f"{source} is not valid partition metadata: {exc}") from exc


def read_metadata(partitions: storage.PublishedOutput) -> PartitionMetadata:
    return PartitionMetadata.from_json(partitions.read_bytes(METADATA_FILE).decode(), str(partitions.uri(METADATA_FILE)))


def read_tensors(partitions: storage.PublishedOutput, relative_path: str) -> dict[str, torch.Tensor]:
    data = partitions.read_bytes(relative_path)
    entry = partitions.manifest.files[relative_path]
    if len(data) != entry.size:
        raise GnnflowError(f"{partitions.uri(relative_path)} has {len(data)} bytes, its manifest says {entry.size}")
    return load_safetensors(data)


@dataclass
class StoredPartition:
    """Partition ``index`` read back: the tensors of :class:`GraphPartition`, books included."""

    index: int
    metadata: PartitionMetadata
    nodes: dict[str, dict[str, torch.Tensor]]
    edges: dict[str, dict[str, torch.Tensor]]
    node_books: dict[str, torch.Tensor]
    edge_books: dict[str, torch.Tensor]


def read_partition(partitions: storage.PublishedOutput, index: int) -> StoredPartition:
    """Reads partition ``index`` and the partition books from a published partition output."""
    metadata = read_metadata(partitions)
    if not 0 <= index < metadata.num_partitions:
        raise GnnflowError(f"{partitions.root} has {metadata.num_partitions} partitions, asked for partition {index}")
    folder = part_folder(index)
    return StoredPartition(
        index=index,
        metadata=metadata,
        nodes={t: read_tensors(partitions, f"{folder}/nodes/{t}.safetensors") for t in metadata.node_counts},
        edges={t: read_tensors(partitions, f"{folder}/edges/{t}.safetensors") for t in metadata.edge_counts},
        node_books={t: read_tensors(partitions, f"books/nodes/{t}.safetensors")["partition"] for t in metadata.node_counts},
        edge_books={t: read_tensors(partitions, f"books/edges/{t}.safetensors")["partition"] for t in metadata.edge_counts
                    if f"books/edges/{t}.safetensors" in partitions.manifest.files},
    )
