"""Small graphs built once per test session and shared by the modules that train on them."""

from __future__ import annotations

import io
import json
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow.parquet as pq
import torch
import yaml

from components import storage
from components.config import GnnflowConfig, parse_config
from components.demo.graph import generate_demo_graph, write_demo_graph
from components.partition.output import hash_owner, read_partition
from components.partition.step import partition
from components.preprocess.step import preprocess
from components.serialize.step import serialize

DEMO_NODES = 400


def with_updates(raw: dict, **sections: dict) -> GnnflowConfig:
    """``raw`` with each given section's keys replaced, parsed."""
    merged = json.loads(json.dumps(raw))
    for name, values in sections.items():
        merged[name] = {**merged.get(name, {}), **values}
    return parse_config(yaml.safe_dump(merged), "test config")


def build_one_sided_validation(root: Path) -> tuple[dict, storage.Uri, int]:
    """The demo graph (400 nodes, 5 classes) with a split column whose validation nodes all lie
    in partition 0 of 2, so the two workers have different numbers of seeds: (raw config,
    partitions, labelled validation nodes)."""
    demo = generate_demo_graph(DEMO_NODES, seed=3)
    # Preprocessing numbers nodes in table order, and the partitioner places id i by hash_owner.
    owner = hash_owner(torch.arange(DEMO_NODES), 2, seed=0).numpy()
    draw = np.random.default_rng(0).random(DEMO_NODES)
    split = np.where(draw < 0.6, "train", np.where(draw < 0.8, "test", np.where(owner == 0, "val", "train")))
    nodes_file, edges_file = write_demo_graph(type(demo)(demo.nodes.assign(split=split), demo.edges), root / "tables")
    raw = {
        "graph": {
            "nodes": [
                {
                    "type": "paper",
                    "uri": str(nodes_file),
                    "label_column": "label",
                    "split_column": "split",
                    "features": [{"columns": ["w*"]}],
                }
            ],
            "edges": [{"type": "cites", "uri": str(edges_file), "src_type": "paper", "dst_type": "paper"}],
        },
        "partition": {"seed": 0},
        "resources": {"world_size": 2},
        "training": {"epochs": 5, "batch_size": 64, "early_stopping_patience": None},
    }
    config = with_updates(raw)
    preprocess(config, root / "pre")
    serialize(config, root / "pre", root / "tfr")
    published = partition(root / "tfr", root / "parts", config.partition, world_size=2)
    val_code = 1
    held = [int((read_partition(published, i).nodes["paper"]["split"] == val_code).sum()) for i in range(2)]
    assert held[0] > 0 and held[1] == 0, f"validation nodes per partition: {held}"
    labelled_val = int(((split == "val") & demo.nodes["label"].notna().to_numpy()).sum())
    return raw, published.root, labelled_val


def demo_chance(num_nodes: int) -> float:
    """The largest class's share of the demo graph of ``num_nodes`` (default seed): the accuracy of
    always answering that class. Demo runs are scored against twice this."""
    labels = generate_demo_graph(num_nodes).nodes["label"].dropna()
    return float(labels.value_counts(normalize=True).max())


def write_wide_graph(root: Path) -> dict:
    """Writes a graph whose 3,000 nodes carry 3,200 float features each (about 37 MiB of them,
    small on disk) and 12,000 random edges under ``root``; returns its ``graph`` config section.
    Two workers holding its whole feature table need more than a container's 64 MiB /dev/shm."""
    import pandas as pd

    rng = np.random.default_rng(0)
    nodes, width = 3000, 3200
    table = pd.DataFrame(rng.random((nodes, width), dtype=np.float32), columns=[f"f{i}" for i in range(width)])
    table.insert(0, "id", np.arange(nodes))
    table.insert(1, "label", rng.integers(0, 3, nodes).astype(str))
    table.to_parquet(root / "nodes.parquet")
    pd.DataFrame({"src": rng.integers(0, nodes, 4 * nodes), "dst": rng.integers(0, nodes, 4 * nodes)}).to_parquet(root / "edges.parquet")
    node = {"type": "item", "uri": str(root / "nodes.parquet"), "id_column": "id", "label_column": "label"}
    node["features"] = [{"columns": ["f*"], "transform": "passthrough"}]
    return {"nodes": [node], "edges": [{"type": "link", "uri": str(root / "edges.parquet"), "src_type": "item", "dst_type": "item"}]}


def papers_authors_graph(tables: dict[str, Path]) -> dict:
    """The ``graph`` section of the heterogeneous demo tables (components/demo/hetero_graph.py):
    papers with their word columns and labels, featureless authors, ``cites`` and ``writes`` undirected."""
    return {
        "nodes": [
            {
                "type": "paper",
                "uri": str(tables["papers"]),
                "id_column": "paper_id",
                "label_column": "label",
                "features": [{"columns": ["w*"]}],
            },
            {"type": "author", "uri": str(tables["authors"]), "id_column": "author_id"},  # featureless
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
                "undirected": True,
            },
        ],
    }


def read_shards(published: storage.PublishedOutput, node_type: str) -> pd.DataFrame:
    """Every row infer wrote for ``node_type``, from all its shards."""
    files = published.files_under(f"embeddings/{node_type}")
    return pd.concat([pq.read_table(io.BytesIO(published.read_bytes(f))).to_pandas() for f in files], ignore_index=True)
