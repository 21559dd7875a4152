"""The input rows of featureless (learnt-embedding) nodes when inference runs on partitions other
than the model's own: fresh tables, new node ids, maybe another number of workers.

A model's rows are keyed by the ids of its own run, which mean nothing in other partitions. Each
trained row is found again by the node's original id, through the id maps the model carries
(``learnt_embeddings/<type>/ids-<rank>.parquet``, see :mod:`components.train.bundle`).

- Sharded rows: a worker streams the model's shards one at a time and keeps only the rows of its
  own nodes, so it never holds more than one trained shard besides its own rows.
- Replicated rows (in ``model.pt``): every worker holds the whole table anyway (the samplers'
  batches look rows up by id); it is rebuilt in the new ids' order.

**Cold start.** A node of a featureless type that the model never saw (new since training) starts
from the *mean of the model's trained rows of its type*. Why this rule:

- it is the one row that is closest, in squared distance, to the trained rows on average: the
  least-wrong guess for a node about which the model knows nothing, and inside the region the
  first layer was trained on (a zero or random row is not);
- it is fixed by the model alone: the same for every run, worker count and partitioning, so a
  cold node's embedding is reproducible and changes only as its neighbourhood does;
- the node is not left alone with it: the GNN layers then aggregate its neighbours, and that is
  what tells cold nodes apart. (Seeding the row with its neighbours' rows instead would need their
  rows before the first layer, and a featureless node's neighbours are often of another type,
  whose inputs live in another space: projected features.)

Inference marks those nodes (column ``cold`` of the shards) and counts them (``cold_nodes``).
"""

from __future__ import annotations

import io
import re

import numpy as np
import pandas as pd
import pyarrow.parquet as pq
import torch

from components import storage
from components.errors import GnnflowError
from components.gnn.learnt_embeddings import SHARD_DIR, learnt_types, shard_path
from components.infer.restore import RestoredModel, install_learnt_rows
from components.partition.output import StoredPartition, read_original_ids
from components.schema import GraphSchema
from components.train.output import LEARNT_IDS_FILE

_IDS_NAME = re.compile(r"ids-(\d+)\.parquet$")


def trained_elsewhere(model: storage.PublishedOutput, partitions: storage.PublishedOutput) -> bool:
    """Whether ``partitions`` are not the ones the model was trained on (its manifest names their
    generation; a model published before models recorded it is taken to be on its own)."""
    generation = model.manifest.metadata.get("source_generation")
    return generation is not None and generation != partitions.manifest.generation


def _ids_files(model: storage.PublishedOutput, node_type: str) -> list[str]:
    """The model's id maps of ``node_type``, one per training rank, in rank order."""
    found = [p for p in model.files_under(f"{SHARD_DIR}/{node_type}") if _IDS_NAME.search(p)]
    ranks = sorted(int(_IDS_NAME.search(p).group(1)) for p in found)  # type: ignore[union-attr]
    if not ranks or ranks != list(range(len(ranks))):
        expected = LEARNT_IDS_FILE.format(node_type=node_type, rank=0)
        raise GnnflowError(
            f"{model.root} holds no complete id map of node type {node_type!r} (found {len(found)} files like {expected}): "
            "an older model embeds only the partitions it was trained on"
        )
    return [LEARNT_IDS_FILE.format(node_type=node_type, rank=r) for r in ranks]


def check_bundle(model: storage.PublishedOutput, schema: GraphSchema) -> None:
    """Before any worker starts: the model has an id map of every featureless type."""
    for name, node in schema.node_types.items():
        if not node.feature_dim:
            _ids_files(model, name)


def _read_ids(model: storage.PublishedOutput, path: str) -> tuple[np.ndarray, np.ndarray]:
    table = pq.read_table(io.BytesIO(model.read_bytes(path)), columns=["node_id", "original_id"])
    originals = np.asarray(table.column("original_id").to_numpy(zero_copy_only=False), dtype=object)
    return table.column("node_id").to_numpy(), originals


def _sharded(model: storage.PublishedOutput, node_type: str, own: pd.Index, hidden: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(own rows, own found) of ``own`` original ids, streaming the model's shards one at a time."""
    rows = torch.empty(len(own), hidden)
    found = torch.zeros(len(own), dtype=torch.bool)
    total, count = torch.zeros(hidden, dtype=torch.float64), 0
    for rank, ids_path in enumerate(_ids_files(model, node_type)):
        node_ids, originals = _read_ids(model, ids_path)
        saved = torch.load(io.BytesIO(model.read_bytes(shard_path(node_type, rank))), map_location="cpu", weights_only=True)
        start, trained = int(saved["start"]), saved["rows"].to(torch.float32)
        local = node_ids - start
        if trained.shape[1] != hidden or len(local) != len(trained) or (len(local) and (local.min() < 0 or local.max() >= len(trained))):
            raise GnnflowError(f"{model.uri(ids_path)} does not match {model.uri(shard_path(node_type, rank))}: re-run train")
        total += trained.sum(dim=0, dtype=torch.float64)
        count += len(trained)
        where = own.get_indexer(originals)
        hit = where >= 0
        rows[torch.from_numpy(where[hit])] = trained[torch.from_numpy(local[hit])]
        found[torch.from_numpy(where[hit])] = True
        del saved, trained  # one shard at a time
    rows[~found] = (total / max(count, 1)).to(torch.float32)
    return rows, found


def _replicated(
    model: storage.PublishedOutput, node_type: str, partitions: storage.PublishedOutput, part: StoredPartition, trained: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """(the whole table in the partitions' ids, found of this partition's nodes)."""
    maps = [_read_ids(model, path) for path in _ids_files(model, node_type)]
    node_ids = np.concatenate([m[0] for m in maps])
    index = pd.Index(np.concatenate([m[1] for m in maps]))
    if len(node_ids) != len(trained) or not np.array_equal(np.sort(node_ids), np.arange(len(trained))):
        raise GnnflowError(f"{model.root}: the id maps of {node_type!r} do not cover the {len(trained)} rows of its table: re-run train")
    mean = trained.to(torch.float64).mean(dim=0).to(torch.float32)
    counts = part.metadata.node_counts[node_type]
    table, own_found = torch.empty(sum(counts), trained.shape[1]), torch.zeros(0, dtype=torch.bool)
    first = 0
    for index_p, count in enumerate(counts):
        where = index.get_indexer(read_original_ids(partitions, index_p, node_type))
        hit = torch.from_numpy(where >= 0)
        block = mean.repeat(count, 1)
        block[hit] = trained[torch.from_numpy(node_ids[where[where >= 0]])]
        table[first : first + count] = block
        own_found = hit if index_p == part.index else own_found
        first += count
    return table, own_found


def install_rows_by_original_id(
    model: storage.PublishedOutput, restored: RestoredModel, part: StoredPartition, partitions: storage.PublishedOutput
) -> dict[str, torch.Tensor]:
    """Installs every featureless type's input rows for ``part`` (trained row by original id, or
    the cold-start row); returns, per such type, which of the partition's nodes are cold."""
    cold = {}
    hidden = restored.spec.hidden_channels
    for node_type in learnt_types(part):
        if restored.spec.learnt_embeddings == "sharded":
            own = pd.Index(read_original_ids(partitions, part.index, node_type))
            rows, found = _sharded(model, node_type, own, hidden)
            part.nodes[node_type]["features"] = rows
        else:
            table, found = _replicated(model, node_type, partitions, part, restored.trained_rows[node_type])
            with torch.no_grad():
                restored.module.encoder.embedding[node_type].weight.copy_(table)
        cold[node_type] = ~found
    return cold


def install_learnt_inputs(
    model: storage.PublishedOutput, restored: RestoredModel, part: StoredPartition, partitions: storage.PublishedOutput, elsewhere: bool
) -> dict[str, torch.Tensor] | None:
    """The featureless types' rows for ``part``: the model's own shard of the same partition when
    ``part`` is one the model was trained on (then None: no node can be cold), by original id
    otherwise (then the cold flags per featureless type)."""
    if not elsewhere:
        install_learnt_rows(model, restored.spec, part)
        return None
    return install_rows_by_original_id(model, restored, part, partitions)
