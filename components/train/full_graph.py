"""The train step's set-up for ``training.mode: full_graph``: no sampler and no RPC, only the
worker's partition, the model and a :class:`~components.gnn.full_graph.node_task.FullGraphNodeTask`.
The epoch loop, checkpoints, early stopping and publishing are the step's own (:mod:`.step`)."""

from __future__ import annotations

import logging
from collections.abc import Callable

from torch import nn

from components.config import GnnflowConfig
from components.gnn.build import build_model
from components.gnn.full_graph.node_task import FullGraphNodeTask
from components.partition.output import StoredPartition
from components.runtime.launcher import WorkerContext

log = logging.getLogger("gnnflow.train")


def full_graph_setup(
    ctx: WorkerContext, part: StoredPartition, config: GnnflowConfig, edge_dir: str, seed: Callable[[int], None]
) -> tuple[FullGraphNodeTask, nn.Module, nn.Module, Callable[[], None]]:
    """(task, model, the module an epoch trains, what to call once training is over); collective.

    The model stays on the host: the blocks between workers move over gloo. Gradients are summed
    by the task itself after each backward pass, so the module trained is the model, not a DDP
    wrapper (whose bucketed all-reduces would interleave with the layers' own sends).
    """
    seed(config.training.seed)
    model = build_model(part.metadata.schema, config, edge_dir)
    task = FullGraphNodeTask(part, model, config, ctx.world_size)
    part.edges.clear()  # the fetch plan holds what it needs of the topology
    if ctx.rank == 0:
        log.info("full-graph training on %d worker(s), blocks of at most %d rows", ctx.world_size, config.training.full_graph_block_rows)
    return task, model, model, lambda: None
