"""``training.weight_decay_scope``: weight decay on every dense parameter, or only on the layers that
read each node type's input (the GCN and APPNP papers' recipe)."""

from __future__ import annotations

import pytest
import torch

from components.config import ModelSpec, TrainingSpec
from components.gnn.model import NodeClassifier, NodeInput, build_encoder
from components.gnn.propagation import build_propagation_encoder
from components.train.optimizer import decayed_parameters, dense_optimizer

CITES = ("paper", "cites", "paper")
WRITES = ("author", "writes", "paper")
WRITTEN = ("paper", "rev_writes", "author")


def _classifier(model_type: str, typed: bool = False) -> NodeClassifier:
    spec = ModelSpec(type=model_type, hidden_channels=8, num_layers=2)  # type: ignore[arg-type]
    inputs = {"paper": NodeInput(feature_dim=5, count=30)}
    edges = [CITES]
    if typed:  # a featureless author type with a replicated embedding, and a second relation
        inputs["author"] = NodeInput(feature_dim=0, count=12)
        edges = [CITES, WRITES, WRITTEN]
    propagation = model_type in ("appnp", "gcnii")
    encoder = build_propagation_encoder(spec, inputs, edges) if propagation else build_encoder(spec, inputs, edges, {})
    return NodeClassifier(encoder, 8, 3, "paper")


# Per model, the names of the parameters the input_layer scope decays: the first layer reading each
# type's features, and the replicated embedding of a featureless type.
INPUT_LAYERS = {
    ("graphsage", False): {"encoder.convs.0.lin_l.weight", "encoder.convs.0.lin_l.bias", "encoder.convs.0.lin_r.weight"},
    ("gcn", False): {"encoder.convs.0.lin.weight", "encoder.convs.0.bias"},
    ("gat", False): {"encoder.project.paper.weight", "encoder.project.paper.bias"},
    ("appnp", False): {"encoder.lins.0.weight", "encoder.lins.0.bias"},
    ("gcnii", False): {"encoder.lin.weight", "encoder.lin.bias"},
    ("appnp", True): {"encoder.project.paper.lins.0.weight", "encoder.project.paper.lins.0.bias", "encoder.embedding.author.weight"},
    ("gcnii", True): {"encoder.project.paper.lin.weight", "encoder.project.paper.lin.bias", "encoder.embedding.author.weight"},
    ("graphsage", True): {"encoder.project.paper.weight", "encoder.project.paper.bias", "encoder.embedding.author.weight"},
}


@pytest.mark.parametrize(("model_type", "typed"), list(INPUT_LAYERS))
def test_the_input_layer_scope_names_each_types_first_layer(model_type, typed):
    model = _classifier(model_type, typed)
    names = {id(p): n for n, p in model.named_parameters()}
    assert {names[id(p)] for p in decayed_parameters(model, "input_layer")} == INPUT_LAYERS[(model_type, typed)]
    assert len(decayed_parameters(model, "all")) == len(names)


@pytest.mark.parametrize("scope", ["all", "input_layer"])
def test_a_step_without_gradients_decays_only_the_scope(scope):
    """With every gradient zero, Adam's step moves exactly the decayed parameters (towards zero)."""
    torch.manual_seed(0)
    model = _classifier("appnp")
    optimizer = dense_optimizer(model, TrainingSpec(weight_decay=0.05, weight_decay_scope=scope, learning_rate=0.01))
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    for p in model.parameters():
        p.grad = torch.zeros_like(p)
    optimizer.step()
    moved = {n for n, p in model.named_parameters() if not torch.equal(p.detach(), before[n])}
    expected = set(before) if scope == "all" else INPUT_LAYERS[("appnp", False)]
    assert moved == expected
    for n in moved:
        assert model.get_parameter(n).detach().abs().sum() < before[n].abs().sum()  # decay shrinks
    # One group with the configured decay, and (input_layer) one without: what a checkpoint's optimizer state holds.
    assert [g["weight_decay"] for g in optimizer.param_groups] == ([0.05] if scope == "all" else [0.05, 0.0])


def test_an_unknown_scope_is_refused_by_the_config():
    with pytest.raises(ValueError, match="weight_decay_scope"):
        TrainingSpec(weight_decay_scope="first")  # type: ignore[arg-type]
