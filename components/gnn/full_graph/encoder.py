"""The GraphSAGE and GCN stacks of :mod:`components.gnn.model`, run over the whole graph: the
same modules and weights as sampled training (a model trained either way serves both), each
convolution recomputed here from its own parameters with sequential aggregation. APPNP and GCNII
(:mod:`components.gnn.propagation`) run in :mod:`.propagation`."""

from __future__ import annotations

import torch
from torch import nn

from components.errors import GnnflowError
from components.gnn.full_graph.aggregate import aggregate
from components.gnn.full_graph.graph import FullGraph
from components.gnn.full_graph.node_dropout import node_dropout
from components.gnn.full_graph.propagation import describe, encode_propagation
from components.gnn.full_graph.sparse_input import SparseFeatures, linear
from components.gnn.propagation import APPNPEncoder, GCNIIEncoder, PropagationEncoder


def check_encoder(encoder: nn.Module) -> None:
    """A GnnflowError unless ``encoder`` is a plain PyG GraphSAGE or GCN stack (conv, then
    activation and dropout between layers), the only ones rebuilt here: anything else (jumping
    knowledge, norms, a final linear layer, projected or normalised SAGE) would be silently wrong."""
    from torch_geometric.nn import GCNConv, SAGEConv
    from torch_geometric.nn.models import GCN, GraphSAGE

    if isinstance(encoder, (APPNPEncoder, GCNIIEncoder)):
        return
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
            f"full-graph message passing supports the plain GraphSAGE and GCN encoders and APPNP and GCNII (model.type "
            f"graphsage, gcn, appnp or gcnii on a homogeneous graph with node features); this model's is {type(encoder).__name__}"
        )


def _projects_first(conv: nn.Module) -> bool:
    """Whether a SAGEConv applies lin_l before aggregating: sum and mean commute with the linear
    map, so a narrowing layer projects first and fetches narrower rows."""
    return conv.aggr != "max" and conv.lin_l.out_channels < conv.lin_l.in_channels


def _sage(conv: nn.Module, h: torch.Tensor | SparseFeatures, graph: FullGraph) -> torch.Tensor:
    """SAGEConv: lin_l(aggregate of neighbours) + lin_r(self)."""
    lin = conv.lin_l
    if _projects_first(conv):
        out = aggregate(linear(h, lin.weight), graph.plan, conv.aggr)
        out = out + lin.bias if lin.bias is not None else out
    else:
        if isinstance(h, SparseFeatures):
            raise GnnflowError("sparse features need a first layer that projects them first")  # reads_input_linearly said no
        out = lin(aggregate(h, graph.plan, conv.aggr))
    return out + linear(h, conv.lin_r.weight, conv.lin_r.bias) if conv.root_weight else out


def _gcn(conv: nn.Module, h: torch.Tensor | SparseFeatures, graph: FullGraph) -> torch.Tensor:
    """GCNConv: D^-1/2 (A + I) D^-1/2 (h W) + b; each owner scales its rows by its own deg^-1/2."""
    if graph.gcn_norm is None:
        raise GnnflowError("a GCN layer needs a graph built with gcn=True")
    norm = graph.gcn_norm.unsqueeze(1)
    out = norm * aggregate(norm * linear(h, conv.lin.weight, conv.lin.bias), graph.plan, "sum")
    return out + conv.bias if conv.bias is not None else out


def _dropout(encoder: nn.Module, h: torch.Tensor, graph: FullGraph, key: int | None, layer: int) -> torch.Tensor:
    return node_dropout(h, graph.dropout_ids, encoder.dropout.p, encoder.training, key, layer)


def encode(encoder: nn.Module, graph: FullGraph, x: torch.Tensor | SparseFeatures, dropout_key: int | None = None) -> torch.Tensor:
    """(n, in_dim) features of this worker's nodes (dense, or sparse where
    :func:`reads_input_linearly`) → (n, hidden) embeddings; collective.

    Dropout follows ``encoder.training``; with ``dropout_key`` its masks are drawn per node id
    from that key (the same on every worker count), otherwise from torch's generator.
    """
    from torch_geometric.nn import SAGEConv

    if isinstance(encoder, PropagationEncoder):
        return encode_propagation(encoder, graph, x, dropout_key)
    h: torch.Tensor | SparseFeatures = x
    out = torch.empty(0)
    last = len(encoder.convs) - 1
    for i, conv in enumerate(encoder.convs):
        out = _sage(conv, h, graph) if isinstance(conv, SAGEConv) else _gcn(conv, h, graph)
        h = _dropout(encoder, encoder.act(out), graph, dropout_key, i) if i < last else out
    return out


def uses_gcn(encoder: nn.Module) -> bool:
    """Whether ``encoder``'s layers need the GCN-normalised graph."""
    from torch_geometric.nn import GCNConv

    if isinstance(encoder, PropagationEncoder):
        return True
    return any(isinstance(conv, GCNConv) for conv in encoder.convs)


def depth(encoder: nn.Module) -> str:
    """What a log line says of the encoder's depth."""
    return describe(encoder) if isinstance(encoder, PropagationEncoder) else f"{len(encoder.convs)} layers"


def reads_input_linearly(encoder: nn.Module) -> bool:
    """Whether ``encoder``'s first operation on the features is a linear map (then they may be
    :class:`~.sparse_input.SparseFeatures`)."""
    from torch_geometric.nn import SAGEConv

    if isinstance(encoder, PropagationEncoder):
        return True
    first = encoder.convs[0]
    return not isinstance(first, SAGEConv) or _projects_first(first)
