"""Step infer: the demo graph trained on 2 workers, then embedded and classified on 2 workers,
sampled and exact, checked against the demo's own tables and a single-process full-graph pass."""

from __future__ import annotations

import io
import json
import pathlib
from dataclasses import dataclass

import numpy as np
import pandas as pd
import pyarrow.parquet as pq
import pytest
import torch

from components import storage
from components.config import GnnflowConfig
from components.demo.graph import generate_demo_graph, write_demo_graph
from components.demo.hetero_graph import generate_hetero_demo_graph, write_hetero_demo_graph
from components.errors import GnnflowError
from components.infer.__main__ import main as infer_main
from components.infer.layerwise import aggregation_edges
from components.infer.restore import restore_model
from components.infer.sampled import sampling_types
from components.infer.step import infer
from components.partition.output import METADATA_FILE, PartitionMetadata, hash_owner, read_metadata, read_original_ids, read_partition
from components.partition.step import partition
from components.preprocess.step import preprocess
from components.runtime.launcher import WorkerContext, launch
from components.serialize.step import serialize
from components.tables.learning_choice import FALLBACK
from components.tables.proposal import propose_config
from components.train.step import train
from tests.link_eval_workers import score_test_edges
from tests.small_graphs import demo_chance

pytestmark = pytest.mark.multiworker

NUM_NODES = 1500
TEST = 2  # split code


@dataclass(frozen=True)
class Trained:
    root: pathlib.Path  # run/{preprocessed,tfrecords,partitions,model} inside
    config: GnnflowConfig
    node_ids: dict[str, list[str]]  # node type → original ids of the input table
    labels: pd.Series  # target type: original id → class name (None: unlabeled)
    test_ids: set[str]  # original ids of the target type's test split


def run_pipeline(config: GnnflowConfig, root: pathlib.Path, target: str, node_ids: dict[str, list[str]], labels: pd.Series) -> Trained:
    """preprocess → serialize → partition (2) → train (2 workers) into ``root/run``."""
    run = root / "run"
    preprocessed = preprocess(config, run / "preprocessed")
    serialize(config, run / "preprocessed", run / "tfrecords")
    partition(run / "tfrecords", run / "partitions", config.partition, world_size=2)
    train(config, run / "partitions", run / "model")
    id_map = pd.concat(
        pq.read_table(io.BytesIO(preprocessed.read_bytes(p))).to_pandas() for p in preprocessed.files_under(f"id_maps/{target}")
    )
    splits = pd.concat(
        pq.read_table(io.BytesIO(preprocessed.read_bytes(p)), columns=["node_id", "split"]).to_pandas()
        for p in preprocessed.files_under(f"nodes/{target}")
    )
    original = id_map.set_index("node_id")["original_id"]
    test_ids = set(original[splits.loc[splits["split"] == TEST, "node_id"]].astype(str))
    return Trained(root, config, node_ids, labels, test_ids)


def few_epochs(config: GnnflowConfig) -> GnnflowConfig:
    return config.model_copy(
        update={
            "training": config.training.model_copy(update={"epochs": 5, "early_stopping_patience": None}),
            "resources": config.resources.model_copy(update={"world_size": 2}),
        }
    )


@pytest.fixture(scope="module")
def trained(tmp_path_factory) -> Trained:
    """The demo graph through preprocess, serialize, partition (2) and a short train (2 workers)."""
    root = tmp_path_factory.mktemp("infer")
    demo = generate_demo_graph(NUM_NODES)
    nodes, edges = write_demo_graph(demo, root / "data")
    config = few_epochs(
        propose_config(
            str(nodes),
            str(edges),
            id_column="node_id",
            src_column="src",
            dst_column="dst",
            label_column="label",
            output_root=str(root / "run"),
            choice=FALLBACK,  # sampled graphsage: this module compares its sampled and exact inference
        )
    )
    labels = demo.nodes.set_index("node_id")["label"]
    return run_pipeline(config, root, "node", {"node": list(labels.index)}, labels)


def read_output(published: storage.PublishedOutput, node_type: str) -> pd.DataFrame:
    files = published.files_under(f"embeddings/{node_type}")
    assert files == [f"embeddings/{node_type}/part-00000.parquet", f"embeddings/{node_type}/part-00001.parquet"]
    return pd.concat([pq.read_table(io.BytesIO(published.read_bytes(f))).to_pandas() for f in files], ignore_index=True)


def accuracy_from_output(table: pd.DataFrame, trained: Trained) -> tuple[float, int]:
    test = table[table["node_id"].isin(trained.test_ids)]
    truth = trained.labels.loc[test["node_id"]].to_numpy()
    labelled = pd.notna(truth)
    return float((test["prediction"].to_numpy()[labelled] == truth[labelled]).mean()), int(labelled.sum())


def check_output(published: storage.PublishedOutput, trained: Trained, target: str = "node") -> tuple[pd.DataFrame, dict]:
    """Checks every type's shards; returns the target's table and metrics.json."""
    hidden = trained.config.model.hidden_channels
    for node_type, ids in trained.node_ids.items():
        table = read_output(published, node_type)
        assert sorted(table["node_id"]) == sorted(ids), f"every original {node_type} id exactly once"
        assert (table["embedding"].map(len) == hidden).all()
        assert np.isfinite(np.stack(table["embedding"].to_numpy())).all()
        assert ("prediction" in table) == (node_type == target)
    table = read_output(published, target)
    vocabulary = {v for v in trained.labels if pd.notna(v)}
    assert set(table["prediction"]) <= vocabulary
    assert ((table["probability"] > 0) & (table["probability"] <= 1)).all()
    metrics = published.read_json("metrics.json")
    accuracy, count = accuracy_from_output(table, trained)
    assert metrics["test_count"] == count > 0
    assert metrics["test_accuracy"] == pytest.approx(accuracy, abs=1e-12)
    assert 0 < metrics["test_macro_f1"] <= 1
    assert published.manifest.counts == {**{f"nodes.{t}": len(ids) for t, ids in trained.node_ids.items()}, "workers": 2}
    assert storage.exists(published.uri("config.resolved.yaml"))
    return table, metrics


@pytest.fixture(scope="module")
def sampled(trained) -> tuple[pd.DataFrame, dict]:
    run = trained.root / "run"
    published = infer(trained.config, run / "partitions", run / "model", run / "embeddings")
    assert published is not None and published.manifest.step == "infer"
    return check_output(published, trained)


def test_sampled_covers_every_node_with_predictions(sampled):
    table, metrics = sampled
    assert metrics["mode"] == "sampled"
    assert metrics["test_accuracy"] > 2 * demo_chance(NUM_NODES)


def full_graph_embeddings(trained: Trained) -> tuple[torch.Tensor, list[str]]:
    """(N, hidden) embeddings of the whole graph in one process, by partition id; and the original ids."""
    partitions = storage.open_published(trained.root / "run" / "partitions")
    metadata = read_metadata(partitions)
    parts = [read_partition(partitions, i) for i in range(metadata.num_partitions)]
    ids = torch.cat([p.nodes["node"]["node_id"] for p in parts])
    features = torch.empty((NUM_NODES, parts[0].nodes["node"]["features"].shape[1]))
    features[ids] = torch.cat([p.nodes["node"]["features"] for p in parts]).float()
    edges = torch.cat([p.edges["node__edge__node"]["edge_index"] for p in parts], dim=1)
    assert metadata.edge_assignment == "src"
    # Edges are sampled by source: a node aggregates over its out-neighbours, messages flow dst → src.
    model = restore_model(storage.open_published(trained.root / "run" / "model"), metadata.schema, trained.config, "out")
    with torch.no_grad():
        z = model.module.encoder(features, edges.flip(0))
    originals = [str(o) for i in range(metadata.num_partitions) for o in read_original_ids(partitions, i, "node")]
    return z, originals


def test_exact_matches_a_full_graph_pass_and_sampled_accuracy(trained, sampled, tmp_path):
    run = trained.root / "run"
    (tmp_path / "config.yaml").write_text(trained.config.to_yaml())
    published = infer_main(["--config", str(tmp_path / "config.yaml"), "--output", str(run / "exact"), "--mode", "exact"])
    assert published is not None
    table, metrics = check_output(published, trained)
    assert metrics["mode"] == "exact" and metrics["test_accuracy"] > 2 * demo_chance(NUM_NODES)
    z, originals = full_graph_embeddings(trained)
    by_id = table.set_index("node_id")
    written = torch.tensor(np.stack(by_id.loc[originals, "embedding"].to_numpy()))
    assert torch.allclose(written, z, atol=1e-4), float((written - z).abs().max())
    assert abs(metrics["test_accuracy"] - sampled[1]["test_accuracy"]) < 0.05


def test_heterogeneous_sampled_embeds_every_type(tmp_path):
    """Papers (labelled target) and authors (no label); edges assigned by source, so author seeds
    are sampled too (over their `writes` out-edges), which GLT only batches with labels."""
    demo = generate_hetero_demo_graph(600, 200)
    tables = write_hetero_demo_graph(demo, tmp_path / "data")
    raw = {
        "graph": {
            "nodes": [
                {
                    "type": "paper",
                    "uri": str(tables["papers"]),
                    "id_column": "paper_id",
                    "label_column": "label",
                    "features": [{"columns": ["w*"]}],
                },
                {
                    "type": "author",
                    "uri": str(tables["authors"]),
                    "id_column": "author_id",
                    "features": [{"columns": ["h_index"], "transform": "standardize"}, {"columns": ["field"], "transform": "one_hot"}],
                },
            ],
            "edges": [
                {"type": "cites", "uri": str(tables["cites"]), "src_type": "paper", "dst_type": "paper"},
                {
                    "type": "writes",
                    "uri": str(tables["writes"]),
                    "src_column": "author_id",
                    "dst_column": "paper_id",
                    "src_type": "author",
                    "dst_type": "paper",
                    "undirected": False,
                },
            ],
        },
        "task": {"type": "node_classification", "target": "paper"},
        "model": {"hidden_channels": 16},
        "training": {"fan_outs": [5, 5], "batch_size": 128, "eval_batch_size": 256},
        "output": {"root": str(tmp_path / "run")},
    }
    config = few_epochs(GnnflowConfig.model_validate(raw))
    labels = demo.papers.set_index("paper_id")["label"]
    node_ids = {"paper": list(labels.index), "author": list(demo.authors["author_id"])}
    trained = run_pipeline(config, tmp_path, "paper", node_ids, labels)
    run = tmp_path / "run"
    published = infer(config, run / "partitions", run / "model", run / "embeddings")
    assert published is not None
    check_output(published, trained, target="paper")


def test_link_prediction_exact_on_destination_partitions(tmp_path):
    """Link prediction with edges assigned by destination: exact embeddings equal a full-graph
    pass over the training edges only (messages flow src → dst) in the decoder's space, and the
    test edges are scored."""
    nodes, edges = write_demo_graph(generate_demo_graph(600), tmp_path / "data")
    config = few_epochs(
        propose_config(
            str(nodes),
            str(edges),
            id_column="node_id",
            src_column="src",
            dst_column="dst",
            task="link_prediction",
            output_root=str(tmp_path / "run"),
        )
    )
    config = config.model_copy(update={"partition": config.partition.model_copy(update={"edge_assignment": "dst"})})
    run = tmp_path / "run"
    preprocessed = preprocess(config, run / "preprocessed")
    serialize(config, run / "preprocessed", run / "tfrecords")
    partitions = partition(run / "tfrecords", run / "partitions", config.partition, world_size=2)
    train(config, run / "partitions", run / "model")
    published = infer(config, run / "partitions", run / "model", run / "embeddings", mode="exact")
    assert published is not None
    table = read_output(published, "node").set_index("node_id")
    assert list(table.columns) == ["embedding"]
    metadata = read_metadata(partitions)
    parts = [read_partition(partitions, i) for i in range(2)]
    features = torch.empty((600, parts[0].nodes["node"]["features"].shape[1]))
    features[torch.cat([p.nodes["node"]["node_id"] for p in parts])] = torch.cat([p.nodes["node"]["features"] for p in parts]).float()
    stored = [p.edges["node__edge__node"] for p in parts]
    train_edges = torch.cat([e["edge_index"][:, e["split"] == 0] for e in stored], dim=1)
    model = restore_model(storage.open_published(run / "model"), metadata.schema, config, "in")
    with torch.no_grad():
        z = model.module.embed(model.module.encoder(features, train_edges))  # written in the dot decoder's space
    originals = [str(o) for i in range(2) for o in read_original_ids(partitions, i, "node")]  # by partition id
    written = torch.tensor(np.stack(table.loc[originals, "embedding"].to_numpy()))
    assert torch.allclose(written, z, atol=1e-4), float((written - z).abs().max())
    metrics = published.read_json("metrics.json")
    test_edges = sum(
        int((pq.read_table(io.BytesIO(preprocessed.read_bytes(f)), columns=["split"]).column("split").to_numpy() == TEST).sum())
        for f in preprocessed.files_under("edges/node__edge__node")
    )
    assert metrics["test_count"] == test_edges > 0
    assert 0.5 < metrics["test_roc_auc"] <= 1 and 0 < metrics["test_mrr"] <= 1 and 0 <= metrics["test_hits@10"] <= 1


def test_missing_model_fails_before_workers_start(trained, tmp_path):
    run = trained.root / "run"
    with pytest.raises(GnnflowError, match=f"model.*{tmp_path / 'nomodel'}.*not a published output"):
        infer(trained.config, run / "partitions", tmp_path / "nomodel", tmp_path / "out")
    with pytest.raises(GnnflowError, match="partitions.*not a published output"):
        infer(trained.config, tmp_path / "noparts", run / "model", tmp_path / "out")
    three = trained.config.model_copy(update={"resources": trained.config.resources.model_copy(update={"world_size": 3})})
    with pytest.raises(GnnflowError, match="world size 3 does not match the 2 partitions"):
        infer(three, run / "partitions", run / "model", tmp_path / "out")
    with pytest.raises(GnnflowError, match="unknown inference mode"):
        infer(trained.config, run / "partitions", run / "model", tmp_path / "out", mode="fast")
    assert not (tmp_path / "out").exists()


def test_exact_mode_on_a_heterogeneous_graph_is_refused(trained, tmp_path):
    """A published partition output whose graph has two node types (metadata only: the check
    comes before anything else is read)."""
    real = read_metadata(storage.open_published(trained.root / "run" / "partitions"))
    graph = json.loads(json.dumps(real.graph))
    graph["node_types"]["author"] = {**graph["node_types"]["node"], "name": "author", "label_vocabulary": None}
    edge = graph["edge_types"]["node__edge__node"]
    graph["edge_types"]["author__wrote__node"] = {**edge, "src_type": "author", "relation": "wrote", "undirected": False}
    hetero = PartitionMetadata(
        2, "src", {**real.node_counts, "author": real.node_counts["node"]}, {**real.edge_counts, "author__wrote__node": [0, 0]}, graph
    )
    with storage.staged_output(tmp_path / "parts", "partition") as staging:
        staging.write_bytes(METADATA_FILE, hetero.to_json().encode())
        staging.publish()
    # Sampled mode embeds authors (no in-edges) from their own features when sampling in-edges.
    assert sampling_types(hetero.edge_counts, "out") == {"node", "author"} and sampling_types(hetero.edge_counts, "in") == {"node"}
    with pytest.raises(GnnflowError, match="exact supports homogeneous graphs"):
        infer(trained.config, tmp_path / "parts", trained.root / "run" / "model", tmp_path / "out", mode="exact")


def test_aggregation_follows_the_sampling_direction():
    edge_index = torch.tensor([[0, 0, 2], [1, 2, 0]])  # 0→1, 0→2, 2→0
    own = torch.tensor([0, 2])
    # By source: node 0 aggregates over 1 and 2, node 2 over 0.
    assert aggregation_edges(edge_index, own, 3, "src").tolist() == [[1, 2, 0], [0, 0, 1]]
    own = torch.tensor([0, 1, 2])
    # By destination: node 1 aggregates over 0, node 2 over 0, node 0 over 2.
    assert aggregation_edges(edge_index, own, 3, "dst").tolist() == [[0, 0, 2], [1, 2, 0]]
    with pytest.raises(GnnflowError, match="lives elsewhere"):
        aggregation_edges(edge_index, torch.tensor([0]), 3, "src")


ALONE = WorkerContext(rank=0, world_size=1, local_rank=0, local_world_size=1, master_addr="127.0.0.1", master_port=0, rpc_port=0)


def test_link_metrics_score_with_the_decoder_on_any_number_of_workers():
    z = torch.eye(500) * 10  # node i alone points along axis i: only (i, i) pairs score high
    positives = torch.arange(50).repeat(2, 1)
    alone = torch.zeros(500, dtype=torch.int64)
    perfect = score_test_edges(ALONE, z, positives, alone, 0)
    assert perfect["test_roc_auc"] > 0.99 and perfect["test_count"] == 50
    # A positive ties only with negatives that drew its own source (ranks are pessimistic on ties).
    assert perfect["test_mrr"] > 0.7 and perfect["test_hits@10"] == 1.0
    crossed = score_test_edges(ALONE, z, torch.stack([torch.arange(50), torch.arange(50) + 1]), alone, 0)
    assert crossed["test_roc_auc"] < 0.6 and crossed["test_hits@10"] < 0.2
    # Three workers, each owning a hashed third of the nodes and scoring its own edges with
    # embeddings fetched from the others: the same negatives, the same metrics.
    owner = hash_owner(torch.arange(500), 3, seed=5)
    spread = launch(score_test_edges, (z, positives, owner, 0), world_size=3)
    assert spread[0] == spread[1] == spread[2]
    assert spread[0] == pytest.approx(perfect, rel=1e-12)


def test_histogram_auc_counts_ties_half():
    from components.gnn.metrics import histogram_auc, score_histogram

    positive, negative = score_histogram(torch.tensor([1.0, 2.0])), score_histogram(torch.tensor([0.0, 1.0]))
    assert histogram_auc(positive, negative) == 0.875  # 3 of 4 pairs won, one tied
    assert np.isnan(histogram_auc(positive, score_histogram(torch.zeros(0))))


def test_auto_mode_infers_the_way_the_model_trained():
    from components.infer.output import resolved_mode

    assert resolved_mode("auto", "full_graph") == "exact" and resolved_mode("auto", "sampled") == "sampled"
    assert resolved_mode("sampled", "full_graph") == "sampled" and resolved_mode("exact", "sampled") == "exact"
    with pytest.raises(GnnflowError, match="unknown inference mode 'fast': choose one of auto, sampled, exact"):
        resolved_mode("fast", "sampled")
