"""Infer with one worker: a one-partition graph smaller than a batch, where every hop after the
first finds no node the batch has not seen (GLT 0.2.4 fails there without glt_compat)."""

from __future__ import annotations

import io

import pandas as pd
import pyarrow.parquet as pq
import pytest

from components.config import apply_overrides
from components.demo.graph import generate_demo_graph, write_demo_graph
from components.infer.step import infer
from components.partition.step import partition
from components.preprocess.step import preprocess
from components.serialize.step import serialize
from components.tables.proposal import propose_config
from components.train.step import train

pytestmark = pytest.mark.multiworker

NUM_NODES = 300


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    root = tmp_path_factory.mktemp("one_worker")
    nodes, edges = write_demo_graph(generate_demo_graph(NUM_NODES), root / "data")
    config = propose_config(
        str(nodes), str(edges), id_column="node_id", src_column="src", dst_column="dst", label_column="label", output_root=str(root)
    )
    config = apply_overrides(config, {"training.epochs": 3, "resources.world_size": 1})
    preprocess(config, root / "pre")
    serialize(config, root / "pre", root / "tfr")
    partition(root / "tfr", root / "parts", config.partition, world_size=1)
    train(config, root / "parts", root / "model")
    return root, config


@pytest.mark.parametrize("mode", ["sampled", "exact"])
def test_one_worker_embeds_every_node_once(trained, mode):
    root, config = trained
    published = infer(config, root / "parts", root / "model", root / f"emb-{mode}", mode=mode)
    table = pd.concat(pq.read_table(io.BytesIO(published.read_bytes(f))).to_pandas() for f in published.files_under("embeddings/node"))
    original = pd.read_csv(root / "data" / "nodes.csv.gz", usecols=["node_id"])["node_id"]
    assert len(table) == NUM_NODES and set(table["node_id"]) == set(original)
    assert table["embedding"].map(len).eq(config.model.hidden_channels).all()
    metrics = published.read_json("metrics.json")
    assert metrics["mode"] == mode and metrics["test_count"] > 0
