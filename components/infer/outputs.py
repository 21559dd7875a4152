"""What inference computes for one worker's nodes, however it was computed."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn


@dataclass(frozen=True)
class NodeOutputs:
    """One node type's results on one worker, rows in the order of ``node_ids``.

    node_ids: (n,) int64 global ids; embeddings: (n, hidden) float32;
    probabilities: (n, num_classes) float32 softmax, only for the classification target.
    """

    node_ids: torch.Tensor
    embeddings: torch.Tensor
    probabilities: torch.Tensor | None = None


def class_probabilities(model: nn.Module, embeddings: torch.Tensor) -> torch.Tensor:
    """(n, hidden) embeddings → (n, num_classes) softmax of a NodeClassifier's head (from
    embeddings already computed, so the encoder does not run twice)."""
    return torch.softmax(model.classify(embeddings), dim=-1)


def concat_outputs(parts: list[NodeOutputs], hidden: int, with_probabilities: bool, num_classes: int) -> NodeOutputs:
    """Batches' outputs as one, ordered by node id (an empty result for no batches)."""
    if not parts:
        empty_probabilities = torch.zeros((0, num_classes)) if with_probabilities else None
        return NodeOutputs(torch.zeros(0, dtype=torch.int64), torch.zeros((0, hidden)), empty_probabilities)
    ids = torch.cat([p.node_ids for p in parts])
    order = torch.argsort(ids)
    probabilities = torch.cat([p.probabilities for p in parts])[order] if with_probabilities else None  # type: ignore[misc]
    return NodeOutputs(ids[order], torch.cat([p.embeddings for p in parts])[order], probabilities)
