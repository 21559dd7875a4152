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
