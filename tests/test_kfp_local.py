"""The compiled DAG run by ``kfp.local`` (SubprocessRunner): the demo graph end to end, and bad
parameters stopped before any task or worker starts."""

from __future__ import annotations

import json

import kfp.local
import pytest

from components import storage
from components.config import GnnflowConfig, apply_overrides
from components.demo.graph import generate_demo_graph, write_demo_graph
from components.errors import GnnflowError
from components.preprocess.component import build_component as preprocess_component
from components.tables.proposal import propose_config
from pipelines.kfp_local import run_from_cli, run_via_kfp_local
from pipelines.local_run import DEMO_NODES as BUNDLED_DEMO_NODES
from tests.small_graphs import demo_chance

pytestmark = pytest.mark.multiworker

OUTPUT_STEPS = {  # pipeline output → the step whose published output it is
    "preprocessed": "preprocess",
    "tfrecords": "serialize",
    "partitions": "partition",
    "model": "train",
    "embeddings": "infer",
    "report": "report",
}
DEMO_NODES = 1_500
# The demo's proposal trains full-graph (one optimizer step an epoch) and infers exactly (--infer-mode auto).
EPOCHS = 30
FAST = {"resources.world_size": 2, "training.epochs": EPOCHS}


def _demo_config(folder) -> GnnflowConfig:
    nodes, edges = write_demo_graph(generate_demo_graph(DEMO_NODES), folder / "data")
    config = propose_config(
        str(nodes),
        str(edges),
        id_column="node_id",
        src_column="src",
        dst_column="dst",
        label_column="label",
        node_type="paper",
        relation="cites",
        output_root=str(folder / "unused"),
    )
    return apply_overrides(config, FAST)


@pytest.fixture(scope="module")
def demo(tmp_path_factory):
    """What ``gnnflow run --via kfp-local --output ROOT --set ...`` runs: the bundled demo graph."""
    root = storage.parse_uri(tmp_path_factory.mktemp("kfp_local") / "run")
    return root, run_from_cli(None, str(root), {**FAST, "training.early_stopping_patience": 10})


def test_demo_through_kfp_local_publishes_every_artifact(demo):
    root, run = demo
    assert set(run.outputs) == {*OUTPUT_STEPS, "train_metrics", "infer_metrics", "metrics", "report_html"}
    for name, step in OUTPUT_STEPS.items():
        uri = storage.parse_uri(run.outputs[name])
        assert isinstance(uri, storage.LocalUri) and uri.path.startswith(root.path + "/gnnflow-"), uri  # kfp.local's own URIs
        assert storage.open_published(uri, step=step).manifest.files, name  # published: a manifest listing files
    counts = storage.open_published(run.outputs["preprocessed"]).manifest.counts
    assert counts == {"nodes.paper": BUNDLED_DEMO_NODES, "edges.paper__cites__paper": BUNDLED_DEMO_NODES * 4}
    assert storage.open_published(run.outputs["partitions"]).manifest.counts["partitions"] == 2
    assert storage.read_bytes(run.report_html).startswith(b"<!DOCTYPE html>")
    assert storage.read_text(root.join("config.resolved.yaml")).count("early_stopping_patience: 10") == 1


def test_demo_final_metrics_are_good_and_logged_on_metrics_artifacts(demo):
    _, run = demo
    assert run.metrics["test_accuracy"] >= 2 * demo_chance(BUNDLED_DEMO_NODES), run.metrics  # learnt: twice chance
    published = storage.open_published(run.outputs["report"]).read_json("metrics.json")
    assert published == run.metrics
    train_metrics = storage.open_published(run.outputs["model"]).read_json("metrics.json")
    assert train_metrics["epochs_run"] <= EPOCHS
    assert storage.open_published(run.outputs["embeddings"]).read_json("metrics.json")["mode"] == "exact"
    # What a pipeline UI shows: the metrics logged on the Metrics artifacts, counts on the datasets.
    assert run.metadata["train_metrics"]["sampled_test_accuracy"] == pytest.approx(train_metrics["test_accuracy"])
    assert run.metadata["train_metrics"]["val_accuracy"] == pytest.approx(train_metrics["val_accuracy"])
    infer_metrics = storage.open_published(run.outputs["embeddings"]).read_json("metrics.json")
    assert run.metadata["infer_metrics"]["test_accuracy"] == pytest.approx(infer_metrics["test_accuracy"])
    assert run.metadata["metrics"]["test_accuracy"] == pytest.approx(run.metrics["test_accuracy"])
    assert run.metadata["preprocessed"]["count_nodes.paper"] == BUNDLED_DEMO_NODES
    # Vertex AI Experiments shows one row per run, the Metrics artifacts merged: shared keys must agree.
    artifacts = [run.metadata[name] for name in ("train_metrics", "infer_metrics", "metrics")]
    for key in set.union(*(set(a) for a in artifacts)):
        assert len({a[key] for a in artifacts if key in a}) == 1, key


def test_bad_config_key_is_an_error_before_any_task(tmp_path):
    text = _demo_config(tmp_path).to_yaml().replace("training:\n", "training:\n  epochz: 3\n", 1)
    root = storage.parse_uri(tmp_path / "run")
    with pytest.raises(GnnflowError, match="key 'training.epochz': unknown key"):
        run_via_kfp_local(text, {}, root)
    with pytest.raises(GnnflowError, match="key 'training.epocs' does not name a config field"):
        run_via_kfp_local(_demo_config(tmp_path).to_yaml(), {"training.epocs": 3}, root)
    with pytest.raises(GnnflowError, match="unknown inference mode 'fast'"):
        run_via_kfp_local(_demo_config(tmp_path).to_yaml(), {}, root, infer_mode="fast")
    with pytest.raises(GnnflowError, match="set resources.runner: local"):
        run_via_kfp_local(_demo_config(tmp_path).to_yaml(), {"resources.runner": "vertex"}, root)
    assert not (tmp_path / "run").exists()  # no task ran, nothing was written


def test_a_task_given_a_bad_config_fails_naming_the_key(tmp_path, capfd):
    """What Vertex AI would see: the preprocess task itself rejects the parameter, in one line."""
    kfp.local.init(runner=kfp.local.SubprocessRunner(use_venv=False), pipeline_root=str(tmp_path / "root"))
    text = _demo_config(tmp_path).to_yaml().replace("model:\n", "model:\n  hiden_channels: 8\n", 1)
    preprocess = preprocess_component("python:3.11")
    with pytest.raises(RuntimeError, match="preprocess.*FAILURE"):
        preprocess(config=text, overrides=json.dumps({}), data_version="", image="python:3.11")
    out = capfd.readouterr().out
    assert "key 'model.hiden_channels': unknown key" in out
    assert "Traceback" not in out  # one line, not a stack trace
    assert not list((tmp_path / "root").rglob("manifest.json"))


def test_kfp_docker_is_refused_without_an_image_or_with_tables_the_containers_cannot_see(tmp_path, capsys):
    from pipelines.cli import main as gnnflow
    from pipelines.kfp_local import check_visible_in_containers

    assert gnnflow(["run", "--via", "kfp-docker", "--output", str(tmp_path / "run")]) == 2
    assert "--via kfp-docker runs every task in the step image: give --image IMAGE" in capsys.readouterr().err
    assert gnnflow(["run", "--image", "localhost/gnnflow/step:cpu", "--output", str(tmp_path / "run")]) == 2
    assert "--image applies to --via kfp-docker only" in capsys.readouterr().err
    assert not (tmp_path / "run").exists()  # refused before anything was written
    config = _demo_config(tmp_path)  # its tables lie in tmp_path/data
    with pytest.raises(GnnflowError, match=r"table 'paper' at .*/data/nodes.* is outside the run root .*/run, the only folder"):
        check_visible_in_containers(config, storage.parse_uri(tmp_path / "run"))
    check_visible_in_containers(config, storage.parse_uri(tmp_path))  # below the root: visible
