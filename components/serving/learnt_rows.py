"""The input rows of featureless (learnt-embedding) node types, by partition id, and the row a
new node of such a type starts from.

Existing nodes get their trained row: the model's shards of the same partitions (or its
replicated table), or, when the partitions are not the model's own, the row found by original
id (:mod:`components.infer.cold_start`; a node without one gets the cold-start row). A new node
gets the cold-start row of :mod:`components.infer.cold_start`: the mean of the model's trained
rows of its type. The table is written once into the cache as ``.npy`` and memory-mapped.
"""

from __future__ import annotations

import io

import numpy as np
import torch

from components import storage
from components.gnn.learnt_embeddings import shard_path
from components.infer.cold_start import install_rows_by_original_id
from components.infer.restore import RestoredModel
from components.partition.output import read_partition
from components.serving.graph_store import GraphStore
from components.serving.local_files import LocalOutput
from components.serving.tensor_files import built_npy


def _shard(model: LocalOutput, node_type: str, rank: int) -> torch.Tensor:
    with open(model.path(shard_path(node_type, rank)), "rb") as handle:
        saved = torch.load(io.BytesIO(handle.read()), map_location="cpu", weights_only=True)
    return saved["rows"].to(torch.float32)


def _trained_mean(model: LocalOutput, restored: RestoredModel, node_type: str) -> np.ndarray:
    """(hidden,) mean of the model's trained rows of ``node_type``: the cold-start row."""
    if restored.spec.learnt_embeddings != "sharded":
        table = restored.trained_rows.get(node_type, restored.module.encoder.embedding[node_type].weight)
        return table.detach().to(torch.float64).mean(dim=0).to(torch.float32).numpy()
    total, count, rank = torch.zeros(restored.spec.hidden_channels, dtype=torch.float64), 0, 0
    while shard_path(node_type, rank) in model.published.manifest.files:
        rows = _shard(model, node_type, rank)
        total += rows.sum(dim=0, dtype=torch.float64)
        count += len(rows)
        rank += 1
    return (total / max(count, 1)).to(torch.float32).numpy()


def learnt_tables(
    model: LocalOutput, restored: RestoredModel, store: GraphStore, partitions: storage.PublishedOutput, elsewhere: bool
) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """Featureless type → ((n, hidden) rows by partition id, (hidden,) cold-start row)."""
    out = {}
    for node_type, node in store.schema.node_types.items():
        if node.feature_dim:
            continue

        def build(node_type: str = node_type) -> np.ndarray:
            if elsewhere:
                return _by_original_id(model, restored, store, partitions, node_type)
            if restored.spec.learnt_embeddings != "sharded":
                return restored.module.encoder.embedding[node_type].weight.detach().numpy()
            parts = [_shard(model, node_type, p) for p in range(store.metadata.num_partitions)]
            return torch.cat(parts).numpy()

        out[node_type] = (
            built_npy(model.derived_path(f"learnt-{node_type}-{partitions.manifest.generation}.npy"), build),
            _trained_mean(model, restored, node_type),
        )
    return out


def _by_original_id(
    model: LocalOutput, restored: RestoredModel, store: GraphStore, partitions: storage.PublishedOutput, node_type: str
) -> np.ndarray:
    """The rows of partitions other than the model's own, partition by partition."""
    rows = []
    for p in range(store.metadata.num_partitions):
        part = read_partition(partitions, p)  # one partition at a time, only while the table is built
        install_rows_by_original_id(model.published, restored, part, partitions)
        if restored.spec.learnt_embeddings == "sharded":
            order = torch.argsort(part.nodes[node_type]["node_id"])
            rows.append(part.nodes[node_type]["features"][order])
        else:
            return restored.module.encoder.embedding[node_type].weight.detach().numpy().copy()
    return torch.cat(rows).numpy()
