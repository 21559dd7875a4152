"""Exact inference: full-neighbourhood GraphSAGE or GCN, or APPNP's and GCNII's propagation, over the whole graph, without sampling.

Homogeneous graphs only. It runs the trained encoder with the full-graph machinery of
:mod:`components.gnn.full_graph` (the one ``training.mode: full_graph`` trains with): each
worker keeps its own partition and, layer by layer, fetches the rows its nodes read from one
peer at a time, in blocks of ``training.full_graph_block_rows`` rows, so its memory grows with
its share of the graph plus one block, never with the whole graph. A partition holds every edge
its nodes aggregate over (edges live with the node that samples them), so no edge ever moves.
"""

from __future__ import annotations

import logging
import time

import torch
import torch.distributed as dist
from torch import nn

from components.config import GnnflowConfig
from components.errors import GnnflowError
from components.gnn.full_graph import encoder as full_graph
from components.gnn.full_graph.graph import aggregation_edges, partition_graph
from components.gnn.full_graph.plan import DEFAULT_BLOCK_ROWS
from components.gnn.model import decoded_features
from components.infer.outputs import NodeOutputs, class_probabilities
from components.infer.restore import RestoredModel
from components.partition.output import StoredPartition
from components.runtime.runlog import rate

__all__ = ["aggregation_edges", "check_encoder", "check_exact_config", "exact_outputs"]

log = logging.getLogger("gnnflow.infer")
CPU = torch.device("cpu")


def check_exact_config(config: GnnflowConfig) -> None:
    """A GnnflowError, before anything runs, when ``--mode exact`` cannot serve ``config``'s
    graph and model (exact inference rebuilds the plain GraphSAGE or GCN stack, or APPNP or GCNII, on one node type)."""
    graph, model = config.graph, config.model
    messages = [e for e in graph.edges if e.role == "message"]
    if len(graph.nodes) > 1 or len(messages) > 1:
        raise GnnflowError(
            f"infer --mode exact supports homogeneous graphs; this config has {len(graph.nodes)} node types and "
            f"{len(messages)} edge types: use --mode sampled"
        )
    if model.type not in ("graphsage", "gcn", "appnp", "gcnii"):
        raise GnnflowError(
            f"infer --mode exact supports model.type graphsage, gcn, appnp or gcnii; this config has model.type {model.type}: "
            "use --mode sampled"
        )
    if not graph.nodes[0].features:
        raise GnnflowError(
            f"infer --mode exact needs node features; node type {graph.nodes[0].type!r} has none "
            "(its nodes learn embeddings): use --mode sampled"
        )


def check_encoder(encoder: nn.Module) -> None:
    """A GnnflowError unless ``encoder`` is a stack the full-graph layers rebuild."""
    try:
        full_graph.check_encoder(encoder)
    except GnnflowError as exc:
        raise GnnflowError(f"--mode exact: {exc}: use --mode sampled") from None


@torch.no_grad()
def exact_outputs(
    part: StoredPartition,
    model: RestoredModel,
    rank: int,
    edge_keep: torch.Tensor | None = None,
    device: torch.device = CPU,
    block_rows: int = DEFAULT_BLOCK_ROWS,
) -> dict[str, NodeOutputs]:
    """Embeddings (and class probabilities) of every node of ``part``, on the host; collective, so
    every worker calls it. ``edge_keep``: (e,) bool mask of the partition's edges that carry
    messages. The layers run on the host whatever ``device`` is (their blocks move over gloo):
    a model placed on a GPU is brought to the host first."""
    schema = part.metadata.schema
    if schema.is_heterogeneous:
        raise GnnflowError("--mode exact supports homogeneous graphs (one node type, one edge type); use --mode sampled")
    module = model.module.cpu()
    encoder = module.encoder
    check_encoder(encoder)
    (node_type,) = schema.node_types
    world_size = dist.get_world_size() if dist.is_initialized() else 1
    start = time.perf_counter()
    graph = partition_graph(part, world_size, gcn=full_graph.uses_gcn(encoder), block_rows=block_rows, edge_keep=edge_keep)
    nodes = part.nodes[node_type]
    h = full_graph.encode(encoder, graph, decoded_features(encoder, node_type, nodes["features"]))  # eval mode: dropout is off
    seconds = time.perf_counter() - start
    plan = graph.plan
    log.info(
        "rank %d: %s: %d nodes embedded exactly (%s, %d edges, %.1f%% of them read from other workers) in %.1fs (%s)",
        rank,
        node_type,
        plan.num_rows,
        full_graph.depth(encoder),
        plan.edges,
        100 * plan.remote_edges / max(plan.edges, 1),
        seconds,
        rate(plan.num_rows, seconds),
    )
    probabilities = class_probabilities(module, h) if model.task_type == "node_classification" else None
    return {node_type: NodeOutputs(nodes["node_id"].clone(), h, probabilities)}
