"""Each partition's original ids (the ids of the user's tables), so that infer writes them
without any worker reading the whole id map.

Worker ``w`` reads every P-th id-map file (``node_id`` = source id, ``original_id``), looks up
each node's partition id in the :class:`~.books.IdDirectory` and sends the UTF-8 bytes to the
owner, which writes ``part-<index>/original_ids/<type>.parquet``: ``node_id`` (partition id,
increasing) and ``original_id`` (string), one row per node of the partition.
"""

from __future__ import annotations

import io

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import torch

from components import storage
from components.errors import GnnflowError
from components.partition.books import range_ends, range_owner
from components.partition.partitioner import GraphPartition
from components.partition.store import original_ids_path
from components.runtime.collectives import all_sum_int, exchange, exchange_strings
from components.schema import GraphSchema


def _read_my_id_maps(serialized: storage.PublishedOutput, files: list[str], rank: int, world_size: int) -> tuple[torch.Tensor, pa.Array]:
    tables = [
        pq.read_table(io.BytesIO(serialized.read_bytes(rel)), columns=["node_id", "original_id"])
        for i, rel in enumerate(files)
        if i % world_size == rank
    ]
    if not tables:
        return torch.zeros(0, dtype=torch.int64), pa.array([], pa.string())
    table = pa.concat_tables(tables)
    originals = pc.cast(table.column("original_id"), pa.string()).combine_chunks()
    return torch.from_numpy(table.column("node_id").to_numpy().astype(np.int64)), originals


def write_original_ids(
    serialized: storage.PublishedOutput, metadata: GraphSchema, part: GraphPartition, staging: storage.OutputStaging, folder: str
) -> dict[str, storage.FileEntry]:
    """Collective: routes every original id to its partition and writes this worker's files."""
    before = set(staging.entries)
    for name, node in metadata.node_types.items():
        if not node.id_map_files:
            raise GnnflowError(f"the serialized graph holds no id map for node type {name!r}: re-run preprocess and serialize")
        source, originals = _read_my_id_maps(serialized, node.id_map_files, part.index, part.num_partitions)
        new = part.directories[name].lookup(source)
        unknown = all_sum_int(int((new < 0).sum()))
        if unknown:
            raise GnnflowError(f"the id map of node type {name!r} holds {unknown} id(s) that are not nodes of the graph")
        owner = range_owner(new, range_ends(part.node_counts[name]))
        order, received = exchange_strings(originals, owner, part.num_partitions)
        ids = exchange({"node_id": new[order]}, owner[order], part.num_partitions)["node_id"]
        own = part.node_counts[name][part.index]
        missing = all_sum_int(int(len(ids) != own or len(torch.unique(ids)) != own))
        if missing:
            raise GnnflowError(f"the id map of node type {name!r} does not name every node exactly once")
        rows = torch.argsort(ids)
        table = pa.table({"node_id": pa.array(ids[rows].numpy()), "original_id": received.take(pa.array(rows.numpy()))})
        buffer = io.BytesIO()
        pq.write_table(table, buffer, compression="zstd")
        staging.write_bytes(original_ids_path(folder, name), buffer.getvalue())
    return {k: v for k, v in staging.entries.items() if k not in before}
