"""Day two with ``gnnflow run``: a trained model registered and blessed by the gate, a worse one
held back (infer, report and export skipped, the alias unmoved), and an inference-only run
(``--from-model REGISTRY@blessed``) on fresh tables with new nodes and an unseen category:
encoded with the model's transforms, no training, every node embedded."""

from __future__ import annotations

import io
import json
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow.parquet as pq
import pytest
import yaml

from components import storage
from components.config import load_config
from components.demo.graph import generate_demo_graph, write_demo_graph
from components.tables.proposal import propose_config, render
from pipelines.cli import main as gnnflow
from pipelines.kfp_local import run_via_kfp_local
from pipelines.local_run import STATE_FILE

pytestmark = pytest.mark.multiworker

NODES = 1_500
NEW = 150  # nodes (and their edges) that appear after training


def _write_config(folder: Path, nodes: Path, edges: Path, registry: Path) -> Path:
    config = propose_config(
        str(nodes), str(edges), id_column="node_id", src_column="src", dst_column="dst", label_column="label",
        node_type="paper", relation="cites", output_root=str(folder / "runs"),
    )  # fmt: skip
    raw = yaml.safe_load(render(config, "lifecycle test"))
    raw["resources"] = {**raw.get("resources", {}), "world_size": 2}
    raw["training"] = {**raw.get("training", {}), "epochs": 4, "early_stopping_patience": None}
    raw["registry"] = {"uri": str(registry), "max_drop": 0.0}
    path = folder / "config.yaml"
    path.write_text(yaml.safe_dump(raw))
    return path


@pytest.fixture(scope="module")
def tables(tmp_path_factory) -> dict[str, Path]:
    """The whole graph, and the training tables without the last NEW nodes and their edges; the
    fresh tables give one new node a venue nobody saw in training."""
    root = tmp_path_factory.mktemp("lifecycle")
    graph = generate_demo_graph(NODES, seed=3)
    new_ids = set(graph.nodes["node_id"].iloc[-NEW:])
    fresh_nodes = graph.nodes.copy()
    fresh_nodes.loc[fresh_nodes.index[-1], "venue"] = "a-venue-born-yesterday"
    full = write_demo_graph(type(graph)(fresh_nodes, graph.edges), root / "fresh")
    kept_edges = graph.edges[~(graph.edges["src"].isin(new_ids) | graph.edges["dst"].isin(new_ids))]
    old = write_demo_graph(type(graph)(graph.nodes.iloc[:-NEW], kept_edges), root / "train")
    registry = root / "registry"
    return {
        "root": root,
        "registry": registry,
        "train_config": _write_config(root / "train", *old, registry),
        "fresh_config": _write_config(root / "fresh", *full, registry),
    }


def _ids(embeddings: Path) -> pd.DataFrame:
    published = storage.open_published(embeddings)
    return pd.concat(
        pq.read_table(io.BytesIO(published.read_bytes(f))).to_pandas() for f in published.files_under("embeddings/paper")
    ).set_index("node_id")


@pytest.fixture(scope="module")
def first_run(tables) -> Path:
    """The first trained model: registered as v1, blessed (nothing was before)."""
    first = tables["root"] / "run1"
    assert gnnflow(["run", "--config", str(tables["train_config"]), "--output", str(first)]) == 0
    return first


def test_register_gate_and_inference_only_run(tables, first_run, capsys):
    registry, root, first = tables["registry"], tables["root"], first_run
    decision = storage.open_published(first / "register").read_json("decision.json")
    assert decision["version"] == "v1" and decision["blessed"] is True  # nothing was blessed before
    assert storage.open_published(first / "embeddings").manifest.counts["nodes.paper"] == NODES - NEW
    model = storage.open_published(first / "model")
    assert {"transform_state.json", "graph_schema.json"} <= set(model.manifest.files)  # a model is self-contained

    # A model that learnt nothing: registered as v2, refused by the gate; nothing downstream runs.
    second = root / "run2"
    capsys.readouterr()
    worse = ["--set", "training.epochs=1", "--set", "training.learning_rate=0.000001"]
    assert gnnflow(["run", "--config", str(tables["train_config"]), "--output", str(second), *worse]) == 0
    out = capsys.readouterr().out
    assert "held back: model v2 not blessed" in out
    assert set(json.loads((second / STATE_FILE).read_text())["steps"]) == {"preprocess", "serialize", "partition", "train", "register"}
    assert not (second / "embeddings").exists()
    assert gnnflow(["models", "list", "--registry", str(registry), "--json"]) == 0
    listed = json.loads(capsys.readouterr().out)
    assert [(v["version"], v.get("aliases")) for v in listed][:2] == [("v1", ["blessed"]), ("v2", [])]

    # Inference-only with the blessed model on the fresh tables: no training, every node embedded.
    fresh = root / "fresh_run"
    reference = f"{registry}@blessed"
    assert gnnflow(["run", "--config", str(tables["fresh_config"]), "--output", str(fresh), "--from-model", reference]) == 0
    out = capsys.readouterr().out
    assert "(inference-only)" in out
    assert f"  embeddings   {fresh / 'embeddings'}" in out and f"  model        {registry / 'versions' / 'v1' / 'model'}" in out
    assert "  register" not in out  # an inference-only run registers nothing
    assert set(json.loads((fresh / STATE_FILE).read_text())["steps"]) == {"preprocess", "serialize", "partition", "infer", "report"}
    assert not (fresh / "model").exists()
    preprocessed = storage.open_published(fresh / "preprocessed")
    assert preprocessed.manifest.metadata["unseen_categories"] == {"paper.venue": 1}
    blessed_state = storage.open_published(listed[0]["model_uri"]).read_json("transform_state.json")
    assert preprocessed.read_json("transform_state.json") == blessed_state  # encoded exactly as in training
    before, after = _ids(first / "embeddings"), _ids(fresh / "embeddings")
    assert len(after) == NODES and after.index.is_unique
    assert len(after.index.difference(before.index)) == NEW
    # The unchanged nodes' predictions mostly stand: the same weights, a graph that grew by 10 %.
    common = before.index.intersection(after.index)
    assert float(np.mean(before.loc[common, "prediction"] == after.loc[common, "prediction"])) > 0.8


def test_inference_only_refusals_before_any_step(tables, first_run, tmp_path, caplog):
    config = str(tables["fresh_config"])
    registry = tables["registry"]
    cases = [
        (["--from-model", f"{registry}@v1", "--set", "training.epochs=3"], "--from-model runs no training, so training.epochs"),
        (["--from-model", f"{tmp_path / 'nowhere'}@blessed"], "nowhere"),
        (["--from-model", f"{registry}@v42"], "v42"),
        (["--from-model", str(tmp_path / "no-model")], "the model to infer with: "),
    ]
    for i, (arguments, message) in enumerate(cases):
        caplog.clear()
        output = tmp_path / f"out{i}"
        assert gnnflow(["run", "--config", config, "--output", str(output), *arguments]) == 2
        assert message in caplog.text
        assert not (output / "preprocessed").exists()


def test_the_compiled_day_two_pipelines_under_kfp_local(tables, tmp_path):
    """The compiled DAGs, run by kfp.local: the gated training pipeline (register, then infer and
    report inside ``dsl.If`` on ``blessed``), and the inference-only pipeline resolving
    ``REGISTRY@blessed`` in its resolve-model task."""
    registry = tmp_path / "registry"
    config = load_config(str(tables["train_config"]))
    fast = {"registry.uri": str(registry), "training.epochs": 2}
    root = storage.parse_uri(tmp_path / "kfp")
    trained = run_via_kfp_local(config.to_yaml(), fast, root)
    assert not trained.held_back and "registration" in trained.outputs
    assert storage.open_published(trained.outputs["registration"], step="register").read_json("decision.json")["blessed"] is True
    assert storage.open_published(trained.outputs["report"], step="report").read_json("metrics.json") == trained.metrics

    fresh = load_config(str(tables["fresh_config"]))
    inferred = run_via_kfp_local(fresh.to_yaml(), {}, storage.parse_uri(tmp_path / "kfp_fresh"), from_model=f"{registry}@blessed")
    assert "train_metrics" not in inferred.outputs
    blessed_copy = registry / "versions" / "v1" / "model"
    assert inferred.outputs["model"] == str(blessed_copy)  # the resolved model, read in place
    assert storage.open_published(inferred.outputs["embeddings"]).manifest.counts["nodes.paper"] == NODES
    assert storage.open_published(inferred.outputs["preprocessed"]).manifest.metadata["unseen_categories"] == {"paper.venue": 1}
