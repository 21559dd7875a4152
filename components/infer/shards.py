"""The Parquet shards inference writes, keyed by original node ids, and reading them back.

One shard per node type and worker, ``embeddings/<type>/part-<rank>.parquet``, columns:
``node_id`` (string, the id of the user's table), ``embedding`` (list<float32>), and for the
classification target ``prediction`` (class name) and ``probability`` (float32, its softmax).
Inference on partitions other than the model's own (fresh tables) adds ``cold`` (bool): true for a
featureless-type node the model has no trained row of (a node new since training, embedded from
the cold-start row, see :mod:`.cold_start`), false for every other node.
"""

from __future__ import annotations

import io

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import torch

from components import storage
from components.errors import GnnflowError
from components.infer.output import EMBEDDINGS_FOLDER
from components.infer.outputs import NodeOutputs

COMPRESSION = "zstd"


def shard_path(node_type: str, rank: int) -> str:
    return f"{EMBEDDINGS_FOLDER}/{node_type}/part-{rank:05d}.parquet"


def shard_table(
    originals: np.ndarray | pa.Array, out: NodeOutputs, vocabulary: list[str] | None, cold: np.ndarray | None = None
) -> pa.Table:
    """The Parquet table of one shard (or of consecutive rows of one); ``originals``: (n,) original
    ids of ``out.node_ids``; ``cold``: (n,) bool, which of them are cold (None: no such column)."""
    n, hidden = out.embeddings.shape
    flat = pa.array(out.embeddings.to(torch.float32).numpy().reshape(-1), pa.float32())
    offsets = pa.array(np.arange(0, (n + 1) * hidden, hidden, dtype=np.int32) if hidden else np.zeros(n + 1, np.int32))
    columns: dict[str, pa.Array] = {
        "node_id": originals.cast(pa.string()) if isinstance(originals, pa.Array) else pa.array(originals, pa.string()),
        "embedding": pa.ListArray.from_arrays(offsets, flat),
    }
    if out.probabilities is not None and vocabulary is not None:
        probability, predicted = out.probabilities.max(dim=1)
        columns["prediction"] = pa.array(np.asarray(vocabulary, dtype=object)[predicted.numpy()], pa.string())
        columns["probability"] = pa.array(probability.to(torch.float32).numpy(), pa.float32())
    if cold is not None:
        columns["cold"] = pa.array(cold.astype(bool), pa.bool_())
    return pa.table(columns)


def write_shard(staging: storage.OutputStaging, node_type: str, rank: int, table: pa.Table) -> str:
    path = shard_path(node_type, rank)
    buffer = io.BytesIO()
    pq.write_table(table, buffer, compression=COMPRESSION)
    staging.write_bytes(path, buffer.getvalue())
    return path


def read_shard(staging: storage.OutputStaging, path: str, columns: list[str] | None = None) -> pa.Table:
    return pq.read_table(io.BytesIO(storage.read_bytes(staging.uri(path))), columns=columns)


def rows_of(originals: np.ndarray, node_ids: pa.ChunkedArray | pa.Array, where: str) -> np.ndarray:
    """Position in ``originals`` (original ids, (count,)) of every id in ``node_ids``; each must be there once."""
    index = pd.Index(originals)
    rows = index.get_indexer(np.asarray(node_ids.to_numpy(zero_copy_only=False), dtype=object))
    if (rows < 0).any():
        raise GnnflowError(f"{where}: {int((rows < 0).sum())} node ids are not in the id map")
    if len(np.unique(rows)) != len(rows):
        raise GnnflowError(f"{where}: some node ids appear more than once")
    return rows


def embedding_matrix(table: pa.Table) -> torch.Tensor:
    """(rows, hidden) float32 from the ``embedding`` list column."""
    column = table.column("embedding").combine_chunks()
    flat = np.array(column.flatten().to_numpy(zero_copy_only=False), dtype=np.float32)  # a copy: Arrow's buffers are read-only
    return torch.from_numpy(flat.reshape(len(column), -1) if len(column) else np.zeros((0, 0), np.float32))
