"""``gnnflow local-job``: the CustomJob tasks of a compiled Vertex pipeline, each replica started as
Vertex AI starts it (CLUSTER_SPEC, AIP_* directories, the pool's command), as local processes
with outputs on gs:// (the emulator). The demo's partition, train and infer as 2 replicas must
give the metrics of ``gnnflow run`` with the same config."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest
import yaml

from components import storage
from components.config import apply_overrides
from components.demo.graph import generate_demo_graph, write_demo_graph
from components.preprocess.step import preprocess
from components.serialize.step import serialize
from components.tables.proposal import propose_config
from pipelines.cli import main as gnnflow
from pipelines.local_job.spec import custom_job_tasks, read_job_task
from pipelines.local_run import run as gnnflow_run
from tests.small_graphs import demo_chance

pytestmark = pytest.mark.multiworker

IMAGE = "localhost/gnnflow/step:test"
# The proposal trains full-graph, one optimizer step an epoch, and infers exactly (--infer-mode auto).
EPOCHS = 30
FAST = {"training.epochs": EPOCHS, "resources.world_size": 2}


@pytest.fixture(scope="module")
def demo(tmp_path_factory, gcs_emulator):
    """A small demo graph preprocessed and serialized on gs://, its config, and the pipeline compiled for 2 replicas."""
    folder = tmp_path_factory.mktemp("local_job")
    nodes, edges = write_demo_graph(generate_demo_graph(1_200), folder / "data")
    config = propose_config(str(nodes), str(edges), id_column="node_id", src_column="src", dst_column="dst", label_column="label")
    config = apply_overrides(config, {**FAST, "resources.runner": "vertex"})
    config_file = folder / "config.yaml"
    config_file.write_text(config.to_yaml())
    bucket = f"job-{uuid.uuid4().hex[:12]}"
    gcs_emulator.create_bucket(bucket)
    root = storage.parse_uri(f"gs://{bucket}/run")
    preprocess(config, root.join("preprocess/preprocessed"))
    serialize(config, root.join("preprocess/preprocessed"), root.join("serialize/tfrecords"))
    pipeline = folder / "pipeline.yaml"
    assert gnnflow(["compile", "-o", str(pipeline), "--image", IMAGE, "--config", str(config_file)]) == 0
    return folder, config_file, root, pipeline


def _local_job(pipeline: Path, task: str, root, config_file: Path, *extra: str) -> int:
    return gnnflow(["local-job", str(pipeline), "--task", task, "--root", str(root), "--config", str(config_file), *extra])


@pytest.fixture(scope="module")
def chain(demo):
    """partition → train → infer, each as 2 replicas from the compiled spec."""
    _, config_file, root, pipeline = demo
    for task in ("partition", "train", "infer"):
        assert _local_job(pipeline, task, root, config_file) == 0, task
    return root


def test_the_compiled_spec_names_the_multi_replica_tasks_with_resolved_parameters(demo):
    _, config_file, root, pipeline = demo
    spec = yaml.safe_load(pipeline.read_text())
    assert custom_job_tasks(spec) == ["partition", "train", "infer"]
    placeholders = {"{{$.pipeline_google_cloud_project_id}}": "local", "{{$.pipeline_google_cloud_location}}": "local"}
    job = read_job_task(spec, "train", {"config": "x: 1"}, placeholders)
    assert [(pool.name, pool.replica_count) for pool in job.pools] == [("workerpool0", 1), ("workerpool1", 1)]
    assert job.world_size == 2 and job.pools[0].image_uri == IMAGE
    assert job.parameters["config"] == "x: 1" and job.parameters["overrides"] == "{}" and job.parameters["replicas"] == 2
    assert job.parameters["project"] == "local" and job.parameters["display_name"] == "gnnflow-train"
    assert {name: (ref.producer, ref.output_key) for name, ref in job.inputs.items()} == {"partitions": ("partition", "partitions")}
    assert job.outputs == {"model": "system.Model", "metrics": "system.Metrics"}


def test_two_replicas_give_the_metrics_of_gnnflow_run(demo, chain, tmp_path, capsys):
    _, config_file, _, _ = demo
    root = chain
    partitions = storage.open_published(root.join("partition/partitions"), step="partition")
    assert partitions.manifest.counts["partitions"] == 2
    job_train = storage.open_published(root.join("train/model"), step="train").read_json("metrics.json")
    job_infer = storage.open_published(root.join("infer/embeddings"), step="infer").read_json("metrics.json")
    # The same config with the workers inside the step (runner local), as gnnflow run runs it.
    direct = storage.parse_uri(tmp_path / "direct")
    gnnflow_run(str(config_file), str(direct), {"resources.runner": "local"})
    run_train = storage.open_published(direct.join("model"), step="train").read_json("metrics.json")
    run_infer = storage.open_published(direct.join("embeddings"), step="infer").read_json("metrics.json")
    assert job_train["epochs_run"] == run_train["epochs_run"] == EPOCHS
    assert job_infer["mode"] == "exact"
    assert job_train["val_accuracy"] == run_train["val_accuracy"]
    assert job_infer == run_infer  # the final test metrics, computed from the written predictions
    assert job_infer["test_accuracy"] >= 2 * demo_chance(1_200)  # and they are real: twice the largest class's share


def test_the_replicas_got_vertex_output_directories(chain):
    """train copies its curves to $AIP_TENSORBOARD_LOG_DIR, which lies under the job's base output directory."""
    curves = storage.list_files(chain.join("train/custom-job/logs"))
    assert [uri.name.startswith("events.out.tfevents.") for uri in curves] == [True]


def test_the_executor_output_describes_the_published_artifacts(demo, capsys):
    _, config_file, root, pipeline = demo
    out = root.join(f"again-{uuid.uuid4().hex[:6]}")
    assert _local_job(pipeline, "partition", root, config_file, "--output", f"partitions={out}") == 0
    printed = capsys.readouterr().out
    assert "local-job partition: 2 replica(s) as processes (workerpool0-0, workerpool1-0)" in printed
    assert "[workerpool1-0]" in printed and "starting ranks 1-1 of 2" in printed  # rank from CLUSTER_SPEC
    assert f"partitions {out}" in printed and "count_partitions=2" in printed
    assert storage.open_published(out, step="partition").manifest.counts["partitions"] == 2


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        (["--task", "report"], "task 'report' is not a Vertex AI CustomJob in this pipeline"),
        (["--task", "evaluate"], "the pipeline has no task 'evaluate'"),
        (["--task", "train", "--input", "tfrecords=gs://x/y"], "task 'train' has no artifact tfrecords"),
        (
            ["--task", "train", "--set", "resources.world_size=4"],
            "compiled for runner vertex with 2 replica(s), but the run's config asks for",
        ),
        (["--task", "train", "--set", "training.epochz=4"], "training.epochz"),
        (["--task", "train", "--grace-s", "-1"], "--grace-s must be 0 or more, got -1"),
    ],
)
def test_bad_requests_are_refused_before_any_replica_starts(demo, capsys, arguments, message):
    _, config_file, root, pipeline = demo
    assert gnnflow(["local-job", str(pipeline), "--root", str(root), "--config", str(config_file), *arguments]) == 2
    captured = capsys.readouterr()
    assert message in captured.err
    assert "replica(s) as" not in captured.out


def test_a_missing_input_is_refused_naming_its_uri(demo, capsys):
    _, config_file, root, pipeline = demo
    missing = root.join("nowhere/partitions")
    assert _local_job(pipeline, "train", root, config_file, "--input", f"partitions={missing}") == 2
    assert str(missing) in capsys.readouterr().err


def test_a_failing_replica_fails_the_job_naming_it_and_stops_the_others(demo, capsys):
    _, config_file, root, pipeline = demo
    # A published output of the wrong step: every replica's step refuses it.
    wrong = root.join("serialize/tfrecords")
    code = _local_job(pipeline, "train", root, config_file, "--input", f"partitions={wrong}", "--output", f"model={root.join('bad/model')}")
    assert code == 2
    err = capsys.readouterr().err
    assert "replica workerpool" in err and "exited with code" in err
    assert storage.list_files(root.join("bad/model")) == []  # nothing published, nothing left staged
