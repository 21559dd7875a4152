"""Heterogeneous node classification end to end: the papers/authors demo graph through preprocess,
serialize, partition (2 workers) and train (2 workers, GLT sampling, HeteroConv GraphSAGE)."""

from __future__ import annotations

import json
import pathlib

import pytest

from components import storage
from components.config import GnnflowConfig
from components.hetero_demo_graph import generate_hetero_demo_graph, write_hetero_demo_graph
from components.partition.step import partition
from components.preprocess.step import preprocess
from components.serialize.step import read_graph_metadata, serialize
from components.train.step import train

WORLD_SIZE = 2
NUM_CLASSES = 4


def hetero_config(tables: dict[str, pathlib.Path], *, writes_undirected: bool = False, epochs: int = 10) -> dict:
    """The run config of the papers/authors graph, as a YAML file would hold it."""
    return {
        "graph": {
            "nodes": [
                {
                    "type": "paper", "uri": str(tables["papers"]), "id_column": "paper_id", "label_column": "label",
                    "features": [{"columns": ["w*"], "transform": "passthrough"}],
                },
                {
                    "type": "author", "uri": str(tables["authors"]), "id_column": "author_id",
                    "features": [
                        {"columns": ["h_index"], "transform": "standardize"},
                        {"columns": ["field"], "transform": "one_hot"},
                    ],
                },
            ],
            "edges": [
                {"type": "cites", "uri": str(tables["cites"]), "src_type": "paper", "dst_type": "paper", "undirected": True},
                {
                    "type": "writes", "uri": str(tables["writes"]), "src_column": "author_id", "dst_column": "paper_id",
                    "src_type": "author", "dst_type": "paper", "undirected": writes_undirected,
                },
            ],
        },
        "task": {"type": "node_classification", "target": "paper"},
        "serialize": {"num_shards": 2},
        "resources": {"world_size": WORLD_SIZE},
        "model": {"hidden_channels": 32, "num_layers": 2, "dropout": 0.2},
        "training": {"epochs": epochs, "batch_size": 128, "fan_outs": [10, 5], "early_stopping_patience": None, "seed": 0},
        "output": {"root": "unused"},
    }


@pytest.fixture(scope="module")
def demo_tables(tmp_path_factory: pytest.TempPathFactory) -> dict[str, pathlib.Path]:
    return write_hetero_demo_graph(generate_hetero_demo_graph(seed=0), tmp_path_factory.mktemp("tables"))


def run_pipeline(config: GnnflowConfig, root: pathlib.Path) -> tuple[dict, int]:
    """preprocess → serialize → partition → train; (metrics.json of the model, test papers)."""
    preprocess(config, root / "pre")
    serialized = serialize(config, root / "pre", root / "tfr")
    test_papers = read_graph_metadata(serialized).node_types["paper"].split_sizes["test"]
    partition(root / "tfr", root / "parts", config.partition, world_size=WORLD_SIZE)
    published = train(config, root / "parts", root / "model")
    assert published is not None
    metrics = json.loads(storage.read_text(published.uri("metrics.json")))
    return metrics, test_papers


@pytest.mark.parametrize("writes_undirected", [False, True], ids=["writes-directed", "writes-undirected"])
def test_heterogeneous_node_classification(demo_tables, tmp_path: pathlib.Path, writes_undirected: bool) -> None:
    config = GnnflowConfig.model_validate(hetero_config(demo_tables, writes_undirected=writes_undirected))
    metrics, test_papers = run_pipeline(config, tmp_path)
    assert metrics["epochs_run"] == 10
    assert metrics["test_count"] == test_papers > 0
    # Chance is about 0.33 (the largest class); the words alone give about 0.4.
    assert metrics["test_accuracy"] > 0.5, metrics
