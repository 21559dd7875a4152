"""Layer trimming of sampled homogeneous batches (components/gnn/hop_trimming.py): which nodes and
edges each layer reads, the batches it leaves untrimmed, and seeds' encodings equal to the plain
forward's on batches of GLT's own sampler, including one whose sampling stopped a hop early."""

from __future__ import annotations

import pytest
import torch
from torch_geometric.data import Data

from components.config import ModelSpec
from components.gnn.hop_trimming import LayerSlice, layer_slices
from components.gnn.model import HomogeneousSAGE


def _batch(nodes: list[int], edges: list[int], extra_nodes: int = 0) -> Data:
    n, e = sum(nodes) + extra_nodes, sum(edges)
    data = Data(x=torch.zeros(n, 1), edge_index=torch.zeros(2, e, dtype=torch.int64))
    data.num_sampled_nodes, data.num_sampled_edges = nodes, edges
    return data


def test_each_layer_reads_the_hops_its_outputs_need():
    # seeds 4, hop one 10 new nodes over 12 edges, hop two 30 over 40
    assert layer_slices(_batch([4, 10, 30], [12, 40]), 2) == [
        LayerSlice(sources=44, targets=14, edges=52),
        LayerSlice(sources=14, targets=4, edges=12),
    ]
    three = layer_slices(_batch([4, 10, 30, 50], [12, 40, 70]), 3)
    assert three == [LayerSlice(94, 44, 122), LayerSlice(44, 14, 52), LayerSlice(14, 4, 12)]


def test_a_batch_that_stopped_early_has_empty_last_hops():
    # no seed had a neighbour: the seeds alone (glt_compat's fix 6), or a first hop that found nothing new after it
    assert layer_slices(_batch([4], []), 2) == [LayerSlice(4, 4, 0), LayerSlice(4, 4, 0)]
    assert layer_slices(_batch([4, 3], [5]), 2) == [LayerSlice(7, 7, 5), LayerSlice(7, 4, 5)]


def test_batches_that_do_not_say_their_hops_are_not_trimmed():
    assert layer_slices(Data(x=torch.zeros(3, 1), edge_index=torch.zeros(2, 2, dtype=torch.int64)), 2) is None
    assert layer_slices(_batch([4, 10], [12], extra_nodes=1), 2) is None  # counts that do not add up to the tensors
    assert layer_slices(_batch([4, 10], [12, 3]), 2) is None
    hetero = _batch([4, 10], [12])
    hetero.num_sampled_nodes = {"item": [4, 10]}
    assert layer_slices(hetero, 2) is None


def _glt_batch(edge_index: torch.Tensor, num_nodes: int, seeds: torch.Tensor, fan_outs: list[int], width: int) -> Data:
    import graphlearn_torch as glt
    from graphlearn_torch.sampler import NeighborSampler, NodeSamplerInput

    graph = glt.data.Graph(glt.data.Topology(edge_index, layout="CSR", input_layout="COO"), "CPU")
    out = NeighborSampler(graph, fan_outs).sample_from_nodes(NodeSamplerInput(seeds))
    data = Data(x=torch.randn(len(out.node), width), edge_index=torch.stack([out.row, out.col]))
    data.num_sampled_nodes, data.num_sampled_edges = list(out.num_sampled_nodes), list(out.num_sampled_edges)
    return data


@pytest.mark.parametrize("aggregation", ["mean", "max", "sum"])
@pytest.mark.parametrize("layers", [2, 3])
def test_trimmed_encoding_equals_the_plain_forward_at_the_seeds(aggregation, layers):
    torch.manual_seed(0)
    n = 2_000
    src, dst = torch.randint(0, n, (2, 8_000))
    batch = _glt_batch(torch.cat([torch.stack([src, dst]), torch.stack([dst, src])], 1), n, torch.arange(64), [6, 4, 3][:layers], 12)
    assert len(batch.num_sampled_nodes) == layers + 1 and batch.num_sampled_nodes[-1] > 5 * batch.num_sampled_nodes[0]
    encoder = HomogeneousSAGE("item", 12, ModelSpec(hidden_channels=16, num_layers=layers, aggregation=aggregation, dropout=0.5))
    encoder.eval()
    with torch.no_grad():
        plain = encoder(batch.x, batch.edge_index)[:64]
        trimmed = encoder.encode_batch(batch)["item"]
    assert trimmed.shape == (64, 16)
    torch.testing.assert_close(trimmed, plain, rtol=1e-5, atol=1e-5)
    encoder.train()  # and gradients reach every parameter (DDP runs without find_unused_parameters)
    encoder.encode_batch(batch)["item"].sum().backward()
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in encoder.parameters())


def test_a_batch_whose_sampling_stopped_a_hop_early_encodes_like_the_plain_forward():
    # a triangle and a pair, apart: hop one reaches every node, hop two adds none
    edges = torch.tensor([[0, 1, 1, 2, 2, 0, 3, 4], [1, 0, 2, 1, 0, 2, 4, 3]])
    batch = _glt_batch(edges, 5, torch.tensor([0, 3]), [5, 5], 4)
    assert batch.num_sampled_nodes == [2, 3, 0]
    torch.manual_seed(1)
    encoder = HomogeneousSAGE("item", 4, ModelSpec(hidden_channels=8, num_layers=2)).eval()
    with torch.no_grad():
        plain = encoder(batch.x, batch.edge_index)[:2]
        torch.testing.assert_close(encoder.encode_batch(batch)["item"], plain)
        # GLT's distributed sampler ends at a hop that draws no neighbour, listing fewer hops: here, the first
        first = batch.num_sampled_edges[0]
        short = Data(x=batch.x, edge_index=batch.edge_index[:, :first])
        short.num_sampled_nodes, short.num_sampled_edges = [2, 3], [first]
        torch.testing.assert_close(encoder.encode_batch(short)["item"], encoder(short.x, short.edge_index)[:2])


def _glt_hetero_batch(fan_outs: list[int]):
    """Papers citing papers and written by authors (featureless): GLT's own heterogeneous sampler
    from 32 paper seeds, out-edges, as GLT's loaders hand batches to the model."""
    import graphlearn_torch as glt
    from graphlearn_torch.loader.transform import to_hetero_data
    from graphlearn_torch.sampler import NeighborSampler, NodeSamplerInput

    torch.manual_seed(0)
    papers, authors = 600, 300
    cites = torch.randint(0, papers, (2, 3_000))
    writes = torch.stack([torch.randint(0, papers, (1_500,)), torch.randint(0, authors, (1_500,))])
    types = {("paper", "cites", "paper"): cites, ("paper", "written_by", "author"): writes, ("author", "wrote", "paper"): writes.flip(0)}
    graphs = {e: glt.data.Graph(glt.data.Topology(v, layout="CSR", input_layout="COO"), "CPU") for e, v in types.items()}
    sampler = NeighborSampler(graphs, {e: fan_outs for e in types}, edge_dir="out")
    out = sampler.sample_from_nodes(NodeSamplerInput(torch.arange(32), "paper"))
    data = to_hetero_data(out, edge_dir="out")
    data["paper"].x = torch.randn(data["paper"].node.numel(), 6)
    for edge_type in data.edge_types:
        data[edge_type].edge_attr = torch.randn(data[edge_type].edge_index.size(1), 3)
    return data


@pytest.mark.parametrize("model_type", ["graphsage", "gat", "rgcn"])
def test_heterogeneous_trimmed_encoding_equals_the_plain_forward_at_the_seeds(model_type):
    from components.gnn.hop_trimming import typed_layer_slices
    from components.gnn.model import HeteroEncoder, NodeInput

    batch = _glt_hetero_batch([4, 3])
    slices = typed_layer_slices(batch, 2)
    assert slices is not None and slices[1].targets["paper"] == 32 and slices[1].targets["author"] == 0
    assert slices[0].sources == {t: batch[t].node.numel() for t in batch.node_types}  # layer 0 reads every node
    inputs = {"paper": NodeInput(6, 600), "author": NodeInput(0, 300)}
    edge_dims = {e: 3 for e in batch.edge_types} if model_type == "gat" else {}
    spec = ModelSpec(type=model_type, hidden_channels=8, num_layers=2, attention_heads=2 if model_type == "gat" else 1, dropout=0.3)
    torch.manual_seed(2)
    encoder = HeteroEncoder(inputs, list(batch.edge_types), spec, edge_dims).eval()
    stores = {t: batch[t].node for t in batch.node_types}
    attrs = {e: batch[e].edge_attr for e in batch.edge_types} if model_type == "gat" else None
    if model_type != "gat":
        for edge_type in batch.edge_types:
            del batch[edge_type].edge_attr
    with torch.no_grad():
        plain = encoder({"paper": batch["paper"].x}, batch.edge_index_dict, stores, attrs)["paper"][:32]
        trimmed = encoder.encode_batch(batch)
    assert trimmed["paper"].shape == (32, 8) and trimmed["author"].shape == (0, 8)
    torch.testing.assert_close(trimmed["paper"], plain, rtol=1e-5, atol=1e-5)
