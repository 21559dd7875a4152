"""Worker functions for link-metric tests: importable, so the launcher can spawn them."""

from __future__ import annotations

import torch

from components.gnn.model import LinkPredictor
from components.infer.link_eval import link_metrics, own_embeddings
from components.runtime.launcher import WorkerContext


def score_test_edges(
    ctx: WorkerContext, z_by_source: torch.Tensor, pairs_by_source: torch.Tensor, owner_of_source: torch.Tensor, seed: int
) -> dict[str, float]:
    """Partitions nodes by ``owner_of_source`` (renumbered, as partition does), gives each worker
    the test pairs whose source it owns, and computes the distributed link metrics."""
    if ctx.world_size > 1:
        ctx.init_process_group()
    counts = torch.bincount(owner_of_source, minlength=ctx.world_size).tolist()
    order = torch.argsort(owner_of_source, stable=True)  # partition ids: by owner, then source id
    partition_of_source = torch.empty_like(order)
    partition_of_source[order] = torch.arange(len(order))
    mine = order[owner_of_source[order] == ctx.rank]  # my source ids, in partition-id order
    model = LinkPredictor(torch.nn.Identity(), z_by_source.shape[1], "dot", ("node", "link", "node"))
    z = own_embeddings(z_by_source[mine], counts, ctx.rank, mine, partition_of_source[mine], ctx.world_size)
    edge_ids = torch.arange(pairs_by_source.shape[1])
    keep = owner_of_source[pairs_by_source[0]] == ctx.rank
    return link_metrics(model, z, z, partition_of_source[pairs_by_source[:, keep]], edge_ids[keep], seed, ctx.world_size)
