"""Worker functions for tests/test_correct_smooth.py: spawned processes must import them by name."""

from __future__ import annotations

import torch

from components.gnn.full_graph.graph import FullGraph, aggregation_edges, build_full_graph
from components.infer.alpha_selection import smooth_and_select
from components.infer.smoothing import correct_and_smooth, correct_and_smooth_grid, ring_propagation
from components.partition.output import range_ends, range_owner
from components.runtime.launcher import WorkerContext


def _worker_graph(ctx: WorkerContext, case: dict) -> tuple[torch.Tensor, FullGraph]:
    """This worker's node ids (its range of ``case``'s graph, rows scrambled) and its ring over
    the edges its nodes aggregate over."""
    ctx.init_process_group()
    torch.set_num_threads(1)
    counts, edge_index = case["counts"], case["edge_index"]
    offset = sum(counts[: ctx.rank])
    own = offset + torch.randperm(counts[ctx.rank], generator=torch.Generator().manual_seed(ctx.rank))
    aggregating = edge_index[0] if case["edge_assignment"] == "src" else edge_index[1]
    held = range_owner(aggregating, range_ends(counts)) == ctx.rank
    edges = aggregation_edges(edge_index[:, held], own, sum(counts), case["edge_assignment"])
    return own, build_full_graph(edges, own, counts, ctx.rank, gcn=False, block_rows=case["block_rows"])


def smoothing_pass(ctx: WorkerContext, case: dict) -> dict:
    """Per spec of ``case["specs"]``: the ids, corrected and final probabilities of this worker's
    rows (numpy: tensors would travel through shared memory the exiting worker owns)."""
    own, graph = _worker_graph(ctx, case)
    local_train = torch.nonzero(case["train"][own]).reshape(-1)
    results = {}
    for name, spec in case["specs"].items():
        out = correct_and_smooth(case["base"][own], case["y"][own][local_train], local_train, ring_propagation(graph), spec)
        results[name] = {"ids": own.numpy(), "probabilities": out.probabilities.numpy(), "corrected": out.corrected.numpy()}
    return results


def grid_pass(ctx: WorkerContext, case: dict) -> dict:
    """Per spec: every pair of ``case["grid"]`` (correction alphas, smoothing alphas) at once."""
    own, graph = _worker_graph(ctx, case)
    local_train = torch.nonzero(case["train"][own]).reshape(-1)
    results = {}
    for name, spec in case["specs"].items():
        out = correct_and_smooth_grid(
            case["base"][own], case["y"][own][local_train], local_train, ring_propagation(graph), spec, *case["grid"]
        )
        flat = {key: getattr(out, key).reshape(len(own), -1).numpy() for key in ("probabilities", "corrected")}
        results[name] = {"ids": own.numpy(), **flat}  # (n, candidates x C)
    return results


def selection_pass(ctx: WorkerContext, case: dict) -> dict:
    """Per spec: :func:`smooth_and_select` given this worker's rows' labels and split codes
    (``case["split"]``, every split's labels included): the ids, the chosen probabilities and the
    choice's metrics."""
    own, graph = _worker_graph(ctx, case)
    results = {}
    for name, spec in case["specs"].items():
        out = smooth_and_select(case["base"][own], case["y"][own], case["split"][own], ring_propagation(graph), spec)
        results[name] = {"ids": own.numpy(), "probabilities": out.probabilities.numpy(), "metrics": out.metrics()}
    return results
