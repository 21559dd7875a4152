"""Partitions on storage: safetensors files (no pickle) plus JSON metadata.

Layout under a partition output's generation folder::

    part-00000/nodes/<type>.safetensors          node_id, source_id, features, label, split
    part-00000/edges/<type>.safetensors          edge_index, edge_id, source_edge_id, features, split
    part-00000/original_ids/<type>.parquet       node_id (partition id) → original_id
    id_maps/<type>/part-*.parquet                source id → original id (copied from serialize)
    partition_metadata.json                      rows per partition: the range partition books

Ids inside a partition are partition ids (see :mod:`.books`): partition ``p`` owns
``[sum(counts[:p]), sum(counts[:p+1]))`` of each node and stored edge type.
"""

from __future__ import annotations

import io
import json
from dataclasses import asdict, dataclass, field

import numpy as np
import pyarrow.parquet as pq
import torch
from safetensors.torch import load as load_safetensors
from safetensors.torch import save as save_safetensors

from components import storage
from components.errors import GnnflowError
from components.partition.books import range_offset
from components.partition.partitioner import GraphPartition
from components.schema import GraphSchema

METADATA_FILE = "partition_metadata.json"


def part_folder(index: int) -> str:
    return f"part-{index:05d}"


def original_ids_path(folder: str, node_type: str) -> str:
    return f"{folder}/original_ids/{node_type}.parquet"


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


@dataclass(frozen=True)
class PartitionMetadata:
    """What every partition shares: counts per partition, how edges were assigned, the graph."""

    num_partitions: int
    edge_assignment: str  # "src" or "dst": whose owner holds an edge
    node_counts: dict[str, list[int]]  # type → nodes per partition
    edge_counts: dict[str, list[int]]  # type → stored (directed) edges per partition
    graph: dict  # the serialize step's graph_metadata.json
    method: str = "hash"  # how nodes were assigned to partitions
    edge_cut: dict[str, float] = field(default_factory=dict)  # type → fraction of stored edges across partitions

    @property
    def schema(self) -> GraphSchema:
        return GraphSchema.from_json(json.dumps(self.graph), METADATA_FILE)

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=2)

    @staticmethod
    def from_json(text: str, source: str) -> PartitionMetadata:
        try:
            return PartitionMetadata(**json.loads(text))
        except (ValueError, TypeError) as exc:
            raise GnnflowError(f"{source} is not valid partition metadata: {exc}") from exc


def read_metadata(partitions: storage.PublishedOutput) -> PartitionMetadata:
    return PartitionMetadata.from_json(partitions.read_bytes(METADATA_FILE).decode(), str(partitions.uri(METADATA_FILE)))


def read_tensors(partitions: storage.PublishedOutput, relative_path: str) -> dict[str, torch.Tensor]:
    """One safetensors file, checked against its manifest entry before it is parsed."""
    return load_safetensors(partitions.read_bytes(relative_path))


@dataclass
class StoredPartition:
    """Partition ``index`` read back: the tensors of :class:`GraphPartition`."""

    index: int
    metadata: PartitionMetadata
    nodes: dict[str, dict[str, torch.Tensor]]
    edges: dict[str, dict[str, torch.Tensor]]

    def node_offset(self, node_type: str) -> int:
        """Partition id of this partition's first node of ``node_type``."""
        return range_offset(self.metadata.node_counts[node_type], self.index)

    def edge_offset(self, edge_type: str) -> int:
        return range_offset(self.metadata.edge_counts[edge_type], self.index)

    @property
    def nbytes(self) -> int:
        """Bytes of every tensor this partition holds."""
        return sum(t.nbytes for tables in (self.nodes, self.edges) for tensors in tables.values() for t in tensors.values())


def read_partition(partitions: storage.PublishedOutput, index: int) -> StoredPartition:
    """Reads partition ``index`` and the partition books from a published partition output."""
    metadata = read_metadata(partitions)
    if not 0 <= index < metadata.num_partitions:
        raise GnnflowError(f"{partitions.root} has {metadata.num_partitions} partitions, asked for partition {index}")
    folder = part_folder(index)
    nodes = {t: read_tensors(partitions, f"{folder}/nodes/{t}.safetensors") for t in metadata.node_counts}
    if any("source_id" not in v for v in nodes.values()):
        raise GnnflowError(f"{partitions.root} was written by an older gnnflow (hash partition books, no range ids): re-run partition")
    return StoredPartition(
        index=index,
        metadata=metadata,
        nodes=nodes,
        edges={t: read_tensors(partitions, f"{folder}/edges/{t}.safetensors") for t in metadata.edge_counts},
    )


def read_original_ids(partitions: storage.PublishedOutput, index: int, node_type: str) -> np.ndarray:
    """(n,) original ids (str objects) of partition ``index``'s nodes of ``node_type``, in node order."""
    rel = original_ids_path(part_folder(index), node_type)
    table = pq.read_table(io.BytesIO(partitions.read_bytes(rel)), columns=["original_id"])
    return np.asarray(table.column("original_id").to_numpy(zero_copy_only=False), dtype=object)
