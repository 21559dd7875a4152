"""int8 node features end to end on the one-sided demo graph (400 nodes, 2 workers): partition
files hold int8 rows, training and both inference modes read them, accuracy stays with float32's,
serving answers as batch inference does, and a run reusing the model's fitted state reuses its
quantization (a value beyond its range is clipped, not wrapped)."""

from __future__ import annotations

import copy
import io
import logging
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow.parquet as pq
import pytest
import torch

from components import storage
from components.feature_storage.codec import codec_of
from components.infer.step import infer
from components.partition.step import partition
from components.partition.store import read_partition
from components.preprocess.output import load_fitted_state, read_graph_schema
from components.preprocess.step import preprocess
from components.serialize.output import read_graph_metadata
from components.serialize.step import serialize
from components.serving.predictor import ExistingNode, NewEdge, NewNode, Predictor
from components.train.step import train
from tests.small_graphs import with_updates

pytestmark = pytest.mark.multiworker


def _embeddings(published: storage.PublishedOutput) -> pd.DataFrame:
    files = published.files_under("embeddings/paper")
    frame = pd.concat([pq.read_table(io.BytesIO(published.read_bytes(f))).to_pandas() for f in files], ignore_index=True)
    return frame.sort_values("node_id", ignore_index=True)


def _metrics(model: storage.PublishedOutput) -> dict:
    return model.manifest.metadata["metrics"]


@pytest.fixture(scope="module")
def int8_run(one_sided_validation, one_sided_model: Path, tmp_path_factory) -> dict:
    """The one-sided config with ``feature_storage: int8``: preprocess … train, exact infer."""
    raw, float_partitions, _ = one_sided_validation
    raw = copy.deepcopy(raw)
    raw["graph"]["nodes"][0]["feature_storage"] = "int8"
    root = tmp_path_factory.mktemp("int8_run")
    config = with_updates(raw)
    preprocess(config, root / "pre")
    serialize(config, root / "pre", root / "tfr")
    parts = partition(root / "tfr", root / "parts", config.partition, world_size=2)
    assert parts is not None
    model = train(config, parts.root, root / "model")
    exact = infer(config, parts.root, str(root / "model"), str(root / "exact"), mode="exact")
    assert model is not None and exact is not None
    return {"raw": raw, "root": root, "parts": parts, "model": model, "exact": exact, "float_partitions": float_partitions}


def test_partitions_hold_int8_rows(int8_run):
    parts = int8_run["parts"]
    schema = read_partition(parts, 0).metadata.schema
    codec = codec_of(schema.node_types["paper"])
    assert codec.storage == "int8" and codec.quantization is not None
    assert len(codec.quantization.scale) == schema.node_types["paper"].feature_dim
    for index in range(2):
        features = read_partition(parts, index).nodes["paper"]["features"]
        assert features.dtype == torch.int8
        floats = read_partition(storage.open_published(int8_run["float_partitions"]), index).nodes["paper"]["features"]
        assert features.shape == floats.shape and features.nbytes * 4 == floats.nbytes
        # The rows are the float32 rows quantized: within half a step per column.
        error = (codec.decode(features) - floats).abs().max(0).values
        assert torch.all(error <= torch.tensor(codec.quantization.scale) / 2 * (1 + 1e-4))


def test_tfrecord_node_shards_hold_int8_rows(int8_run):
    """Serialize writes the stored rows: the node shards' feature payload is a quarter of float32's."""
    tfrecords = {
        "int8": storage.open_published(int8_run["root"] / "tfr", step="serialize"),
        "float32": storage.open_published(Path(str(int8_run["float_partitions"])).parent / "tfr", step="serialize"),
    }
    sizes = {k: sum(v.manifest.files[f].size for f in v.files_under("nodes/paper")) for k, v in tfrecords.items()}
    node = read_graph_metadata(tfrecords["int8"]).node_types["paper"]
    rows, dim = node.count, node.feature_dim
    assert sizes["float32"] - sizes["int8"] >= 3 * rows * dim  # 1 byte a value instead of 4
    assert sizes["int8"] <= sizes["float32"] / 4 + 100 * rows  # the rest: ids, keys and framing of each record


def test_int8_training_and_inference_stay_with_float32(int8_run, one_sided_model: Path):
    int8, float32 = _metrics(int8_run["model"]), _metrics(storage.open_published(str(one_sided_model)))
    assert int8["val_count"] == float32["val_count"] > 0
    assert abs(int8["val_accuracy"] - float32["val_accuracy"]) <= 0.05, (int8, float32)
    # The float32-trained model on the int8 partitions predicts (nearly) as on the float32 ones.
    config = with_updates(int8_run["raw"])
    root = int8_run["root"]
    on_int8 = infer(config, int8_run["parts"].root, str(one_sided_model), str(root / "f32_on_int8"), mode="exact")
    on_float = infer(config, int8_run["float_partitions"], str(one_sided_model), str(root / "f32_on_f32"), mode="exact")
    assert on_int8 is not None and on_float is not None
    a, b = _embeddings(on_int8), _embeddings(on_float)
    assert a["node_id"].tolist() == b["node_id"].tolist()
    agree = float(np.mean(a["prediction"].to_numpy() == b["prediction"].to_numpy()))
    ea, eb = np.stack(a["embedding"].to_numpy()), np.stack(b["embedding"].to_numpy())
    cosine = (ea * eb).sum(1) / np.linalg.norm(ea, axis=1) / np.linalg.norm(eb, axis=1)
    assert agree >= 0.97 and np.median(cosine) > 0.999, (agree, np.median(cosine))
    sampled = infer(config, int8_run["parts"].root, str(root / "model"), str(root / "sampled"), mode="sampled")
    assert sampled is not None and len(_embeddings(sampled)) == 400


def test_serving_answers_as_batch_inference_on_int8_rows(int8_run):
    root = int8_run["root"]
    exact = _embeddings(int8_run["exact"])
    predictor = Predictor.load(str(root / "model"), str(int8_run["parts"].root), cache_dir=str(root / "cache"))
    ids = exact["node_id"].tolist()[:40]
    answers = predictor.predict([ExistingNode("paper", i) for i in ids])
    truth = np.stack(exact["embedding"].to_numpy()[:40])
    got = np.array([p.embedding for p in answers])
    assert np.allclose(got, truth, atol=1e-5), np.abs(got - truth).max()
    # A new node with an existing node's raw features and edges is encoded through the same int8 rows.
    nodes = pd.read_csv(Path(int8_run["raw"]["graph"]["nodes"][0]["uri"]), dtype={"node_id": str})
    edges = pd.read_csv(Path(int8_run["raw"]["graph"]["edges"][0]["uri"]), dtype={"src": str, "dst": str})
    node = ids[0]
    row = nodes[nodes["node_id"] == node].iloc[0]
    out = [NewEdge("cites", d, "out") for d in edges.loc[edges["src"] == node, "dst"]]
    into = [NewEdge("paper__cites__paper", s, "in") for s in edges.loc[edges["dst"] == node, "src"]]
    (new,) = predictor.predict([NewNode("paper", {c: float(row[c]) for c in nodes.columns if c.startswith("w")}, tuple(out + into))])
    cosine = float(np.dot(new.embedding, truth[0]) / np.linalg.norm(new.embedding) / np.linalg.norm(truth[0]))
    assert cosine > 0.999, cosine


def test_a_run_reusing_the_models_state_reuses_its_quantization_and_clips(int8_run, caplog):
    root, raw = int8_run["root"], copy.deepcopy(int8_run["raw"])
    nodes = pd.read_csv(Path(raw["graph"]["nodes"][0]["uri"]), dtype={"node_id": str})
    first = nodes.columns[[c.startswith("w") for c in nodes.columns]][0]
    nodes.loc[0, first] = 1e6  # far beyond anything the model's transforms saw
    tables = root / "fresh"
    tables.mkdir()
    nodes.to_csv(tables / "nodes.csv", index=False)
    raw["graph"]["nodes"][0]["uri"] = str(tables / "nodes.csv")
    config = with_updates(raw, resources={"world_size": 1})
    fresh = preprocess(config, root / "fresh_pre", load_fitted_state(root / "model"))
    trained = read_graph_schema(storage.open_published(root / "pre")).node_types["paper"]
    reused = read_graph_schema(fresh).node_types["paper"]
    assert reused.feature_storage == "int8" and reused.feature_quantization == trained.feature_quantization
    with caplog.at_level(logging.WARNING, logger="gnnflow.features"):
        serialize(config, root / "fresh_pre", root / "fresh_tfr")
        assert "serialize: nodes/paper (" in caplog.text and "1 feature value(s) outside the stored type's range" in caplog.text
        caplog.clear()
        parts = partition(root / "fresh_tfr", root / "fresh_parts", config.partition, world_size=1)
    assert parts is not None and "clipped" not in caplog.text  # counted once, where the rows are encoded
    stored = read_partition(parts, 0).nodes["paper"]
    column = list(reused.feature_names).index(first)
    big = stored["features"][stored["source_id"] == 0][0]
    assert int(big[column]) == 127  # clipped to the top of the fitted range, not wrapped to a negative code
    assert codec_of(reused).decode(big[None])[0, column].item() == pytest.approx(trained_high(trained, column), rel=1e-5)


def trained_high(node, column: int) -> float:
    """The top of a column's fitted int8 range: the value code 127 stands for."""
    q = node.feature_quantization
    return (127 - q["zero_point"][column]) * q["scale"][column]
