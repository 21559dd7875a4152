"""Worker functions for retrieval tests: importable, so the launcher can spawn them."""

from __future__ import annotations

import pyarrow as pa
import torch

from components.config import RetrievalSpec
from components.infer.retrieval import OwnNodes, build_index, search_everywhere
from components.runtime.launcher import WorkerContext


def search_own_share(ctx: WorkerContext, z: torch.Tensor, k: int, spec: RetrievalSpec, exact: bool) -> dict:
    """Worker w owns the w-th contiguous share of ``z`` (n, h) as both sources and destinations
    (one node type) and searches; returns its candidate ids and scores and the recall counts."""
    if ctx.world_size > 1:
        ctx.init_process_group()
    shares = torch.arange(len(z)).tensor_split(ctx.world_size)
    mine = shares[ctx.rank]
    own = OwnNodes(mine, z[mine], pa.array([f"n{i}" for i in mine.tolist()]))
    found = search_everywhere(build_index(own.embeddings, exact, spec), own, own, k, True, spec, ctx.world_size)
    # Plain lists: tensors would travel back as shared memory that dies with the worker.
    return {"ids": found.ids.tolist(), "scores": found.scores.tolist(), "hits": found.exact_hits, "total": found.exact_total}
