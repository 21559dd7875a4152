"""``training.feature_cache_ratio``: a worker holds a node type's whole feature table (copied from
its peers once) where the other partitions' rows are few enough, and its batches then carry the
same rows and labels as batches fetched over RPC; faster lookups (``feature_lookup``) return the
rows GLT's own did."""

from __future__ import annotations

import dataclasses

import numpy as np
import pandas as pd
import pytest
import torch
import yaml

from components import storage
from components.config import parse_config
from components.gnn import feature_lookup
from components.gnn.feature_cache import replicable_types
from components.partition.output import read_partition
from components.partition.step import partition
from components.preprocess.step import preprocess
from components.runtime.launcher import launch
from components.serialize.step import serialize
from tests.sampling_workers import feature_batches

pytestmark = pytest.mark.multiworker

NODES = 120
COLUMNS = 5


@pytest.fixture(scope="module")
def partitions(tmp_path_factory) -> str:
    """Two partitions of a random graph whose nodes carry 5 distinct feature columns and a label."""
    root = tmp_path_factory.mktemp("cache")
    rng = np.random.default_rng(3)
    src, dst = rng.integers(0, NODES, (2, 600))
    keep = src != dst
    nodes = pd.DataFrame({"node_id": [f"n{i}" for i in range(NODES)], "label": rng.choice(["a", "b", "c"], NODES)})
    for c in range(COLUMNS):
        nodes[f"f{c}"] = rng.standard_normal(NODES)
    nodes.to_csv(root / "nodes.csv", index=False)
    pd.DataFrame({"src": [f"n{i}" for i in src[keep]], "dst": [f"n{i}" for i in dst[keep]]}).to_csv(root / "edges.csv", index=False)
    graph = {
        "nodes": [{"type": "item", "uri": str(root / "nodes.csv"), "label_column": "label", "features": [{"columns": ["f*"]}]}],
        "edges": [{"type": "link", "uri": str(root / "edges.csv"), "src_type": "item", "dst_type": "item"}],
    }
    config = parse_config(yaml.safe_dump({"graph": graph, "resources": {"world_size": 2}}), "test config")
    preprocess(config, root / "pre")
    serialize(config, root / "pre", root / "tfr")
    return str(partition(root / "tfr", root / "parts", config.partition, world_size=2).root)


def test_whole_tables_only_where_the_remote_rows_fit_the_ratio(partitions):
    part = read_partition(storage.open_published(partitions), 0)
    own, remote = part.metadata.node_counts["item"]
    assert replicable_types(part, remote / own) == ["item"]
    assert replicable_types(part, remote / own - 0.01) == []
    assert replicable_types(part, 0) == []
    row = COLUMNS * 4 + 8  # float32 features and an int64 label
    assert replicable_types(part, 1.5, spare_bytes=remote * row) == ["item"]
    assert replicable_types(part, 1.5, spare_bytes=remote * row - 1) == []  # the copies must fit in memory too
    three = dataclasses.replace(part.metadata, num_partitions=3, node_counts={"item": [40, 40, 40]})
    assert replicable_types(dataclasses.replace(part, metadata=three), 1.5) == []  # 80 remote rows > 1.5 x 40
    assert replicable_types(dataclasses.replace(part, metadata=three), 2.0) == ["item"]


def test_batches_from_whole_tables_carry_the_rows_fetched_over_rpc(partitions):
    results = launch(feature_batches, (partitions, [0.0, 1.5], 16), world_size=2)
    for rank, result in enumerate(results):
        fetched, whole = result["runs"][0.0], result["runs"][1.5]
        assert fetched["whole"] == {} and fetched["book"] == "RangeBook"
        assert whole["whole"] == {"item": NODES} and whole["book"] == "LocalBook"
        assert len(fetched["batches"]) == len(whole["batches"]) >= 3
        remote = 0
        for (nodes, x, y), (nodes_again, x_again, y_again) in zip(fetched["batches"], whole["batches"]):
            np.testing.assert_array_equal(nodes, nodes_again)  # the same draw
            np.testing.assert_array_equal(x, result["features"][nodes])  # the right rows, both ways
            np.testing.assert_array_equal(x_again, result["features"][nodes])
            np.testing.assert_array_equal(y, result["labels"][nodes])
            np.testing.assert_array_equal(y_again, result["labels"][nodes])
            first, end = result["own"]
            remote += int(((nodes < first) | (nodes >= end)).sum())
        assert x.shape[1] == COLUMNS and remote > 50, (rank, remote)  # many rows were the peer's


def test_fast_lookups_return_the_rows_of_glts_own():
    from graphlearn_torch.data.feature import Feature

    feature_lookup.install()
    table = torch.randn(50, 4)
    ids = torch.tensor([7, 0, 49, 7, 13])
    assert torch.equal(Feature(table, with_gpu=False)[ids], table[ids])
    shifted = torch.arange(100, 150)  # GLT's id2index: global id -> row
    id2index = torch.full((150,), -1)
    id2index[shifted] = torch.arange(50)
    assert torch.equal(Feature(table, id2index=id2index, with_gpu=False)[ids + 100], table[ids])
