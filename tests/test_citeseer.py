"""CiteSeer through init-config → preprocess → serialize, on local paths and on gs:// (emulator),
read back with plain tf.data + tf.io.parse_example."""

from __future__ import annotations

import io
import pathlib

import numpy as np
import pandas as pd
import pyarrow.parquet as pq
import pytest

from components import storage
from components.config import load_config
from components.preprocess.step import preprocess
from components.serialize.step import read_graph_metadata, serialize
from pipelines.cli import main as gnnflow
from tests.shared_datasets import CITESEER, citeseer_graph, needs_citeseer, require_citeseer  # noqa: F401 - re-exported to the other CiteSeer tests

pytestmark = needs_citeseer


@pytest.fixture(scope="module")
def citeseer_csv() -> pd.DataFrame:
    return pd.read_csv(CITESEER / "nodes.csv.gz", dtype={"node_id": str, "label": str, "split": str})


def read_tfrecords(serialized: storage.PublishedOutput, files: list[str], spec: dict, tmp: pathlib.Path) -> dict[str, np.ndarray]:
    """Parses shards with tf.data (downloading gs:// shards first: TF's own GCS client does not
    know the emulator)."""
    tf = pytest.importorskip("tensorflow")
    local = []
    for rel in files:
        path = tmp / rel
        storage.download_file(serialized.uri(rel), path)
        local.append(str(path))
    features = {k: tf.io.FixedLenFeature([1], tf.int64) for k in spec["int64"]}
    features |= {k: tf.io.FixedLenFeature([d], tf.float32) for k, d in spec["float"].items()}
    parts: dict[str, list[np.ndarray]] = {k: [] for k in features}
    for batch in tf.data.TFRecordDataset(local).batch(1024).map(lambda b: tf.io.parse_example(b, features)):
        for k, v in batch.items():
            parts[k].append(v.numpy())
    return {k: np.concatenate(v) for k, v in parts.items()}


def check_citeseer(serialized: storage.PublishedOutput, csv: pd.DataFrame, tmp: pathlib.Path, row_normalized: bool = False) -> None:
    """The serialized CiteSeer holds every node's words (0/1 as init-config proposes, or divided by
    the row's count of words when ``row_normalized``), label and split, and every edge."""
    meta = read_graph_metadata(serialized)
    node, edge = meta.node_types["node"], meta.edge_types["node__edge__node"]
    assert (node.count, node.feature_dim, node.num_classes) == (3327, 3703, 6)
    assert node.split_sizes == {"train": 120, "val": 500, "test": 1000}
    assert edge.count == 4552 and edge.undirected

    nodes = read_tfrecords(serialized, node.files, meta.record_format["node_types"]["node"], tmp)
    order = np.argsort(nodes["node_id"][:, 0])
    assert nodes["node_id"][order, 0].tolist() == list(range(3327))
    id_map = pd.concat(pq.read_table(_parquet(serialized, f)).to_pandas() for f in node.id_map_files)
    original = id_map.set_index("node_id").loc[nodes["node_id"][order, 0], "original_id"].to_numpy()
    rows = csv.set_index("node_id").loc[original]
    words = rows[[f"f{i}" for i in range(3703)]].to_numpy(np.float64)
    if row_normalized:
        words = words / np.maximum(words.sum(axis=1, keepdims=True), 1.0)
    np.testing.assert_array_equal(nodes["features"][order], words.astype(np.float32))

    labels = nodes["label"][order, 0]
    expected_labels = rows["label"].map({v: i for i, v in enumerate(node.label_vocabulary)}).fillna(-1).astype(int)
    np.testing.assert_array_equal(labels, expected_labels.to_numpy())
    assert int((labels < 0).sum()) == 15
    split = nodes["split"][order, 0]
    assert {s: int((split == c).sum()) for s, c in (("train", 0), ("val", 1), ("test", 2))} == {"train": 120, "val": 500, "test": 1000}
    assert (rows["split"].to_numpy()[split == 0] == "train").all() and (rows["split"].to_numpy()[split == 2] == "test").all()

    edges = read_tfrecords(serialized, edge.files, meta.record_format["edge_types"]["node__edge__node"], tmp)
    assert len(edges["src"]) == 4552
    raw = pd.read_csv(CITESEER / "edges.csv.gz", dtype=str)
    to_int = pd.Series(id_map["node_id"].to_numpy(), index=id_map["original_id"].to_numpy())
    expected_pairs = set(zip(to_int[raw["src"]].to_numpy(), to_int[raw["dst"]].to_numpy()))
    assert set(zip(edges["src"][:, 0], edges["dst"][:, 0])) == expected_pairs


def _parquet(serialized: storage.PublishedOutput, rel: str) -> io.BytesIO:
    return io.BytesIO(storage.read_bytes(serialized.uri(rel)))


def run_citeseer(nodes: str, edges: str, root: str, tmp: pathlib.Path) -> storage.PublishedOutput:
    config_uri = f"{root}/config.yaml"
    assert (
        gnnflow(
            [
                "init-config",
                "--nodes",
                nodes,
                "--edges",
                edges,
                "--id-column",
                "node_id",
                "--src-column",
                "src",
                "--dst-column",
                "dst",
                "--label-column",
                "label",
                "--split-column",
                "split",
                "-o",
                config_uri,
            ]
        )
        == 0
    )
    config = load_config(config_uri)
    assert config.graph.nodes[0].features[0].columns == ["f*"]
    assert config.graph.nodes[0].features[0].transform == "passthrough"
    preprocess(config, f"{root}/preprocessed")
    return serialize(config, f"{root}/preprocessed", f"{root}/tfrecords")


def test_citeseer_local(tmp_path, citeseer_csv):
    serialized = run_citeseer(str(CITESEER / "nodes.csv.gz"), str(CITESEER / "edges.csv.gz"), str(tmp_path / "run"), tmp_path)
    check_citeseer(serialized, citeseer_csv, tmp_path / "read")


def test_citeseer_gcs(tmp_path, citeseer_csv, gcs_bucket):
    raw = f"gs://{gcs_bucket}/raw"
    storage.upload_file(CITESEER / "nodes.csv.gz", f"{raw}/nodes/nodes.csv.gz")
    storage.upload_file(CITESEER / "edges.csv.gz", f"{raw}/edges.csv.gz")
    # The node table is given as a prefix (a folder of files), the edge table as one file.
    serialized = run_citeseer(f"{raw}/nodes", f"{raw}/edges.csv.gz", f"gs://{gcs_bucket}/run", tmp_path)
    assert str(serialized.root) == f"gs://{gcs_bucket}/run/tfrecords"
    assert storage.exists(f"gs://{gcs_bucket}/run/tfrecords/manifest.json")
    check_citeseer(serialized, citeseer_csv, tmp_path / "read")
