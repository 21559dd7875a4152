"""A worker's own shards read back for the metrics, only the columns each needs: the outputs are
not kept in memory while they are written (:mod:`.shard_stream`), and the metrics then describe
the published files themselves."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import torch

from components import storage
from components.errors import GnnflowError
from components.infer import shards
from components.infer.retrieval import OwnNodes
from components.partition.output import StoredPartition


def read_own(
    staging: storage.OutputStaging, rank: int, node_type: str, columns: list[str], originals: pa.Array
) -> tuple[pa.Table, torch.Tensor]:
    """This worker's shard of ``node_type`` (``columns``, with ``node_id``) and each row's position
    among the worker's nodes; ``originals``: their original ids in node order."""
    path = shards.shard_path(node_type, rank)
    table = shards.read_shard(staging, path, columns=list(dict.fromkeys(["node_id", *columns])))
    if table.num_rows != len(originals):
        raise GnnflowError(f"{staging.uri(path)} holds {table.num_rows} rows, the worker owns {len(originals)} nodes")
    ids = table.column("node_id")
    if ids.equals(pa.chunked_array([originals], pa.string())):  # written in node order: no index to build
        return table, torch.arange(len(originals))
    own = np.asarray(originals.to_numpy(zero_copy_only=False), dtype=object)
    return table, torch.from_numpy(shards.rows_of(own, ids, str(staging.uri(path))))


def own_embeddings(staging: storage.OutputStaging, rank: int, node_type: str, originals: pa.Array) -> torch.Tensor:
    """(n, dim) embeddings of the worker's nodes of ``node_type``, in node order, from its shard."""
    table, rows = read_own(staging, rank, node_type, ["embedding"], originals)
    z = shards.embedding_matrix(table)
    del table
    if torch.equal(rows, torch.arange(len(rows))):
        return z
    ordered = torch.empty_like(z)
    ordered[rows] = z
    return ordered


def own_nodes(staging: storage.OutputStaging, part: StoredPartition, node_type: str, originals: pa.Array) -> OwnNodes:
    """Retrieval's view of the worker's nodes of ``node_type``: partition ids, embeddings and
    original ids, in node order, from its shard."""
    return OwnNodes(
        torch.arange(len(originals)) + part.node_offset(node_type), own_embeddings(staging, part.index, node_type, originals), originals
    )
