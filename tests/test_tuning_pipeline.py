"""The compiled tuning pipeline (``gnnflow compile --tuning``): the data steps, then gcpc's
HyperparameterTuningJobRunOp over the train image; its trials' command line; and its submission
with the real aiplatform client to the request recorder (tables and config on the GCS emulator)."""

from __future__ import annotations

import json
import pathlib

import pytest
import yaml

from components.config import load_config
from components.train import __main__ as train_main
from pipelines.cli import main as gnnflow
from pipelines.tune.vertex import pool_template, trial_specs
from tests.recording_server import TEST_IMAGE
from tests.test_submit import JOBS, vertex_args

pytestmark = pytest.mark.usefixtures("gcs_emulator")

SPACE = {
    "training.learning_rate": {"type": "float", "low": 0.001, "high": 0.05, "log": True},
    "training.batch_size": {"type": "int", "low": 64, "high": 512, "log": True},
    "training.fan_outs": {"type": "categorical", "choices": [[10, 5], [15, 10]]},
}
EXPECTED_PARAMETERS = [
    {
        "parameter_id": "training.learning_rate",
        "double_value_spec": {"min_value": 0.001, "max_value": 0.05},
        "scale_type": 2,  # UNIT_LOG_SCALE
        "conditional_parameter_specs": [],
    },
    {
        "parameter_id": "training.batch_size",
        "integer_value_spec": {"min_value": "64", "max_value": "512"},  # int64 in proto JSON: strings
        "scale_type": 2,
        "conditional_parameter_specs": [],
    },
    {
        "parameter_id": "training.fan_outs",
        "categorical_value_spec": {"values": ["[10,5]", "[15,10]"]},
        "scale_type": 0,  # unspecified: categorical values have no scale
        "conditional_parameter_specs": [],
    },
]


def _config(folder: pathlib.Path, extra: str = "") -> pathlib.Path:
    (folder / "nodes.csv").write_text("node_id,label,f0\na,0,0.5\nb,1,1.5\n")
    (folder / "edges.csv").write_text("src,dst\na,b\n")
    path = folder / "config.yaml"
    path.write_text(
        "graph:\n  nodes: [{type: paper, uri: nodes.csv, label_column: label, features: [{columns: [f0]}]}]\n"
        "  edges: [{type: cites, uri: edges.csv, src_type: paper, dst_type: paper}]\n"
        "model: {num_layers: 2}\ntraining: {fan_outs: [10, 5]}\n" + extra
    )
    return path


@pytest.fixture(scope="module")
def compiled(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict, pathlib.Path]:
    folder = tmp_path_factory.mktemp("tuning")
    space = folder / "space.yaml"
    space.write_text(yaml.safe_dump(SPACE, sort_keys=False))
    package = folder / "tuning.yaml"
    argv = ["compile", "--tuning", "--config", str(_config(folder)), "--space", str(space), "--trials", "6", "--parallel", "2"]
    assert gnnflow([*argv, "--image", TEST_IMAGE, "-o", str(package)]) == 0
    return yaml.safe_load(package.read_text()), package


def _constant(task: dict, name: str):
    return task["inputs"]["parameters"][name]["runtimeValue"]["constant"]


def test_tuning_pipeline_runs_the_data_steps_then_the_tuning_job(compiled):
    spec, _ = compiled
    tasks = spec["root"]["dag"]["tasks"]
    assert set(tasks) == {"preprocess", "serialize", "partition", "trial-specs", "hyperparameter-tuning-job"}
    assert set(spec["root"]["inputDefinitions"]["parameters"]) == {"config", "overrides", "data_version", "infer_mode"}
    job = tasks["hyperparameter-tuning-job"]
    assert job["componentRef"]["name"] == "comp-hyperparameter-tuning-job"
    executor = spec["deploymentSpec"]["executors"]["exec-hyperparameter-tuning-job"]["container"]
    assert executor["command"][-1] == "google_cloud_pipeline_components.container.v1.hyperparameter_tuning_job.launcher"
    assert _constant(job, "study_spec_parameters") == EXPECTED_PARAMETERS
    assert _constant(job, "study_spec_metrics") == [{"metric_id": "val_accuracy", "goal": 1}]  # MAXIMIZE
    assert (_constant(job, "max_trial_count"), _constant(job, "parallel_trial_count"), _constant(job, "max_failed_trial_count")) == (
        6,
        2,
        6,
    )
    assert _constant(job, "base_output_directory") == "{{$.pipeline_root}}/{{$.pipeline_job_uuid}}/tuning"
    assert job["inputs"]["parameters"]["worker_pool_specs"]["taskOutputParameter"] == {
        "outputParameterKey": "Output",
        "producerTask": "trial-specs",
    }
    specs = tasks["trial-specs"]["inputs"]
    assert specs["artifacts"]["partitions"]["taskOutputArtifact"] == {"outputArtifactKey": "partitions", "producerTask": "partition"}
    template = json.loads(specs["parameters"]["template"]["runtimeValue"]["constant"])
    assert template["image_uri"] == TEST_IMAGE and template["replica_count"] == 1
    assert specs["parameters"]["metric"]["runtimeValue"]["constant"] == "val_accuracy"
    images = {
        e["container"]["image"] for name, e in spec["deploymentSpec"]["executors"].items() if name != "exec-hyperparameter-tuning-job"
    }
    assert images == {TEST_IMAGE}


def test_trial_container_runs_train_with_the_trial_parameters_as_overrides(tmp_path):
    config = load_config(str(_config(tmp_path, "resources: {world_size: 3, runner: vertex}\n")))
    template = json.dumps(pool_template(config.resources, TEST_IMAGE))
    pools = trial_specs(config.to_yaml(), '{"training.epochs": 4}', "gs://bucket/root/partitions", template, "val_accuracy")
    assert [p["replica_count"] for p in pools] == [1, 2]  # chief + workers, as the pipeline's CustomJobs
    container = pools[0]["container_spec"]
    assert container["image_uri"] == TEST_IMAGE and container["command"] == ["python3", "-m", "components.train"]
    args = container["args"]
    assert args[args.index("--input") + 1] == "gs://bucket/root/partitions"
    assert args[args.index("--hypertune-metric") + 1] == "val_accuracy"
    assert args[args.index("--set") + 1] == "training.evaluate_test=false"
    assert yaml.safe_load(args[args.index("--config-yaml") + 1])["training"]["epochs"] == 4  # the run's overrides, resolved
    # What Vertex AI appends to the container's args for a trial: train reads them as overrides.
    _, overrides = train_main.parse_args(
        [*args, "--training.learning_rate=0.0123", "--training.batch_size=128", "--training.fan_outs=[15,10]"]
    )
    assert overrides == {
        "training.evaluate_test": False,
        "training.learning_rate": 0.0123,
        "training.batch_size": 128,
        "training.fan_outs": [15, 10],
    }


def test_compile_tuning_refuses_a_bad_space_naming_the_key(tmp_path, capsys):
    space = tmp_path / "space.yaml"
    space.write_text("training.learning_rat: {type: float, low: 0.001, high: 0.1}\n")
    package = tmp_path / "tuning.yaml"
    argv = ["compile", "--tuning", "--config", str(_config(tmp_path)), "--space", str(space), "--trials", "2", "--image", TEST_IMAGE]
    assert gnnflow([*argv, "-o", str(package)]) == 2
    assert "key 'training.learning_rat' does not name a config field" in capsys.readouterr().err
    assert not package.exists()
    assert gnnflow(["compile", "--tuning", "--config", str(_config(tmp_path)), "-o", str(package)]) == 2
    assert "compile --tuning needs --config" in capsys.readouterr().err


def test_tuning_pipeline_submission_sends_the_study_to_vertex(recorder, gcs_bucket, config_uri, tmp_path, capsys):
    package = tmp_path / "tuning.yaml"
    argv = ["compile", "--tuning", "--config", config_uri, "--trials", "4", "--image", TEST_IMAGE, "-o", str(package)]
    assert gnnflow(argv) == 0
    code = gnnflow(
        ["submit", "--config", config_uri, "--package", str(package), "--job-id", "gnnflow-tune-1", *vertex_args(recorder, gcs_bucket)]
    )
    assert code == 0
    assert capsys.readouterr().out.strip() == "projects/demo-project/locations/europe-west4/pipelineJobs/gnnflow-tune-1"
    [post] = recorder.seen("POST", JOBS)
    assert post.query["pipelineJobId"] == ["gnnflow-tune-1"]
    spec = post.json["pipelineSpec"]
    assert spec["pipelineInfo"]["name"] == "gnnflow-tuning"
    job = spec["root"]["dag"]["tasks"]["hyperparameter-tuning-job"]
    # No --space: the default space of node classification was compiled.
    ids = [p["parameter_id"] for p in _constant(job, "study_spec_parameters")]
    assert ids == ["training.learning_rate", "model.hidden_channels", "model.dropout", "training.weight_decay", "training.fan_outs"]
    assert _constant(job, "max_trial_count") == 4
    assert yaml.safe_load(post.json["runtimeConfig"]["parameterValues"]["config"]) == load_config(config_uri).model_dump(mode="json")
