"""Edge features in message passing: a graph whose labels only the edge features reveal.

Every labelled node has two neighbours, one of each class (their one-hot features say which);
the edge to the neighbour whose class the node takes is marked +1, the other -1. Without the
marks both neighbours look alike to the node, so no model can beat chance (0.5); GATv2 with
``edge_dim`` attends to the marked one.
"""

from __future__ import annotations

import pathlib

import numpy as np
import pandas as pd
import pytest

from components import storage
from components.config import GnnflowConfig
from components.partition.step import partition
from components.preprocess.step import preprocess
from components.serialize.step import serialize
from components.train.step import train

pytestmark = pytest.mark.multiworker

LABELLED, ANCHORS = 1200, 40  # anchors: the unlabelled neighbours that carry a class in their features


def write_marked_graph(folder: pathlib.Path, seed: int = 0) -> dict[str, pathlib.Path]:
    rng = np.random.default_rng(seed)
    anchor_class = np.arange(ANCHORS) % 2
    labelled = pd.DataFrame({"node_id": [f"n{i}" for i in range(LABELLED)], "label": "", "f0": 0.0, "f1": 0.0})
    anchors = pd.DataFrame(
        {
            "node_id": [f"a{i}" for i in range(ANCHORS)],
            "label": "",
            "f0": (anchor_class == 0).astype(float),
            "f1": (anchor_class == 1).astype(float),
        }
    )
    first = rng.choice(np.flatnonzero(anchor_class == 0), LABELLED)
    second = rng.choice(np.flatnonzero(anchor_class == 1), LABELLED)
    marked_first = rng.random(LABELLED) < 0.5
    labelled["label"] = np.where(marked_first, "class_0", "class_1")
    noise = rng.normal(0, 0.1, (2, LABELLED))
    edges = pd.DataFrame(
        {
            "src": np.concatenate([labelled["node_id"], labelled["node_id"]]),
            "dst": np.concatenate([[f"a{i}" for i in first], [f"a{i}" for i in second]]),
            "mark": np.concatenate([np.where(marked_first, 1.0, -1.0) + noise[0], np.where(marked_first, -1.0, 1.0) + noise[1]]),
        }
    )
    folder.mkdir(parents=True, exist_ok=True)
    tables = {"nodes": folder / "nodes.csv", "edges": folder / "edges.csv"}
    pd.concat([labelled, anchors]).to_csv(tables["nodes"], index=False)
    edges.to_csv(tables["edges"], index=False)
    return tables


def marked_config(tables: dict[str, pathlib.Path], *, edge_features: bool) -> GnnflowConfig:
    edge = {"type": "link", "uri": str(tables["edges"])}
    if edge_features:
        edge["features"] = [{"columns": ["mark"], "transform": "passthrough"}]
    return GnnflowConfig.model_validate(
        {
            "graph": {
                "nodes": [
                    {
                        "type": "node",
                        "uri": str(tables["nodes"]),
                        "label_column": "label",
                        "features": [{"columns": ["f0", "f1"], "transform": "passthrough"}],
                    }
                ],
                "edges": [edge],
            },
            "task": {"split": {"train": 0.6, "val": 0.2, "test": 0.2, "seed": 0}},
            "serialize": {"num_shards": 2},
            "resources": {"world_size": 2},
            "model": {"type": "gat", "num_layers": 1, "hidden_channels": 16, "attention_heads": 2, "dropout": 0.0},
            "training": {
                # 40 epochs chose epoch 1 (with edge features: validation accuracy 1.0) and epoch 0
                # (without: nothing to learn): 5 select the same models (training is deterministic).
                "epochs": 5,
                "batch_size": 128,
                "fan_outs": [2],
                "learning_rate": 0.02,
                "weight_decay": 0.0,
                "early_stopping_patience": None,
            },
        }
    )


@pytest.mark.parametrize("edge_features", [True, False], ids=["with-edge-features", "without"])
def test_edge_features_reach_the_model(tmp_path, edge_features):
    tables = write_marked_graph(tmp_path / "tables")
    config = marked_config(tables, edge_features=edge_features)
    root = storage.parse_uri(tmp_path)
    preprocess(config, root.join("pre"))
    serialize(config, root.join("pre"), root.join("tfr"))
    partition(root.join("tfr"), root.join("parts"), config.partition, world_size=2)
    metrics = train(config, root.join("parts"), root.join("model")).read_json("metrics.json")
    assert metrics["test_count"] == pytest.approx(0.2 * LABELLED, abs=40)
    if edge_features:
        assert metrics["test_accuracy"] >= 0.9, metrics
    else:
        assert 0.35 <= metrics["test_accuracy"] <= 0.65, metrics
