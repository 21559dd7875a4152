"""The GraphSAGE and GCN stacks of :mod:`components.gnn.model`, run over the whole graph: the
same modules and weights as sampled training (a model trained either way serves both), each
convolution recomputed here from its own parameters with sequential aggregation."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from components.errors import GnnflowError
from components.gnn.full_graph.aggregate import aggregate
from components.gnn.full_graph.graph import FullGraph


def check_encoder(encoder: nn.Module) -> None:
    """A GnnflowError unless ``encoder`` is a plain PyG GraphSAGE or GCN stack (conv, then
    activation and dropout between layers), the only ones rebuilt here: anything else (jumping
    knowledge, norms, a final linear layer, projected or normalised SAGE) would be silently wrong."""
    from torch_geometric.nn import GCNConv, SAGEConv
    from torch_geometric.nn.models import GCN, GraphSAGE

    plain = isinstance(encoder, (GraphSAGE, GCN)) and encoder.jk_mode is None and getattr(encoder, "lin", None) is None
    plain = plain and not encoder.act_first and all(isinstance(norm, nn.Identity) for norm in (encoder.norms or []))
    for conv in encoder.convs if plain else []:
        if isinstance(conv, SAGEConv):
            plain = plain and not conv.project and not conv.normalize and conv.aggr in ("mean", "sum", "max")
        elif isinstance(conv, GCNConv):
            plain = plain and conv.normalize and conv.add_self_loops and not conv.improved
        else:
            plain = False
    if not plain:
        raise GnnflowError(
            f"full-graph message passing supports the plain GraphSAGE and GCN encoders (model.type graphsage or "
            f"gcn on a homogeneous graph with node features); this model's is {type(encoder).__name__}"
        )


def _sage(conv: nn.Module, h: torch.Tensor, graph: FullGraph) -> torch.Tensor:
    """SAGEConv: lin_l(aggregate of neighbours) + lin_r(self)."""
    lin = conv.lin_l
    if conv.aggr != "max" and lin.out_channels < lin.in_channels:
        # Sum and mean commute with the linear map: project first and fetch narrower rows.
        out = aggregate(F.linear(h, lin.weight), graph.plan, conv.aggr)
        out = out + lin.bias if lin.bias is not None else out
    else:
        out = lin(aggregate(h, graph.plan, conv.aggr))
    return out + conv.lin_r(h) if conv.root_weight else out


def _gcn(conv: nn.Module, h: torch.Tensor, graph: FullGraph) -> torch.Tensor:
    """GCNConv: D^-1/2 (A + I) D^-1/2 (h W) + b; each owner scales its rows by its own deg^-1/2."""
    if graph.gcn_norm is None:
        raise GnnflowError("a GCN layer needs a graph built with gcn=True")
    norm = graph.gcn_norm.unsqueeze(1)
    out = norm * aggregate(norm * conv.lin(h), graph.plan, "sum")
    return out + conv.bias if conv.bias is not None else out


_MIX1, _MIX2, _GOLDEN = 0xBF58476D1CE4E5B9 - (1 << 64), 0x94D049BB133111EB - (1 << 64), 0x9E3779B97F4A7C15 - (1 << 64)


def _shift(z: torch.Tensor, bits: int) -> torch.Tensor:
    """Logical right shift of int64 ``z`` (torch shifts signed integers arithmetically)."""
    return (z >> bits) & ((1 << (64 - bits)) - 1)


def node_uniform(ids: torch.Tensor, width: int, key: int) -> torch.Tensor:
    """(n, width) float32 uniforms in [0, 1), a pure function of (key, node id, column): splitmix64
    of the element's position in the whole graph, wrapping as uint64 arithmetic does."""
    salt = (key * _GOLDEN) % (1 << 64)
    salt = salt - (1 << 64) if salt >= 1 << 63 else salt  # as the int64 torch holds
    z = ids.to(torch.int64).unsqueeze(1) * width + torch.arange(width, dtype=torch.int64) + salt
    z = (z ^ _shift(z, 30)) * _MIX1
    z = (z ^ _shift(z, 27)) * _MIX2
    z = z ^ _shift(z, 31)
    return _shift(z, 40).to(torch.float32) / float(1 << 24)


def _dropout(encoder: nn.Module, h: torch.Tensor, graph: FullGraph, key: int | None, layer: int) -> torch.Tensor:
    p = encoder.dropout.p
    if not encoder.training or p == 0:
        return h
    if key is None:
        return encoder.dropout(h)
    # A node's mask depends on its id, not on which worker holds it: 1 and N workers drop the same units.
    keep = node_uniform(graph.ids, h.shape[1], key * 1_000_003 + layer) >= p
    return h * keep / (1 - p)


def encode(encoder: nn.Module, graph: FullGraph, x: torch.Tensor, dropout_key: int | None = None) -> torch.Tensor:
    """(n, in_dim) features of this worker's nodes → (n, hidden) embeddings; collective.

    Dropout follows ``encoder.training``; with ``dropout_key`` its masks are drawn per node id
    from that key (the same on every worker count), otherwise from torch's generator.
    """
    from torch_geometric.nn import SAGEConv

    h = x
    last = len(encoder.convs) - 1
    for i, conv in enumerate(encoder.convs):
        h = _sage(conv, h, graph) if isinstance(conv, SAGEConv) else _gcn(conv, h, graph)
        if i < last:
            h = _dropout(encoder, encoder.act(h), graph, dropout_key, i)
    return h


def uses_gcn(encoder: nn.Module) -> bool:
    """Whether ``encoder``'s layers need the GCN-normalised graph."""
    from torch_geometric.nn import GCNConv

    return any(isinstance(conv, GCNConv) for conv in encoder.convs)
