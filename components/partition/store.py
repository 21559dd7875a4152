"""Partitions on storage: safetensors files (no pickle) plus JSON metadata.

Layout under a partition output's generation folder::

    part-00000/nodes/<type>.safetensors          node_id, source_id, features, label, split
    part-00000/edges/<type>.safetensors          edge_index, indptr, edge_id, source_edge_id, features, split
    part-00000/original_ids/<type>.parquet       node_id (partition id) → original_id
    id_maps/<type>/part-*.parquet                source id → original id (copied from serialize)
    partition_metadata.json                      rows per partition: the range partition books

Ids inside a partition are partition ids (see :mod:`.books`): partition ``p`` owns
``[sum(counts[:p]), sum(counts[:p+1]))`` of each node and stored edge type.

A partition's edges are stored in compressed order: sorted by the end whose owner stores them
(the source with ``edge_assignment: src``, else the destination), then the other end, then the
source edge id; ``indptr`` (n + 1,) is the row pointer over the n owned nodes of that end. GLT
takes them as CSR (or CSC) without sorting again. Partitions written before that have no
``indptr``: they still load, through GLT's own conversion (the memory it costs).
"""

from __future__ import annotations

import contextlib
import io
import json
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from typing import Any, Protocol, cast

import numpy as np
import pyarrow.parquet as pq
import torch

from components import storage
from components.errors import GnnflowError
from components.partition.books import range_offset
from components.partition.partitioner import GraphPartition
from components.partition.tensor_read import DTYPES, SHARED, Stream, Want, read_data, read_header
from components.schema import GraphSchema, stored_edge_types

METADATA_FILE = "partition_metadata.json"


def part_folder(index: int) -> str:
    return f"part-{index:05d}"


def original_ids_path(folder: str, node_type: str) -> str:
    return f"{folder}/original_ids/{node_type}.parquet"


class _Writable(Protocol):
    def write(self, data: bytes, /) -> int: ...


_SAFETENSORS_DTYPE = {dtype: name for name, dtype in DTYPES.items()}
_WRITE_CHUNK = 16 << 20  # bytes per write (each copied once, for the checksum): bounded, whatever the tensor's size


def write_tensors(stream: _Writable, tensors: dict[str, torch.Tensor]) -> None:
    """Writes ``tensors`` to ``stream`` in the safetensors format, one tensor's bytes at a time:
    nothing beside the tensors themselves is held, where safetensors' ``save`` would build the
    whole file as one bytes object first (another copy of a partition's largest tensors)."""
    header: dict[str, Any] = {}
    position = 0
    for name, tensor in tensors.items():
        size = tensor.numel() * tensor.element_size()
        header[name] = {"dtype": _SAFETENSORS_DTYPE[tensor.dtype], "shape": list(tensor.shape), "data_offsets": [position, position + size]}
        position += size
    encoded = json.dumps(header, separators=(",", ":")).encode()
    encoded += b" " * (-len(encoded) % 8)  # the data starts 8-byte aligned, as safetensors pads it
    stream.write(len(encoded).to_bytes(8, "little"))
    stream.write(encoded)
    for tensor in tensors.values():
        flat = tensor.contiguous().reshape(-1).view(torch.uint8).numpy()
        for start in range(0, len(flat), _WRITE_CHUNK):
            stream.write(flat[start : start + _WRITE_CHUNK].tobytes())  # bytes: the CRC32C extension takes no memoryview


def tensor_bytes(tensors: dict[str, torch.Tensor]) -> bytes:
    """``tensors`` as one safetensors file's bytes (for small files and tests)."""
    buffer = io.BytesIO()
    write_tensors(buffer, tensors)
    return buffer.getvalue()


def write_partition(part: GraphPartition, staging: storage.OutputStaging) -> dict[str, storage.FileEntry]:
    """Writes this worker's partition files; returns what it wrote, for the manifest. Each type's
    tensors leave ``part`` once written, so the worker's memory falls as the files grow."""
    folder = part_folder(part.index)
    before = set(staging.entries)
    for kind, types in (("edges", part.edges), ("nodes", part.nodes)):
        for name in list(types):
            tensors = types.pop(name)
            with staging.open_write(f"{folder}/{kind}/{name}.safetensors") as stream:
                write_tensors(stream, tensors)
            del tensors
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


# Called with the metadata and the edge tables just read; returns what it built from them.
AfterEdges = Callable[[PartitionMetadata, dict[str, dict[str, torch.Tensor]]], dict[str, Any]]


def read_metadata(partitions: storage.PublishedOutput) -> PartitionMetadata:
    return PartitionMetadata.from_json(partitions.read_bytes(METADATA_FILE).decode(), str(partitions.uri(METADATA_FILE)))


@contextlib.contextmanager
def _checked_stream(partitions: storage.PublishedOutput, relative_path: str) -> Iterator[tuple[Stream, str]]:
    """The file's stream, checked against its manifest entry as it is read, and its URI."""
    with partitions.open_read(relative_path) as stream:
        yield cast(Stream, stream), str(partitions.uri(relative_path))


def read_tensors(
    partitions: storage.PublishedOutput, relative_path: str, want: dict[str, Want | None] | None = None
) -> dict[str, torch.Tensor]:
    """One safetensors file streamed into its tensors (:mod:`.tensor_read`) through the check
    against its manifest entry: each whole in ordinary memory, unless ``want`` says otherwise."""
    with _checked_stream(partitions, relative_path) as (stream, source):
        slots, _ = read_header(stream, source)
        return read_data(stream, source, slots, want or {})


def _sampled_edges(partitions: storage.PublishedOutput, relative_path: str, uncompressed_row: int, ids: bool) -> dict[str, torch.Tensor]:
    """A message edge file as GLT's sampler keeps it: ``indptr``, ``indices`` (the other end of
    each edge, row ``uncompressed_row`` of ``edge_index``), ``edge_id`` (only when ``ids``: the
    graph has edge features to look up by them) and ``features``, the last three in shared
    memory; the compressed end, source edge ids and splits are not kept. A file without
    ``indptr`` (older partitions) is read whole."""
    with _checked_stream(partitions, relative_path) as (stream, source):
        slots, _ = read_header(stream, source)
        if "indptr" not in slots:
            return read_data(stream, source, slots, {})
        unkept: dict[str, Want | None] = {"source_edge_id": None, "split": None, "edge_id": SHARED if ids else None}
        want = {"edge_index": Want(shared=True, row=uncompressed_row), "features": SHARED, **unkept}
        tensors = read_data(stream, source, slots, want)
    tensors["indices"] = tensors.pop("edge_index")
    return tensors


@dataclass
class StoredPartition:
    """Partition ``index`` read back: the tensors of :class:`GraphPartition`."""

    index: int
    metadata: PartitionMetadata
    nodes: dict[str, dict[str, torch.Tensor]]
    edges: dict[str, dict[str, torch.Tensor]]
    # What a reader built from the tensors as they arrived (see read_partition's after_edges).
    built: dict[str, Any] = field(default_factory=dict)

    def node_offset(self, node_type: str) -> int:
        """Partition id of this partition's first node of ``node_type``."""
        return range_offset(self.metadata.node_counts[node_type], self.index)

    def edge_offset(self, edge_type: str) -> int:
        return range_offset(self.metadata.edge_counts[edge_type], self.index)

    @property
    def nbytes(self) -> int:
        """Bytes of every tensor this partition holds."""
        return sum(t.nbytes for tables in (self.nodes, self.edges) for tensors in tables.values() for t in tensors.values())


def read_partition(
    partitions: storage.PublishedOutput, index: int, *, for_sampling: bool = False, after_edges: AfterEdges | None = None
) -> StoredPartition:
    """Reads partition ``index`` and the partition books from a published partition output.

    ``for_sampling``: only what a GLT dataset of it keeps, each tensor read straight to where GLT
    holds it: node and edge features in shared memory, and each message edge type as
    :func:`_sampled_edges` (no ``edge_index``, ``source_edge_id`` or edge ``split``, and edge
    ids only for a graph with edge features). For workers that need nothing else of the edges
    (node classification). ``after_edges`` runs once the edges are read, before the node tables
    are: what it returns is the partition's ``built``."""
    metadata = read_metadata(partitions)
    if not 0 <= index < metadata.num_partitions:
        raise GnnflowError(f"{partitions.root} has {metadata.num_partitions} partitions, asked for partition {index}")
    folder = part_folder(index)
    messages = stored_edge_types(metadata.schema) if for_sampling else {}
    uncompressed_row = 1 if metadata.edge_assignment == "src" else 0
    ids = any(e.feature_dim for e in metadata.schema.message_edge_types.values())
    edges = {}
    for t in metadata.edge_counts:
        path = f"{folder}/edges/{t}.safetensors"
        edges[t] = _sampled_edges(partitions, path, uncompressed_row, ids) if t in messages else read_tensors(partitions, path)
    built = after_edges(metadata, edges) if after_edges is not None else {}
    node_want: dict[str, Want | None] = {"features": SHARED} if for_sampling else {}
    nodes = {t: read_tensors(partitions, f"{folder}/nodes/{t}.safetensors", node_want) for t in metadata.node_counts}
    if any("source_id" not in v for v in nodes.values()):
        raise GnnflowError(f"{partitions.root} was written by an older gnnflow (hash partition books, no range ids): re-run partition")
    return StoredPartition(index=index, metadata=metadata, nodes=nodes, edges=edges, built=built)


def read_original_ids(partitions: storage.PublishedOutput, index: int, node_type: str) -> np.ndarray:
    """(n,) original ids (str objects) of partition ``index``'s nodes of ``node_type``, in node order."""
    rel = original_ids_path(part_folder(index), node_type)
    table = pq.read_table(io.BytesIO(partitions.read_bytes(rel)), columns=["original_id"])
    return np.asarray(table.column("original_id").to_numpy(zero_copy_only=False), dtype=object)
