"""Heterogeneous node classification end to end: the papers/authors demo graph through preprocess,
serialize, partition (2 workers) and train (2 workers, GLT sampling, HeteroConv GraphSAGE).

Two variants of the same graph: `writes` (author → paper) directed, as the brief's config has it,
and undirected. Partitions hold edges by source and GLT samples out-edges, handing the model
each sampled edge type under GLT's reversed name (same-type edge types keep theirs), so the
model's edge types must be exactly those; and papers only hear from their authors when some
stored edge type leads from papers to authors.
"""

from __future__ import annotations

import json
import pathlib
from dataclasses import dataclass

import pandas as pd
import pytest

from components import storage
from components.config import GnnflowConfig
from components.demo.hetero_graph import generate_hetero_demo_graph, write_hetero_demo_graph
from components.partition.output import STEP as PARTITION_STEP
from components.partition.step import partition
from components.preprocess.step import preprocess
from components.serialize.step import read_graph_metadata, serialize
from components.train.step import train

pytestmark = pytest.mark.multiworker

WORLD_SIZE = 2
EPOCHS = 15
# A model that learnt from the graph: validation and test accuracy above 1.5 times the largest
# class's share (chance, about 0.33 here). The generator plants classes in the citations and
# the authors; its word columns alone carry little of them.
OVER_CHANCE = 1.5


def hetero_config(tables: dict[str, pathlib.Path], *, writes_undirected: bool = False, epochs: int = EPOCHS) -> dict:
    """The run config of the papers/authors graph, as a YAML file would hold it."""
    return {
        "graph": {
            "nodes": [
                {
                    "type": "paper",
                    "uri": str(tables["papers"]),
                    "id_column": "paper_id",
                    "label_column": "label",
                    "features": [{"columns": ["w*"], "transform": "passthrough"}],
                },
                {
                    "type": "author",
                    "uri": str(tables["authors"]),
                    "id_column": "author_id",
                    "features": [
                        {"columns": ["h_index"], "transform": "standardize"},
                        {"columns": ["field"], "transform": "one_hot"},
                    ],
                },
            ],
            "edges": [
                {"type": "cites", "uri": str(tables["cites"]), "src_type": "paper", "dst_type": "paper", "undirected": True},
                {
                    "type": "writes",
                    "uri": str(tables["writes"]),
                    "src_column": "author_id",
                    "dst_column": "paper_id",
                    "src_type": "author",
                    "dst_type": "paper",
                    "undirected": writes_undirected,
                },
            ],
        },
        "task": {"type": "node_classification", "target": "paper"},
        "serialize": {"num_shards": 2},
        "resources": {"world_size": WORLD_SIZE},
        "model": {"hidden_channels": 32, "num_layers": 2, "dropout": 0.2},
        "training": {"epochs": epochs, "batch_size": 128, "fan_outs": [10, 5], "early_stopping_patience": None, "seed": 0},
    }


@dataclass(frozen=True)
class Partitioned:
    config: GnnflowConfig
    root: pathlib.Path
    writes_undirected: bool
    test_papers: int  # papers in the test split, per the serialized graph's metadata

    @property
    def partitions(self) -> pathlib.Path:
        return self.root / "parts"


@pytest.fixture(scope="module")
def demo_tables(tmp_path_factory: pytest.TempPathFactory) -> dict[str, pathlib.Path]:
    return write_hetero_demo_graph(generate_hetero_demo_graph(seed=0), tmp_path_factory.mktemp("tables"))


@pytest.fixture(scope="module", params=[False, True], ids=["writes-directed", "writes-undirected"])
def partitioned(request: pytest.FixtureRequest, demo_tables, tmp_path_factory: pytest.TempPathFactory) -> Partitioned:
    """preprocess → serialize → partition of one variant, shared by the tests of that variant."""
    writes_undirected = request.param
    config = GnnflowConfig.model_validate(hetero_config(demo_tables, writes_undirected=writes_undirected))
    root = tmp_path_factory.mktemp("undirected" if writes_undirected else "directed")
    preprocess(config, root / "pre")
    serialized = serialize(config, root / "pre", root / "tfr")
    test_papers = read_graph_metadata(serialized).node_types["paper"].split_sizes["test"]
    partition(root / "tfr", root / "parts", config.partition, world_size=WORLD_SIZE)
    return Partitioned(config, root, writes_undirected, test_papers)


def test_model_edge_types_are_the_sampled_edge_types(partitioned: Partitioned) -> None:
    """Every edge type a GLT batch can hold has a convolution in the model (no silent skips)."""
    from graphlearn_torch.typing import reverse_edge_type

    from components.gnn.build import build_model
    from components.gnn.glt_dataset import to_dist_dataset
    from components.partition.output import read_partition

    part = read_partition(storage.open_published(partitioned.partitions, step=PARTITION_STEP), 0)
    edge_dir = "out" if part.metadata.edge_assignment == "src" else "in"
    stored = set(to_dist_dataset(part).graph)
    # GLT's node sampler names out-edge samples by reverse_edge_type (which leaves same-type
    # edge types as they are), in-edge samples by their stored type; either way the batch's
    # edge_index_dict is oriented neighbour → seed, the direction messages flow.
    sampled = {reverse_edge_type(e) for e in stored} if edge_dir == "out" else stored
    model = build_model(part.metadata.schema, partitioned.config, edge_dir)
    for layer in model.encoder.convs:
        assert sampled <= set(layer.convs.keys()), f"batches hold {sorted(sampled)}, the model convolves {sorted(layer.convs.keys())}"
    assert ("paper", "cites", "paper") in sampled
    if partitioned.writes_undirected:
        messages = {(src, dst) for src, _, dst in sampled}
        assert ("author", "paper") in messages, f"undirected writes: no messages from authors to papers in {sorted(sampled)}"
        assert ("paper", "author") in messages, f"undirected writes: no messages from papers to authors in {sorted(sampled)}"


def test_heterogeneous_node_classification(partitioned: Partitioned, demo_tables) -> None:
    published = train(partitioned.config, partitioned.partitions, partitioned.root / "model")
    assert published is not None
    metrics = json.loads(storage.read_text(published.uri("metrics.json")))
    assert metrics["epochs_run"] == EPOCHS
    assert metrics["test_count"] == partitioned.test_papers > 0
    chance = float(pd.read_csv(demo_tables["papers"], usecols=["label"])["label"].value_counts(normalize=True).max())
    assert min(metrics["val_accuracy"], metrics["test_accuracy"]) > OVER_CHANCE * chance, (metrics, chance)
