"""Worker functions for link-label tests: importable, so the launcher can spawn them."""

from __future__ import annotations

import torch

from components import storage
from components.gnn.link_labels import training_edges
from components.partition.output import STEP as PARTITION_STEP
from components.partition.output import read_original_ids, read_partition
from components.runtime.launcher import WorkerContext
from components.schema import SPLIT_CODES


def held_out_positives_in_messages(ctx: WorkerContext, partitions_uri: str) -> dict:
    """On this worker's partition: the message edges of the target that training keeps, as
    original-id pairs, and how many it drops; plus its held-out positive labels."""
    ctx.init_process_group()
    partitions = storage.open_published(partitions_uri, step=PARTITION_STEP)
    part = read_partition(partitions, ctx.rank)
    schema = part.metadata.schema
    originals = {}
    for index in range(ctx.world_size):  # small test graph: every worker may name every paper
        originals[index] = read_original_ids(partitions, index, "paper")
    names = [o for index in range(ctx.world_size) for o in originals[index]]
    mask = training_edges(part, schema, ctx.world_size)[schema.target]
    edges = part.edges[schema.target]["edge_index"]
    labels = part.edges[schema.label_edge_type("positive_label")]
    held = labels["edge_index"][
        :, torch.isin(labels["split"], torch.tensor([SPLIT_CODES["val"], SPLIT_CODES["test"]], dtype=labels["split"].dtype))
    ]
    pairs = lambda index: [(names[a], names[b]) for a, b in index.t().tolist()]  # noqa: E731
    return {"kept": pairs(edges[:, mask]), "dropped": int((~mask).sum()), "held_out": pairs(held)}
