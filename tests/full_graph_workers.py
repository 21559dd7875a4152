"""Worker functions for tests/test_full_graph.py: spawned processes must import them by name."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from components.config import ModelSpec
from components.config.steps import PROPAGATION_TYPES
from components.gnn.full_graph.encoder import encode, uses_gcn
from components.gnn.full_graph.graph import aggregation_edges, build_full_graph
from components.gnn.full_graph.node_task import all_reduce_gradients
from components.gnn.model import NodeClassifier, NodeInput, build_encoder
from components.gnn.propagation import build_propagation_encoder
from components.partition.output import range_ends, range_owner
from components.runtime.launcher import WorkerContext

EDGE_TYPE = ("node", "to", "node")


def classifier(spec: ModelSpec, in_dim: int, num_nodes: int, num_classes: int) -> NodeClassifier:
    """The train step's node classifier (PyG's GraphSAGE or GCN stack, or APPNP or GCNII, and a linear head)."""
    inputs = {"node": NodeInput(in_dim, num_nodes)}
    propagates = spec.type in PROPAGATION_TYPES
    encoder = build_propagation_encoder(spec, inputs, [EDGE_TYPE]) if propagates else build_encoder(spec, inputs, [EDGE_TYPE], {})
    return NodeClassifier(encoder, spec.hidden_channels, num_classes, "node")


def random_case(counts: list[int], edge_assignment: str, block_rows: int, specs: dict[str, ModelSpec], seed: int) -> dict:
    """A random directed graph with duplicate edges, self-loops and two isolated nodes; 12
    features, 3 classes, about half the nodes training; each of ``specs`` with fixed weights."""
    g = torch.Generator().manual_seed(seed)
    n, in_dim, num_classes = sum(counts), 12, 3
    src, dst = torch.randint(0, n - 2, (2, 150), generator=g)
    loops = torch.arange(0, n - 2, 7)
    edge_index = torch.cat([torch.stack([src, dst]), torch.stack([src[:10], dst[:10]]), torch.stack([loops, loops])], dim=1)
    models = {}
    for i, (name, spec) in enumerate(specs.items()):
        torch.manual_seed(i)
        models[name] = (spec, classifier(spec, in_dim, n, num_classes).state_dict())
    return {
        "counts": counts,
        "edge_assignment": edge_assignment,
        "block_rows": block_rows,
        "num_classes": num_classes,
        "edge_index": edge_index,
        "x": torch.randn(n, in_dim, generator=g),
        "y": torch.randint(0, num_classes, (n,), generator=g),
        "train": torch.rand(n, generator=g) < 0.5,
        "models": models,
    }


def full_graph_pass(ctx: WorkerContext, case: dict) -> dict:
    """Each worker holds its range of ``case``'s graph (rows scrambled) and the edges its nodes
    aggregate over; per model: embeddings and logits of a training-mode pass, the all-reduced
    parameter gradients of the mean cross-entropy over all training nodes, and eval-mode
    embeddings (what exact inference computes), as numpy arrays."""
    ctx.init_process_group()
    torch.set_num_threads(1)
    counts, edge_index, x, y, train = case["counts"], case["edge_index"], case["x"], case["y"], case["train"]
    num_nodes = sum(counts)
    offset = sum(counts[: ctx.rank])
    own = offset + torch.randperm(counts[ctx.rank], generator=torch.Generator().manual_seed(ctx.rank))
    aggregating = edge_index[0] if case["edge_assignment"] == "src" else edge_index[1]
    held = range_owner(aggregating, range_ends(counts)) == ctx.rank
    edges = aggregation_edges(edge_index[:, held], own, num_nodes, case["edge_assignment"])
    local_train = torch.nonzero(train[own]).reshape(-1)
    results = {}
    for name, (spec, state) in case["models"].items():
        model = classifier(spec, x.shape[1], num_nodes, case["num_classes"])
        model.load_state_dict(state)
        graph = build_full_graph(edges, own, counts, ctx.rank, gcn=uses_gcn(model.encoder), block_rows=case["block_rows"])
        model.train()
        h = encode(model.encoder, graph, x[own])
        logits = model.classify(h)
        loss = F.cross_entropy(logits[local_train], y[own][local_train], reduction="sum") / int(train.sum())
        loss.backward()
        all_reduce_gradients(model)
        model.eval()
        with torch.no_grad():
            exact = encode(model.encoder, graph, x[own])
        # numpy, not tensors: torch would send tensors through shared memory the exiting worker owns.
        results[name] = {
            "ids": own.numpy(),
            "embeddings": h.detach().numpy(),
            "logits": logits.detach().numpy(),
            "exact": exact.numpy(),
            "grads": {k: p.grad.numpy() for k, p in model.named_parameters()},
        }
    return results
