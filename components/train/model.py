"""GraphSAGE encoders (homogeneous and heterogeneous) with classification and link heads."""

from __future__ import annotations

import torch
from torch import nn
from torch_geometric.nn import HeteroConv, SAGEConv
from torch_geometric.nn.models import MLP, GraphSAGE

from components.config import ModelSpec

EdgeType = tuple[str, str, str]


class HeteroSAGE(nn.Module):
    """GraphSAGE over typed nodes and edges: one SAGEConv per edge type and layer, summed.

    Input features of each node type are projected to ``hidden`` first, so types with
    different (or no) features share one embedding space.
    """

    def __init__(self, in_dims: dict[str, int], edge_types: list[EdgeType], spec: ModelSpec) -> None:
        super().__init__()
        self.project = nn.ModuleDict({t: nn.Linear(max(d, 1), spec.hidden_channels) for t, d in in_dims.items()})
        self.convs = nn.ModuleList(
            HeteroConv({e: SAGEConv(spec.hidden_channels, spec.hidden_channels, aggr=spec.aggregation) for e in edge_types}, aggr="sum")
            for _ in range(spec.num_layers)
        )
        self.dropout = spec.dropout

    def forward(self, x: dict[str, torch.Tensor], edge_index: dict[EdgeType, torch.Tensor]) -> dict[str, torch.Tensor]:
        """x[type]: (n_type, d_type) → embeddings[type]: (n_type, hidden)."""
        h = {t: self.project[t](v if v.shape[1] else v.new_ones(len(v), 1)) for t, v in x.items()}
        for i, conv in enumerate(self.convs):
            out = conv(h, edge_index)
            h = {t: out.get(t, h[t]) for t in h}  # a type no edge points to keeps its embedding
            if i < len(self.convs) - 1:
                h = {t: nn.functional.dropout(torch.relu(v), self.dropout, self.training) for t, v in h.items()}
        return h


def homogeneous_encoder(in_dim: int, spec: ModelSpec) -> nn.Module:
    """(n, in_dim) features, (2, e) edge_index → (n, hidden) embeddings."""
    return GraphSAGE(in_dim, spec.hidden_channels, spec.num_layers, dropout=spec.dropout, aggr=spec.aggregation)


class NodeClassifier(nn.Module):
    """Encoder + linear head; ``embed`` gives the embeddings that inference writes out."""

    def __init__(self, encoder: nn.Module, hidden: int, num_classes: int, target: str | None = None) -> None:
        super().__init__()
        self.encoder, self.head, self.target = encoder, nn.Linear(hidden, num_classes), target

    def embed(self, x, edge_index) -> torch.Tensor:
        h = self.encoder(x, edge_index)
        return h[self.target] if self.target is not None else h

    def forward(self, x, edge_index) -> torch.Tensor:
        """Logits (n_target, num_classes)."""
        return self.head(torch.relu(self.embed(x, edge_index)))


class LinkPredictor(nn.Module):
    """Encoder + edge scorer: dot product of the two embeddings, or an MLP of their product."""

    def __init__(self, encoder: nn.Module, hidden: int, decoder: str) -> None:
        super().__init__()
        self.encoder = encoder
        self.mlp = MLP([hidden, hidden, 1], dropout=0.0) if decoder == "mlp" else None

    def embed(self, x, edge_index) -> torch.Tensor:
        return self.encoder(x, edge_index)

    def score(self, z: torch.Tensor, pairs: torch.Tensor) -> torch.Tensor:
        """z: (n, hidden); pairs: (2, m) local indices → logits (m,)."""
        a, b = z[pairs[0]], z[pairs[1]]
        return self.mlp(a * b).squeeze(-1) if self.mlp is not None else (a * b).sum(-1)

    def forward(self, x, edge_index, pairs: torch.Tensor) -> torch.Tensor:
        return self.score(self.embed(x, edge_index), pairs)
