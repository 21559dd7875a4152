"""Step train on CiteSeer: distributed node classification and link prediction reach the
acceptance figures, 1 and 2 workers agree, runs are reproducible, and a killed worker's run
resumes from its checkpoint."""

from __future__ import annotations

import io
import json
import os
import pathlib
import signal
import subprocess
import sys
import time

import psutil
import pytest
import torch
import yaml

from components import storage
from components.config import GnnflowConfig, parse_config
from components.errors import GnnflowError
from components.partition.step import partition
from components.preprocess.step import preprocess
from components.serialize.step import serialize
from components.train.step import train
from tests.test_citeseer import CITESEER

pytestmark = pytest.mark.skipif(not (CITESEER / "nodes.csv.gz").exists(), reason=f"CiteSeer tables not found at {CITESEER}")

NODE_CLASSIFICATION = {
    "graph": {
        "nodes": [{"type": "paper", "uri": str(CITESEER / "nodes.csv.gz"), "label_column": "label", "split_column": "split",
                   "features": [{"columns": ["f*"]}]}],
        "edges": [{"type": "cites", "uri": str(CITESEER / "edges.csv.gz"), "src_type": "paper", "dst_type": "paper"}],
    },
    "serialize": {"num_shards": 2},
    "resources": {"world_size": 2},
    # One mini-batch per worker and epoch (120 training nodes): the plain full-batch recipe.
    "training": {"epochs": 200, "batch_size": 128, "fan_outs": [10, 10], "early_stopping_patience": 60},
}


def with_updates(raw: dict, **sections: dict) -> GnnflowConfig:
    merged = json.loads(json.dumps(raw))
    for name, values in sections.items():
        merged[name] = {**merged.get(name, {}), **values}
    return parse_config(yaml.safe_dump(merged), "test config")


@pytest.fixture(scope="module")
def citeseer_partitions(tmp_path_factory) -> dict[int, storage.Uri]:
    """CiteSeer for node classification, partitioned for 1 and for 2 workers."""
    root = storage.parse_uri(tmp_path_factory.mktemp("train"))
    config = with_updates(NODE_CLASSIFICATION)
    preprocess(config, root.join("pre"))
    serialize(config, root.join("pre"), root.join("tfr"))
    return {n: partition(root.join("tfr"), root.join(f"parts{n}"), config.partition, world_size=n).root for n in (1, 2)}


def test_node_classification_two_workers_and_one(tmp_path, citeseer_partitions):
    two = train(with_updates(NODE_CLASSIFICATION), citeseer_partitions[2], tmp_path / "model2")
    metrics = two.read_json("metrics.json")
    assert metrics["test_count"] == 1000 and metrics["val_count"] == 500
    assert metrics["test_accuracy"] >= 0.68, metrics
    assert 0 < metrics["test_macro_f1"] <= 1
    lines = [json.loads(line) for line in two.read_bytes("metrics.jsonl").decode().splitlines()]
    assert len(lines) == metrics["epochs_run"] and lines[0]["epoch"] == 0
    assert {"loss", "train_accuracy", "val_accuracy", "val_macro_f1", "seconds", "batches_per_s"} <= set(lines[0])
    state = torch.load(io.BytesIO(two.read_bytes("model.pt")), weights_only=True)
    assert state["head.weight"].shape == (6, 64)

    one = train(with_updates(NODE_CLASSIFICATION, resources={"world_size": 1}), citeseer_partitions[1], tmp_path / "model1")
    assert abs(one.read_json("metrics.json")["test_accuracy"] - metrics["test_accuracy"]) <= 0.02


def test_repeated_runs_agree(tmp_path, citeseer_partitions):
    # Model initialisation and seed order are fixed; GLT's distributed sampler still draws remote
    # neighbours on RPC threads, so two runs agree closely rather than bit for bit.
    short = with_updates(NODE_CLASSIFICATION, training={"epochs": 4, "early_stopping_patience": None})
    first = train(short, citeseer_partitions[2], tmp_path / "a")
    second = train(short, citeseer_partitions[2], tmp_path / "b")
    a, b = first.read_json("metrics.json"), second.read_json("metrics.json")
    assert a["epochs_run"] == b["epochs_run"] == 4
    for key in ("val_accuracy", "test_accuracy"):
        assert abs(a[key] - b[key]) <= 0.015, (key, a[key], b[key])


def test_link_prediction(tmp_path):
    raw = json.loads(json.dumps(NODE_CLASSIFICATION))
    raw["graph"]["nodes"][0].pop("split_column")
    raw["task"] = {"type": "link_prediction", "split": {"train": 0.85, "val": 0.05, "test": 0.10, "seed": 1}}
    config = with_updates(
        raw, model={"dropout": 0.1},
        training={"epochs": 40, "batch_size": 512, "learning_rate": 0.005, "weight_decay": 0.0, "early_stopping_patience": 10},
    )
    root = storage.parse_uri(tmp_path)
    test_edges = preprocess(config, root.join("pre")).read_json("graph_schema.json")["edge_types"]["paper__cites__paper"]["split_sizes"]["test"]
    serialize(config, root.join("pre"), root.join("tfr"))
    partition(root.join("tfr"), root.join("parts"), config.partition, world_size=2)
    metrics = train(config, root.join("parts"), root.join("model")).read_json("metrics.json")
    assert metrics["test_roc_auc"] >= 0.85, metrics
    assert metrics["test_count"] == test_edges and 400 <= test_edges <= 520  # positives scored: every test edge once


def test_killed_worker_fails_fast_and_the_rerun_resumes(tmp_path, citeseer_partitions):
    config = tmp_path / "config.yaml"
    raw = json.loads(json.dumps(NODE_CLASSIFICATION))
    raw["training"] |= {"epochs": 30, "early_stopping_patience": None}
    config.write_text(yaml.safe_dump(raw))
    command = [sys.executable, "-m", "components.train", "--config", str(config), "--input", str(citeseer_partitions[2]),
               "--output", str(tmp_path / "model")]
    env = os.environ | {"PYTHONPATH": str(pathlib.Path(__file__).parents[1])}
    proc = subprocess.Popen(command, stderr=subprocess.PIPE, text=True, env=env)
    checkpoint = tmp_path / "model" / "_checkpoints" / "checkpoint.pt"
    deadline = time.monotonic() + 300
    while not checkpoint.exists() and time.monotonic() < deadline and proc.poll() is None:
        time.sleep(0.2)
    assert checkpoint.exists(), "no checkpoint was written"
    workers = psutil.Process(proc.pid).children()
    victim = [w for w in workers if "resource_tracker" not in " ".join(w.cmdline())][-1]
    victim.send_signal(signal.SIGKILL)
    killed_at = time.monotonic()
    _, stderr = proc.communicate(timeout=120)
    assert proc.returncode != 0 and time.monotonic() - killed_at < 60
    assert "worker rank" in stderr and "SIGKILL" in stderr
    assert not (tmp_path / "model" / "manifest.json").exists()

    rerun = subprocess.run(command, capture_output=True, text=True, timeout=600, env=env)
    assert rerun.returncode == 0, rerun.stderr[-3000:]
    assert "resuming from the checkpoint of epoch" in rerun.stderr
    metrics = storage.open_published(tmp_path / "model", step="train").read_json("metrics.json")
    assert metrics["epochs_run"] == 30


@pytest.mark.parametrize(
    ("section", "values", "message"),
    [
        ("training", {"fan_outs": [10, 10, 10]}, "training.fan_outs has 3 entries but model.num_layers is 2"),
        ("training", {"batch_size": 0}, "key 'training.batch_size': Input should be greater than 0"),
        ("task", {"type": "graph_regression"}, "key 'task.type'"),
    ],
)
def test_config_errors_are_caught_before_any_worker_starts(section, values, message):
    with pytest.raises(GnnflowError, match=message.replace("[", r"\[").replace("(", r"\(")):
        with_updates(NODE_CLASSIFICATION, **{section: values})


def test_classification_without_label_column_is_a_config_error():
    raw = json.loads(json.dumps(NODE_CLASSIFICATION))
    raw["graph"]["nodes"][0].pop("label_column")
    with pytest.raises(GnnflowError, match="node_classification needs graph.nodes\\['paper'\\].label_column"):
        with_updates(raw)


def test_train_refuses_unpublished_partitions(tmp_path):
    with pytest.raises(GnnflowError, match="is not a published output"):
        train(with_updates(NODE_CLASSIFICATION), tmp_path / "nothing", tmp_path / "model")
