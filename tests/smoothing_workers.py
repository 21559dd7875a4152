"""Worker functions for tests/test_correct_smooth.py: spawned processes must import them by name."""

from __future__ import annotations

import torch

from components.gnn.full_graph.graph import aggregation_edges, build_full_graph
from components.infer.smoothing import correct_and_smooth, ring_propagation
from components.partition.output import range_ends, range_owner
from components.runtime.launcher import WorkerContext


def smoothing_pass(ctx: WorkerContext, case: dict) -> dict:
    """Each worker holds its range of ``case``'s graph (rows scrambled), the edges its nodes
    aggregate over and its rows of the base probabilities; per spec of ``case["specs"]``: the
    ids, corrected and final probabilities of its rows (numpy: tensors would travel through
    shared memory the exiting worker owns)."""
    ctx.init_process_group()
    torch.set_num_threads(1)
    counts, edge_index, base, y, train = case["counts"], case["edge_index"], case["base"], case["y"], case["train"]
    offset = sum(counts[: ctx.rank])
    own = offset + torch.randperm(counts[ctx.rank], generator=torch.Generator().manual_seed(ctx.rank))
    aggregating = edge_index[0] if case["edge_assignment"] == "src" else edge_index[1]
    held = range_owner(aggregating, range_ends(counts)) == ctx.rank
    edges = aggregation_edges(edge_index[:, held], own, sum(counts), case["edge_assignment"])
    graph = build_full_graph(edges, own, counts, ctx.rank, gcn=False, block_rows=case["block_rows"])
    local_train = torch.nonzero(train[own]).reshape(-1)
    results = {}
    for name, spec in case["specs"].items():
        out = correct_and_smooth(base[own], y[own][local_train], local_train, ring_propagation(graph), spec)
        results[name] = {"ids": own.numpy(), "probabilities": out.probabilities.numpy(), "corrected": out.corrected.numpy()}
    return results
