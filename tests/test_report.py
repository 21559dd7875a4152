"""Step report: a real (tiny) train + infer run reported locally and on gs://, the embedding sample
and projection, link prediction colouring, and every kind of bad input."""

from __future__ import annotations

import base64
import json
import pathlib
import re
import struct
from dataclasses import dataclass

import numpy as np
import pytest
import torch

from components import storage
from components.config import GnnflowConfig, apply_overrides
from components.demo.graph import generate_demo_graph, write_demo_graph
from components.errors import GnnflowError
from components.infer import shards
from components.infer.outputs import NodeOutputs
from components.infer.step import infer
from components.partition.step import partition
from components.preprocess.step import preprocess
from components.report.__main__ import main as report_main
from components.report.inputs import read_inference
from components.report.projection import pca_2d
from components.report.sample import sample_embeddings
from components.report.step import PROJECTION_LIMIT, report
from components.runtime.entrypoint import run_cli
from components.serialize.step import serialize
from components.tables.proposal import propose_config
from components.train.step import train

pytestmark = pytest.mark.multiworker

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
PLOT_SIZES = {"loss.png": (640, 400), "validation.png": (640, 400), "embeddings.png": (800, 600)}
DATA_URI = re.compile(r'<img src="data:image/png;base64,([A-Za-z0-9+/=]+)"')


def png_size(data: bytes) -> tuple[int, int]:
    """(width, height) from a PNG's IHDR chunk, after checking the signature."""
    assert data[:8] == PNG_SIGNATURE
    assert data[12:16] == b"IHDR"
    return struct.unpack(">II", data[16:24])


# ---------------------------------------------------------------------------------------
# A real run: the demo graph through preprocess, serialize, partition, train and infer.
# ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class RealRun:
    config: GnnflowConfig
    config_file: pathlib.Path
    run: pathlib.Path  # model/, embeddings/ inside
    num_nodes: int


@pytest.fixture(scope="module")
def real_run(tmp_path_factory) -> RealRun:
    """300 demo nodes, one worker, 3 epochs; inference in exact mode (no sampling: the fastest)."""
    root = tmp_path_factory.mktemp("report")
    nodes, edges = write_demo_graph(generate_demo_graph(300), root / "data")
    config = propose_config(
        str(nodes), str(edges), id_column="node_id", src_column="src", dst_column="dst", label_column="label", output_root=str(root / "run")
    )
    config = apply_overrides(
        config,
        {
            "training.epochs": 3,
            "training.early_stopping_patience": None,
            "training.fan_outs": [5, 5],
            "training.batch_size": 64,
            "model.hidden_channels": 16,
            "partition.load_in_parallel": False,
        },
    )
    run = root / "run"
    preprocess(config, run / "preprocessed")
    serialize(config, run / "preprocessed", run / "tfrecords")
    partition(run / "tfrecords", run / "partitions", config.partition, world_size=1)
    train(config, run / "partitions", run / "model")
    infer(config, run / "partitions", run / "model", run / "embeddings", mode="exact")
    config_file = root / "config.yaml"
    config_file.write_text(config.to_yaml())
    return RealRun(config, config_file, run, 300)


def check_page(page: str, published: storage.PublishedOutput) -> None:
    """Self-contained: exactly the three plots, embedded as PNG data URIs equal to the published files."""
    assert page.startswith("<!DOCTYPE html>")
    assert "http://" not in page and "https://" not in page
    assert "<script" not in page and "<link" not in page
    embedded = [base64.b64decode(m) for m in DATA_URI.findall(page)]
    assert len(embedded) == 3
    assert [png_size(png) for png in embedded] == list(PLOT_SIZES.values())
    assert embedded == [published.read_bytes(name) for name in PLOT_SIZES]


def test_report_of_a_real_run(real_run):
    model_out = storage.open_published(real_run.run / "model")
    infer_out = storage.open_published(real_run.run / "embeddings")
    trained, inferred = model_out.read_json("metrics.json"), infer_out.read_json("metrics.json")
    history = [json.loads(line) for line in model_out.read_bytes("metrics.jsonl").decode().splitlines()]

    published = report(real_run.config, real_run.run / "model", real_run.run / "embeddings", real_run.run / "report")

    assert published.manifest.step == "report"
    assert set(published.manifest.files) == {
        "metrics.json",
        "report.html",
        "loss.png",
        "validation.png",
        "embeddings.png",
        "config.resolved.yaml",
    }
    metrics = published.read_json("metrics.json")
    expected = {
        "best_epoch": trained["best_epoch"],
        "epochs_run": trained["epochs_run"],
        **{k: v for k, v in trained.items() if k.startswith("val_")},
        **{k: v for k, v in inferred.items() if k.startswith("test_")},
    }
    assert metrics == expected
    assert all(type(v) is float for v in metrics.values())
    assert {"val_accuracy", "val_macro_f1", "test_accuracy", "test_macro_f1", "test_count"} <= set(metrics)
    assert json.loads((real_run.run / "report" / "metrics.json").read_text()) == metrics  # the copy at the output root
    assert len(history) == 3
    assert published.manifest.counts == {"epochs": 3, "nodes_embedded": 300, "nodes_projected": 300}
    assert published.manifest.metadata["infer_mode"] == "exact"

    page = published.read_bytes("report.html").decode()
    check_page(page, published)
    for name in PLOT_SIZES:
        assert png_size(published.read_bytes(name)) == PLOT_SIZES[name]
    best = trained["best_epoch"]
    assert f"best epoch {best} of 3 run (validation accuracy {trained['val_accuracy']:.4f})" in page
    assert f"test accuracy {inferred['test_accuracy']:.4f}" in page
    assert "coloured by the class the model predicts (not the true label)" in page
    assert "all &#x27;node&#x27; node embeddings" in page  # 300 nodes: below the sampling limit
    assert "hidden_channels=16" in page and "fan_outs=[5, 5]" in page  # the config summary
    assert "Per-epoch metrics (3 epochs)" in page
    assert "the embeddings were computed from the model at" not in page


def test_command_line_and_rerun_over_the_same_output(real_run, tmp_path):
    output = tmp_path / "report"
    argv = [
        "--config",
        str(real_run.config_file),
        "--model",
        str(real_run.run / "model"),
        "--embeddings",
        str(real_run.run / "embeddings"),
        "--output",
        str(output),
    ]
    assert run_cli(report_main, argv) == 0
    first = storage.open_published(output)
    first_projection = first.read_bytes("embeddings.png")
    assert run_cli(report_main, argv) == 0
    second = storage.open_published(output)
    assert second.manifest.generation != first.manifest.generation
    assert sorted(p.name for p in output.iterdir()) == [second.manifest.generation, "manifest.json", "metrics.json"]
    assert second.read_bytes("embeddings.png") == first_projection  # same seed, same sample, same picture


def test_report_on_gcs(real_run, gcs_bucket, capsys):
    root = f"gs://{gcs_bucket}/run"
    storage.copy_tree(real_run.run / "model", f"{root}/model")
    storage.copy_tree(real_run.run / "embeddings", f"{root}/embeddings")

    published = report(real_run.config, f"{root}/model", f"{root}/embeddings", f"{root}/report")

    assert str(published.root) == f"{root}/report"
    local = storage.open_published(real_run.run / "embeddings").read_json("metrics.json")
    metrics = published.read_json("metrics.json")
    assert {k: v for k, v in metrics.items() if k.startswith("test_")} == {k: v for k, v in local.items() if k.startswith("test_")}
    assert json.loads(storage.read_text(f"{root}/report/metrics.json")) == metrics
    page = published.read_bytes("report.html").decode()
    check_page(page, published)
    # infer recorded the local model it used; the copies on gs:// are flagged, not refused
    assert f"the embeddings were computed from the model at {real_run.run / 'model'}, not from {root}/model" in page

    with pytest.raises(GnnflowError, match=re.escape(f"the model: {root}/missing is not a published output")):
        report(real_run.config, f"{root}/missing", f"{root}/embeddings", f"{root}/report2")
    assert storage.list_files(f"{root}/report2") == []


def test_kfp_component_logs_the_metrics_and_writes_the_page(real_run, tmp_path):
    """The component function as a KFP task calls it, with real artifact objects."""
    from kfp import dsl

    from components.report.component import report as report_component

    metrics, page, published = (
        dsl.Metrics(uri=str(tmp_path / "metrics")),
        dsl.HTML(uri=str(tmp_path / "page.html")),
        dsl.Artifact(uri=str(tmp_path / "report")),
    )
    report_component(
        config=real_run.config.to_yaml(),
        overrides='{"training.seed": 0}',
        model=dsl.Model(uri=str(real_run.run / "model")),
        embeddings=dsl.Dataset(uri=str(real_run.run / "embeddings")),
        report=published,
        metrics=metrics,
        html=page,
    )
    output = storage.open_published(tmp_path / "report")
    assert metrics.metadata == output.read_json("metrics.json")
    assert (tmp_path / "page.html").read_bytes() == output.read_bytes("report.html")
    assert published.metadata["generation"] == output.manifest.generation and published.metadata["count_nodes_embedded"] == 300


# ---------------------------------------------------------------------------------------
# Published outputs written directly, with the writers train and infer use.
# ---------------------------------------------------------------------------------------


def publish_train(
    output: pathlib.Path,
    task_type: str = "node_classification",
    target: str = "node",
    epochs: int = 4,
    best: int = 2,
    history_text: str | None = None,
) -> dict:
    metric = "accuracy" if task_type == "node_classification" else "roc_auc"
    history = [
        {"epoch": e, "loss": round(1.0 / (e + 1), 6), f"val_{metric}": 0.5 + 0.1 * min(e, best), "seconds": 0.5, "batches_per_s": 8.0}
        for e in range(epochs)
    ]
    final = {
        "best_epoch": best,
        "epochs_run": epochs,
        f"val_{metric}": 0.5 + 0.1 * best,
        "val_count": 40,
        f"test_{metric}": 0.61,
        "test_count": 40,
    }
    staging = storage.OutputStaging(storage.parse_uri(output), "train")
    staging.write_json(
        "model_spec.json",
        {
            "task_type": task_type,
            "target": target,
            "heterogeneous": False,
            "edge_dir": "out",
            "model": {"hidden_channels": 8, "num_layers": 2},
        },
    )
    staging.write_bytes(
        "metrics.jsonl", (history_text if history_text is not None else "".join(json.dumps(line) + "\n" for line in history)).encode()
    )
    staging.write_json("metrics.json", final)
    staging.publish()
    return final


def publish_infer(
    output: pathlib.Path,
    node_shards: dict[str, list[list[str]]],
    metrics: dict,
    classes: list[str] | None = None,
    hidden: int = 8,
    seed: int = 0,
) -> None:
    """node type → shards, each a list of original ids; classification shards get predictions among ``classes``."""
    generator = torch.Generator().manual_seed(seed)
    staging = storage.OutputStaging(storage.parse_uri(output), "infer")
    for node_type, parts in node_shards.items():
        for rank, ids in enumerate(parts):
            n = len(ids)
            probabilities = torch.softmax(torch.randn(n, len(classes), generator=generator), 1) if classes else None
            out = NodeOutputs(torch.arange(n), torch.randn(n, hidden, generator=generator), probabilities)
            shards.write_shard(staging, node_type, rank, shards.shard_table(np.asarray(ids, dtype=object), out, classes))
    staging.write_json("metrics.json", metrics)
    staging.publish()


def classification_config(root: pathlib.Path) -> GnnflowConfig:
    return GnnflowConfig.model_validate(
        {
            "graph": {
                "nodes": [{"type": "node", "uri": str(root / "nodes.csv"), "label_column": "label"}],
                "edges": [{"type": "edge", "uri": str(root / "edges.csv")}],
            },
        }
    )


def test_large_graphs_are_subsampled_the_same_however_they_are_sharded(tmp_path):
    ids = [f"n{i}" for i in range(12_000)]
    test_metrics = {"mode": "sampled", "test_accuracy": 0.5, "test_macro_f1": 0.4, "test_count": 100}
    publish_infer(tmp_path / "three", {"node": [ids[0::3], ids[1::3], ids[2::3]]}, test_metrics, ["a", "b"])
    publish_infer(tmp_path / "two", {"node": [ids[:5000], ids[5000:]]}, test_metrics, ["a", "b"])
    three = sample_embeddings(read_inference(tmp_path / "three"), ["node"], PROJECTION_LIMIT, seed=0, with_classes=True)
    two = sample_embeddings(read_inference(tmp_path / "two"), ["node"], PROJECTION_LIMIT, seed=0, with_classes=True)
    assert len(three) == len(two) == PROJECTION_LIMIT == 5000
    assert three.total == two.total == 12_000
    assert list(three.node_ids) == list(two.node_ids)  # the same nodes, in the same order
    assert three.embeddings.shape == (5000, 8) and three.classes is not None and set(three.classes) <= {"a", "b"}
    other_seed = sample_embeddings(read_inference(tmp_path / "two"), ["node"], PROJECTION_LIMIT, seed=1, with_classes=False)
    assert set(other_seed.node_ids) != set(two.node_ids) and other_seed.classes is None
    # roughly uniform: each third of the ids holds about a third of the sample
    thirds = np.bincount(np.array([int(i[1:]) for i in two.node_ids]) // 4000, minlength=3)
    assert (np.abs(thirds - 5000 / 3) < 200).all(), thirds

    publish_train(tmp_path / "model")
    published = report(classification_config(tmp_path), tmp_path / "model", tmp_path / "three", tmp_path / "report")
    assert published.manifest.counts["nodes_embedded"] == 12_000 and published.manifest.counts["nodes_projected"] == 5000
    assert (
        "a uniform random sample (seed 0) of 5,000 of the 12,000 &#x27;node&#x27; node embeddings"
        in published.read_bytes("report.html").decode()
    )


def test_link_prediction_is_coloured_by_node_type(tmp_path):
    config = GnnflowConfig.model_validate(
        {
            "graph": {
                "nodes": [{"type": "paper", "uri": "p.csv"}, {"type": "author", "uri": "a.csv"}],
                "edges": [{"type": "writes", "uri": "w.csv", "src_type": "author", "dst_type": "paper"}],
            },
            "task": {"type": "link_prediction"},
        }
    )
    final = publish_train(tmp_path / "model", "link_prediction", "author__writes__paper", best=3)
    link_metrics = {"mode": "sampled", "test_roc_auc": 0.81, "test_mrr": 0.42, "test_hits@10": 0.7, "test_count": 55}
    publish_infer(
        tmp_path / "embeddings", {"paper": [[f"p{i}" for i in range(50)]], "author": [[f"a{i}" for i in range(30)]]}, link_metrics
    )
    published = report(config, tmp_path / "model", tmp_path / "embeddings", tmp_path / "report")
    metrics = published.read_json("metrics.json")
    assert metrics == {
        "best_epoch": 3.0,
        "epochs_run": 4.0,
        "val_roc_auc": final["val_roc_auc"],
        "val_count": 40.0,
        "test_roc_auc": 0.81,
        "test_mrr": 0.42,
        "test_hits@10": 0.7,
        "test_count": 55.0,
    }
    page = published.read_bytes("report.html").decode()
    check_page(page, published)
    assert "coloured by node type (link prediction has no classes)" in page
    assert "all &#x27;author&#x27;, &#x27;paper&#x27; node embeddings" in page
    assert "best epoch 3 of 4 run (validation roc_auc 0.8000)" in page
    assert published.manifest.counts["nodes_projected"] == 80


def test_pca_finds_the_direction_of_largest_variance():
    rng = np.random.default_rng(0)
    t = rng.normal(size=200)
    direction = np.array([3.0, -4.0, 0.0]) / 5.0
    x = np.outer(t, direction) * 10 + rng.normal(scale=0.1, size=(200, 3)) + 7.0
    projection = pca_2d(x)
    assert projection.coordinates.shape == (200, 2)
    assert projection.explained[0] > 0.99 and projection.explained[0] + projection.explained[1] <= 1.0 + 1e-12
    # the first axis is the line (up to a sign fixed by the largest loading, here -4/5 → flipped to +)
    assert abs(np.corrcoef(projection.coordinates[:, 0], -t)[0, 1]) > 0.999
    assert np.corrcoef(projection.coordinates[:, 0], -t)[0, 1] > 0
    assert np.array_equal(pca_2d(x).coordinates, projection.coordinates)
    assert pca_2d(np.ones((5, 4))).coordinates.tolist() == [[0.0, 0.0]] * 5  # no variance: every point at the origin
    assert pca_2d(np.array([[1.0, 2.0]])).explained == (0.0, 0.0)


# ---------------------------------------------------------------------------------------
# Bad input: an error naming the URI or file, exit code 2, nothing published.
# ---------------------------------------------------------------------------------------


@pytest.fixture
def good_inputs(tmp_path) -> pathlib.Path:
    publish_train(tmp_path / "model")
    publish_infer(
        tmp_path / "embeddings",
        {"node": [["a", "b", "c"], ["d", "e"]]},
        {"mode": "exact", "test_accuracy": 0.5, "test_macro_f1": 0.5, "test_count": 2},
        ["x", "y"],
    )
    return tmp_path


def test_missing_or_unpublished_inputs_name_the_uri_and_publish_nothing(good_inputs):
    root, config, output = good_inputs, classification_config(good_inputs), good_inputs / "report"
    (root / "unpublished" / "gen-1").mkdir(parents=True)
    (root / "unpublished" / "gen-1" / "metrics.json").write_text("{}")
    cases = [
        (root / "nowhere", root / "embeddings", f"the model: {root / 'nowhere'} is not a published output"),
        (root / "unpublished", root / "embeddings", f"the model: {root / 'unpublished'} is not a published output"),
        (root / "model", root / "nowhere", f"the embeddings: {root / 'nowhere'} is not a published output"),
        (root / "model", root / "model", f"the embeddings: {root / 'model'} holds the output of step 'train', expected 'infer'"),
        (root / "embeddings", root / "embeddings", f"the model: {root / 'embeddings'} holds the output of step 'infer', expected 'train'"),
    ]
    for model, embeddings, message in cases:
        with pytest.raises(GnnflowError, match=re.escape(message)):
            report(config, model, embeddings, output)
        assert not output.exists()


@pytest.mark.parametrize(
    "what", ["history_json", "history_fields", "no_best_epoch", "no_test_metrics", "text_metric", "wrong_target", "no_shards", "bad_shard"]
)
def test_malformed_inputs_name_the_file(good_inputs, what):
    root = good_inputs
    model, embeddings = root / "model", root / "embeddings"
    expected = {
        "history_json": f"{model}/gen-.*/metrics.jsonl line 2 is not valid JSON",
        "history_fields": f"{model}/gen-.*/metrics.jsonl line 1: expected an object with an integer 'epoch' and a numeric 'loss'",
        "no_best_epoch": f"{model}/gen-.*/metrics.json has no integer key 'best_epoch'",
        "no_test_metrics": f"{embeddings}/gen-.*/metrics.json holds no test metrics \\(keys test_\\*\\)",
        "text_metric": f"{embeddings}/gen-.*/metrics.json: 'test_accuracy' is 'high', not a number",
        "wrong_target": f"{embeddings} holds no embeddings of node type 'node', the classification target of {model}",
        "no_shards": f"{embeddings} lists no embedding shards",
        "bad_shard": f"{embeddings}/gen-.*/embeddings/node/part-00000.parquet "
        "is not an embeddings shard with columns node_id, embedding, prediction",
    }[what]
    if what == "history_json":
        publish_train(model, history_text='{"epoch": 0, "loss": 1.0}\n{"epoch": 1, "loss": \n')
    elif what == "history_fields":
        publish_train(model, history_text='{"epoch": "zero", "loss": 1.0}\n')
    elif what == "no_best_epoch":
        staging = storage.OutputStaging(storage.parse_uri(model), "train")
        staging.write_bytes("metrics.jsonl", b"")
        staging.write_json("metrics.json", {"val_accuracy": 0.5})
        staging.write_json("model_spec.json", {"task_type": "node_classification", "target": "node"})
        staging.publish()
    elif what in ("no_test_metrics", "text_metric"):
        metrics = {"mode": "exact"} if what == "no_test_metrics" else {"mode": "exact", "test_accuracy": "high"}
        publish_infer(embeddings, {"node": [["a", "b"]]}, metrics, ["x", "y"])
    elif what == "wrong_target":
        publish_infer(embeddings, {"paper": [["a", "b"]]}, {"test_accuracy": 0.5}, ["x", "y"])
    elif what == "no_shards":
        staging = storage.OutputStaging(storage.parse_uri(embeddings), "infer")
        staging.write_json("metrics.json", {"test_accuracy": 0.5})
        staging.publish()
    elif what == "bad_shard":
        publish_infer(embeddings, {"node": [["a", "b"]]}, {"test_accuracy": 0.5}, classes=None)  # no prediction column
    with pytest.raises(GnnflowError, match=expected):
        report(classification_config(root), model, embeddings, root / "report")
    assert not (root / "report").exists()


def test_a_failed_rerun_keeps_the_published_report_and_exits_2(good_inputs, tmp_path, capsys):
    root = good_inputs
    config_file = tmp_path / "config.yaml"
    config_file.write_text(classification_config(root).to_yaml())
    output = root / "report"
    before = report(classification_config(root), root / "model", root / "embeddings", output)
    argv = [
        "--config",
        str(config_file),
        "--model",
        str(root / "missing"),
        "--embeddings",
        str(root / "embeddings"),
        "--output",
        str(output),
    ]
    assert run_cli(report_main, argv) == 2  # what `python -m components.report` exits with
    assert f"error: the model: {root / 'missing'} is not a published output" in capsys.readouterr().err
    after = storage.open_published(output)
    assert after.manifest == before.manifest
    assert sorted(p.name for p in output.iterdir()) == [before.manifest.generation, "manifest.json", "metrics.json"]
