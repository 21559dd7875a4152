"""``training.replace``: without replacement (the default) every sampled node's neighbours in a
batch are distinct and number min(k, degree), on its own partition and on the peer's (drawn over
RPC), in the trainer and in sampling subprocesses; reruns draw the same batches bit for bit; with
replacement GLT's own draw still works (and repeats neighbours)."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import torch
import yaml
from torch_geometric.data import Data

from components.config import ModelSpec, parse_config
from components.gnn.distinct_sampling import draw_distinct
from components.gnn.model import HomogeneousSAGE
from components.partition.step import partition
from components.preprocess.step import preprocess
from components.runtime.launcher import launch
from components.serialize.step import serialize
from tests.sampling_workers import draw_epochs

pytestmark = pytest.mark.multiworker

NODES = 160
FAN_OUTS = [4, 3]  # degrees span below k, up to 4k (sorted keys) and beyond (rejection)
BATCH = 16


def spread_graph(seed: int = 0) -> tuple[pd.DataFrame, pd.DataFrame]:
    """40 nodes of degree 1 (each tied to one other node), the rest of degree about 5 to 45;
    every undirected edge once, no self-loops."""
    rng = np.random.default_rng(seed)
    leaves, rest = 40, np.arange(40, NODES)
    pairs = {(leaf, int(rng.choice(rest))) for leaf in range(leaves)}
    for node in rest:
        for other in rng.choice(rest[rest != node], size=int(rng.integers(2, 16)), replace=False):
            pairs.add((min(node, int(other)), max(node, int(other))))
    src, dst = np.array(sorted(pairs)).T
    nodes = pd.DataFrame(
        {
            "node_id": [f"n{i}" for i in range(NODES)],
            "label": rng.choice(["a", "b"], NODES),
            "split": rng.choice(["train", "val"], NODES, p=[0.8, 0.2]),
            "x": rng.standard_normal(NODES),
        }
    )
    return nodes, pd.DataFrame({"src": [f"n{i}" for i in src], "dst": [f"n{i}" for i in dst]})


@pytest.fixture(scope="module")
def partitions(tmp_path_factory) -> str:
    root = tmp_path_factory.mktemp("distinct")
    nodes, edges = spread_graph()
    nodes.to_csv(root / "nodes.csv", index=False)
    edges.to_csv(root / "edges.csv", index=False)
    config = parse_config(
        yaml.safe_dump(
            {
                "graph": {
                    "nodes": [
                        {
                            "type": "item",
                            "uri": str(root / "nodes.csv"),
                            "label_column": "label",
                            "split_column": "split",
                            "features": [{"columns": ["x"]}],
                        }
                    ],
                    "edges": [{"type": "link", "uri": str(root / "edges.csv"), "src_type": "item", "dst_type": "item"}],
                },
                "resources": {"world_size": 2},
            }
        ),
        "test config",
    )
    preprocess(config, root / "pre")
    serialize(config, root / "pre", root / "tfr")
    return str(partition(root / "tfr", root / "parts", config.partition, world_size=2).root)


@pytest.fixture(scope="module")
def first_launch(partitions) -> list[dict]:
    runs = [("collocated", False), ("collocated", True)]
    return launch(draw_epochs, (partitions, FAN_OUTS, BATCH, runs), world_size=2)


def examine(batches: list[dict], degree: np.ndarray, ends: np.ndarray, rank: int) -> dict[str, int]:
    """Per batch: sampled neighbours per source against min(k, degree), repeated (source,
    neighbour) pairs, and the sources whose neighbours the other partition drew."""
    seen = {"batches": 0, "sources": 0, "wrong_count": 0, "repeated": 0, "remote_sources": 0}
    degree, ends = torch.from_numpy(degree), torch.from_numpy(ends)
    for batch in batches:
        node, (nbr, src), seeds = torch.from_numpy(batch["node"]), torch.from_numpy(batch["edge_index"]), batch["batch_size"]
        sources = seeds + batch["hop_one"]  # the seeds, then the nodes the first hop added: the second hop's sources
        fan_out = torch.tensor([FAN_OUTS[0]] * seeds + [FAN_OUTS[1]] * (sources - seeds))
        drawn = torch.bincount(src, minlength=len(node))
        expected = torch.minimum(fan_out, degree[node[:sources]])
        pair = node[nbr] * len(degree) + node[src]
        seen["batches"] += 1
        seen["sources"] += sources
        seen["wrong_count"] += int((drawn[:sources] != expected).sum()) + int(drawn[sources:].sum())
        seen["repeated"] += len(pair) - len(torch.unique(pair))
        owner = torch.searchsorted(ends, node[:sources], right=True)
        seen["remote_sources"] += int(((owner != rank) & (expected > 0)).sum())
    return seen


def test_draw_distinct_counts_and_distinct_positions():
    degree = torch.tensor([0, 1, 3, 4, 5, 9, 16, 17, 60, 250])
    indptr = torch.cat([torch.zeros(1, dtype=torch.int64), degree.cumsum(0)])
    seeds = torch.tensor([9, 0, 3, 8, 7, 1, 6, 5, 4, 2, 10, -1])  # 10 and -1: no such row
    counts, positions = draw_distinct(indptr, seeds, 4, torch.Generator().manual_seed(1))
    assert counts.tolist() == [4, 0, 4, 4, 4, 1, 4, 4, 4, 3, 0, 0]
    owner = torch.repeat_interleave(seeds[counts > 0], counts[counts > 0])
    assert ((positions >= indptr[owner]) & (positions < indptr[owner + 1])).all()
    assert len(torch.unique(positions)) == len(positions)
    again = draw_distinct(indptr, seeds, 4, torch.Generator().manual_seed(1))
    assert torch.equal(again[1], positions)
    assert draw_distinct(indptr, seeds, -1, torch.Generator())[0].tolist() == [250, 0, 4, 60, 17, 1, 16, 9, 5, 3, 0, 0]


def test_without_replacement_neighbours_are_distinct_and_min_k_degree(first_launch):
    for rank, result in enumerate(first_launch):
        seen = examine(result["runs"][("collocated", False)], result["degree"], result["ends"], rank)
        assert seen["batches"] >= 4 and seen["sources"] > 100, seen
        assert seen["wrong_count"] == 0 and seen["repeated"] == 0, seen
        assert seen["remote_sources"] > 20, seen  # neighbours drawn by the peer partition over RPC


def test_with_replacement_still_samples_and_repeats(first_launch):
    for rank, result in enumerate(first_launch):
        seen = examine(result["runs"][("collocated", True)], result["degree"], result["ends"], rank)
        assert seen["wrong_count"] == 0 and seen["remote_sources"] > 20, seen
        assert seen["repeated"] > 0, seen  # k independent draws from a few neighbours repeat some


def test_reruns_are_bit_identical_and_subprocesses_draw_distinct(partitions, first_launch):
    second = launch(draw_epochs, (partitions, FAN_OUTS, BATCH, [("collocated", False), ("multiprocess", False)]), world_size=2)
    for rank, (one, two) in enumerate(zip(first_launch, second)):
        before, after = one["runs"][("collocated", False)], two["runs"][("collocated", False)]
        assert len(before) == len(after)
        assert all(np.array_equal(a["node"], b["node"]) and np.array_equal(a["edge_index"], b["edge_index"]) for a, b in zip(before, after))
        seen = examine(two["runs"][("multiprocess", False)], two["degree"], two["ends"], rank)
        assert seen["wrong_count"] == 0 and seen["repeated"] == 0 and seen["remote_sources"] > 20, seen


@pytest.mark.parametrize("aggregation", ["mean", "max"])
def test_batches_list_their_hops_in_order_and_trimmed_encoding_matches_the_plain_one(first_launch, aggregation):
    """What layer trimming (components/gnn/hop_trimming.py) relies on, checked on real two-worker
    batches: nodes hop by hop, hop h's edges from hops <= h into hop h-1; and the seeds' encodings
    the trimmed forward gives equal the plain forward's."""
    torch.manual_seed(0)
    encoder = HomogeneousSAGE("item", 8, ModelSpec(hidden_channels=16, num_layers=2, aggregation=aggregation)).eval()
    checked = 0
    for result in first_launch:
        for run in result["runs"].values():
            for batch in run:
                nodes, edges = batch["nodes_per_hop"], batch["edges_per_hop"]
                assert nodes[0] == batch["batch_size"] and sum(nodes) == len(batch["node"]) and len(edges) == len(nodes) - 1
                node_ends, edge_ends = np.cumsum([0, *nodes]), np.cumsum([0, *edges])
                src, dst = batch["edge_index"]
                for hop in range(1, len(nodes)):
                    block = slice(edge_ends[hop - 1], edge_ends[hop])
                    assert ((dst[block] >= node_ends[hop - 1]) & (dst[block] < node_ends[hop])).all()
                    assert (src[block] < node_ends[hop + 1]).all()
                data = Data(x=torch.randn(len(batch["node"]), 8), edge_index=torch.from_numpy(batch["edge_index"]))
                data.num_sampled_nodes, data.num_sampled_edges = nodes, edges
                with torch.no_grad():
                    plain = encoder(data.x, data.edge_index)[: nodes[0]]
                    trimmed = encoder.encode_batch(data)["item"]
                assert trimmed.shape == (nodes[0], 16)
                torch.testing.assert_close(trimmed, plain, rtol=1e-5, atol=1e-5)
                checked += 1
    assert checked >= 16
