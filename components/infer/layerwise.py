"""Exact inference: full-neighbourhood GraphSAGE, one layer at a time, without sampling.

Homogeneous graphs only. Before each layer every worker all-gathers the previous layer's
representations of all N nodes (an (N, width) tensor per worker: fine for graphs whose
embeddings fit one machine's memory), then runs the layer's SAGEConv for its own nodes over
its own edges. A partition holds every edge its nodes aggregate over (edges live with the node
that samples them), so no edge ever moves.
"""

from __future__ import annotations

import logging
import time

import torch
from torch import nn

from components.config import GnnflowConfig
from components.errors import GnnflowError
from components.infer.outputs import NodeOutputs, class_probabilities
from components.infer.restore import RestoredModel
from components.partition.store import StoredPartition
from components.runlog import rate
from components.gnn.metrics import all_gather_cat

log = logging.getLogger("gnnflow.infer")


def aggregation_edges(edge_index: torch.Tensor, own_ids: torch.Tensor, count: int, edge_assignment: str) -> torch.Tensor:
    """(2, e) bipartite edge index [neighbour global id; row of the aggregating node in ``own_ids``].

    Mirrors what the samplers of training saw: with edges assigned by source (GLT edge_dir
    'out') a node v aggregates over the destinations u of its edges v→u; by destination ('in'),
    over the sources u of its edges u→v. ``edge_index``: (2, e) [src; dst] global ids.
    """
    src, dst = edge_index
    aggregating, neighbour = (src, dst) if edge_assignment == "src" else (dst, src)
    row = torch.full((count,), -1, dtype=torch.int64)
    row[own_ids] = torch.arange(len(own_ids))
    local = row[aggregating]
    if (local < 0).any():
        raise GnnflowError(f"the partition holds {int((local < 0).sum())} edges whose {edge_assignment} node lives elsewhere: "
                           "its partition metadata does not match its edges")
    return torch.stack([neighbour, local])


def check_exact_config(config: GnnflowConfig) -> None:
    """A GnnflowError, before anything runs, when ``--mode exact`` cannot serve ``config``'s
    graph and model (exact inference rebuilds the plain GraphSAGE stack on one node type)."""
    graph, model = config.graph, config.model
    messages = [e for e in graph.edges if e.role == "message"]
    if len(graph.nodes) > 1 or len(messages) > 1:
        raise GnnflowError(f"infer --mode exact supports homogeneous graphs; this config has {len(graph.nodes)} node types and "
                           f"{len(messages)} edge types: use --mode sampled")
    if model.type != "graphsage":
        raise GnnflowError(f"infer --mode exact supports model.type graphsage; this config has model.type {model.type}: "
                           "use --mode sampled")
    if not graph.nodes[0].features:
        raise GnnflowError(f"infer --mode exact needs node features; node type {graph.nodes[0].type!r} has none "
                           "(its nodes learn embeddings): use --mode sampled")


def check_encoder(encoder: nn.Module) -> None:
    """A GnnflowError unless ``encoder`` is the plain GraphSAGE stack this module rebuilds."""
    from torch_geometric.nn.models import GraphSAGE

    # Only the plain stack (conv, then activation between layers) is rebuilt here; anything
    # else (jumping knowledge, norms, a final linear layer) would be silently wrong.
    plain = isinstance(encoder, GraphSAGE) and encoder.jk_mode is None and getattr(encoder, "lin", None) is None and not encoder.act_first
    if plain and encoder.norms is not None:
        plain = all(isinstance(norm, nn.Identity) for norm in encoder.norms)
    if not plain:
        raise GnnflowError(f"--mode exact supports the plain GraphSAGE encoder (model.type graphsage on a homogeneous graph "
                           f"with node features); this model's is {type(encoder).__name__}: use --mode sampled")


def _gather_all(rows: torch.Tensor, all_ids: torch.Tensor, count: int) -> torch.Tensor:
    """(count, width) rows of every node, indexed by global id, from each worker's own (n, width);
    ``all_ids``: (count,) every worker's node ids in rank order, as all_gather_cat concatenates."""
    out = torch.empty((count, rows.shape[1]), dtype=rows.dtype)
    out[all_ids] = all_gather_cat(rows)
    return out


@torch.no_grad()
def exact_outputs(part: StoredPartition, model: RestoredModel, rank: int, edge_keep: torch.Tensor | None = None) -> dict[str, NodeOutputs]:
    """Embeddings (and class probabilities) of every node of ``part``; runs collectives, so every
    worker calls it. ``edge_keep``: (e,) bool mask of the partition's edges that carry messages."""
    schema = part.metadata.schema
    if schema.is_heterogeneous:
        raise GnnflowError("--mode exact supports homogeneous graphs (one node type, one edge type); use --mode sampled")
    encoder = model.module.encoder
    check_encoder(encoder)
    (node_type,) = schema.node_types
    (edge_type,) = schema.message_edge_types
    count = schema.node_types[node_type].count
    own = part.nodes[node_type]["node_id"]
    edge_index = part.edges[edge_type]["edge_index"]
    if edge_keep is not None:
        edge_index = edge_index[:, edge_keep]
    edges = aggregation_edges(edge_index, own, count, part.metadata.edge_assignment)
    start = time.perf_counter()
    all_ids = all_gather_cat(own)
    if len(all_ids) != count or len(torch.unique(all_ids)) != count:
        raise GnnflowError(f"the partitions hold {len(all_ids)} nodes ({len(torch.unique(all_ids))} distinct) of {node_type!r}, "
                           f"the graph has {count}")
    h_all = _gather_all(part.nodes[node_type]["features"].to(torch.float32), all_ids, count)
    h_own = h_all[own]
    last = len(encoder.convs) - 1
    for i, conv in enumerate(encoder.convs):
        h_own = conv((h_all, h_own), edges, size=(count, len(own)))
        if i < last:
            h_own = encoder.act(h_own)  # dropout is off at inference
            h_all = _gather_all(h_own, all_ids, count)
    seconds = time.perf_counter() - start
    log.info("rank %d: %s: %d nodes embedded exactly (%d layers, %d edges) in %.1fs (%s)", rank, node_type, len(own),
             last + 1, edges.shape[1], seconds, rate(len(own), seconds))
    probabilities = class_probabilities(model.module, h_own) if model.task_type == "node_classification" else None
    return {node_type: NodeOutputs(own.clone(), h_own, probabilities)}
