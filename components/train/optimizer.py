"""The dense parameters' optimizer: Adam, with weight decay on what ``training.weight_decay_scope`` names."""

from __future__ import annotations

import torch
from torch import nn

from components.config import TrainingSpec
from components.errors import GnnflowError


def decayed_parameters(model: nn.Module, scope: str) -> list[nn.Parameter]:
    """The parameters weight decay applies to: all of them, or those of the encoder's input layers
    (``model.encoder.input_layers()``: each node type's first layer and replicated embeddings)."""
    if scope == "all":
        return list(model.parameters())
    encoder = getattr(model, "encoder", None)
    if encoder is None or not hasattr(encoder, "input_layers"):
        raise GnnflowError(f"training.weight_decay_scope {scope}: {type(model).__name__} names no input layers")
    return [p for layer in encoder.input_layers() for p in layer.parameters()]


def dense_optimizer(model: nn.Module, training: TrainingSpec) -> torch.optim.Adam:
    """Adam over every parameter of ``model``, in two groups: decayed, and (scope input_layer) the rest undecayed."""
    decayed = decayed_parameters(model, training.weight_decay_scope)
    chosen = {id(p) for p in decayed}
    rest = [p for p in model.parameters() if id(p) not in chosen]
    groups = [{"params": decayed, "weight_decay": training.weight_decay}]
    if rest:
        groups.append({"params": rest, "weight_decay": 0.0})
    return torch.optim.Adam(groups, lr=training.learning_rate)
