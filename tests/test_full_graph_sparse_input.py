"""Sparse features in full-graph passes (components/gnn/full_graph/sparse_input.py): mostly-zero
features kept as CSR give the dense pass's embeddings and gradients, with the same dropout masks,
for every encoder whose first layer maps them linearly; the others keep them dense."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from components.config import ModelSpec
from components.gnn.full_graph.encoder import encode, reads_input_linearly, uses_gcn
from components.gnn.full_graph.graph import aggregation_edges, build_full_graph
from components.gnn.full_graph.node_dropout import node_dropout
from components.gnn.full_graph.sparse_input import SparseFeatures, input_dropout, linear, sparse_features
from tests.full_graph_workers import classifier

N, WIDTH, CLASSES = 60, 300, 3
SPECS = {
    "sage_mean": ModelSpec(type="graphsage", aggregation="mean", hidden_channels=8, num_layers=2, dropout=0.5),
    "gcn": ModelSpec(type="gcn", hidden_channels=8, num_layers=2, dropout=0.5),
    "appnp": ModelSpec(type="appnp", hidden_channels=8, num_layers=2, propagation_steps=4, dropout=0.5),
    "gcnii": ModelSpec(type="gcnii", hidden_channels=8, num_layers=3, dropout=0.5),
}


def bag_of_words(seed: int) -> torch.Tensor:
    """(N, WIDTH) binary features, about 2% non-zero, every row with at least one."""
    g = torch.Generator().manual_seed(seed)
    x = (torch.rand(N, WIDTH, generator=g) < 0.02).float()
    x[torch.arange(N), torch.randint(0, WIDTH, (N,), generator=g)] = 1.0
    return x


def one_worker_graph(gcn: bool):
    g = torch.Generator().manual_seed(3)
    src, dst = torch.randint(0, N, (2, 240), generator=g)
    own = torch.randperm(N, generator=g)  # rows scrambled, as a partition holds them
    edges = aggregation_edges(torch.stack([src, dst]), own, N, "dst")
    return build_full_graph(edges, own, [N], 0, gcn=gcn, block_rows=16), own


def test_sparse_features_keep_the_non_zeros_and_refuse_dense_inputs():
    x = bag_of_words(0)
    sparse = sparse_features(x)
    assert isinstance(sparse, SparseFeatures) and len(sparse.values) == int((x != 0).sum())
    assert torch.equal(sparse.matrix().to_dense(), x) and torch.equal(sparse.transposed().to_dense(), x.t())
    dense = torch.randn(N, 12)
    assert sparse_features(dense) is dense  # every entry non-zero: stays dense


def test_sparse_linear_and_dropout_equal_the_dense_ones():
    x = bag_of_words(1)
    sparse = sparse_features(x)
    assert isinstance(sparse, SparseFeatures)
    ids = torch.arange(1000, 1000 + N)
    dropped = input_dropout(sparse, ids, 0.5, True, key=9, layer=0)
    assert isinstance(dropped, SparseFeatures)
    expected = node_dropout(x, ids, 0.5, True, key=9, layer=0)
    assert torch.equal(dropped.matrix().to_dense(), expected)  # the same units, the same scale
    weight, bias = torch.randn(5, WIDTH, requires_grad=True), torch.randn(5, requires_grad=True)
    out = linear(dropped, weight, bias)
    reference_weight = weight.detach().clone().requires_grad_()
    reference = F.linear(expected, reference_weight, bias.detach())
    assert torch.allclose(out, reference, atol=1e-5)
    grad = torch.randn(N, 5)
    out.backward(grad)
    reference.backward(grad)
    assert weight.grad is not None and torch.allclose(weight.grad, reference_weight.grad, atol=1e-5)


@pytest.mark.parametrize("name", list(SPECS))
def test_a_sparse_full_graph_pass_equals_the_dense_one(name):
    spec = SPECS[name]
    torch.manual_seed(0)
    model = classifier(spec, WIDTH, N, CLASSES)
    assert reads_input_linearly(model.encoder)
    graph, own = one_worker_graph(uses_gcn(model.encoder))
    x = bag_of_words(2)[own]
    y = torch.randint(0, CLASSES, (N,), generator=torch.Generator().manual_seed(4))
    sparse = sparse_features(x)
    assert isinstance(sparse, SparseFeatures)
    results = []
    for features in (x, sparse):
        model.zero_grad()
        model.train()
        logits = model.classify(encode(model.encoder, graph, features, dropout_key=12345))
        F.cross_entropy(logits, y).backward()
        model.eval()
        with torch.no_grad():
            exact = encode(model.encoder, graph, features)
        results.append((logits.detach(), exact, {k: p.grad.clone() for k, p in model.named_parameters() if p.grad is not None}))
    (dense_logits, dense_exact, dense_grads), (sparse_logits, sparse_exact, sparse_grads) = results
    assert torch.allclose(sparse_logits, dense_logits, atol=1e-5) and torch.allclose(sparse_exact, dense_exact, atol=1e-5)
    assert sparse_grads.keys() == dense_grads.keys()
    for key, value in dense_grads.items():
        assert torch.allclose(sparse_grads[key], value, atol=1e-5), key
    assert float(dense_logits.abs().max()) > 0.01  # not a trivially zero pass


def test_max_aggregation_reads_its_features_dense():
    spec = ModelSpec(type="graphsage", aggregation="max", hidden_channels=8, num_layers=2)
    assert not reads_input_linearly(classifier(spec, WIDTH, N, CLASSES).encoder)
