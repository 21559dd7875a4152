"""The compiled tuning pipeline (``gnnflow compile --tuning``): the data steps, then gcpc's
HyperparameterTuningJobRunOp over the train image; its trials' command line; and its submission
with the real aiplatform client to the request recorder (tables and config on the GCS emulator)."""

from __future__ import annotations

import csv
import io
import json
import pathlib
import re

import pytest
import yaml

from components import storage
from components.config import apply_overrides, load_config
from components.train import __main__ as train_main
from pipelines.cli import main as gnnflow
from pipelines.tune.tuning_job import trial_scheduling
from pipelines.tune.vertex import pool_template, trial_specs
from tests.recording_server import TEST_IMAGE, RecordingServer
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
    assert set(tasks) == {"preprocess", "serialize", "partition", "trial-specs", "hyperparameter-tuning-job", "best-config"}
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
    assert ids == [
        "training.learning_rate",
        "model.hidden_channels",
        "model.dropout",
        "training.weight_decay",
        "training.weight_decay_scope",
        "model.type",
        "training.mode",
    ]
    # Conditional keys nest under the key they name, with the parent's values that turn them on.
    nested = {
        c["parameter_spec"]["parameter_id"]: (p["parameter_id"], sorted(c["parent_categorical_values"]["values"]))
        for p in _constant(job, "study_spec_parameters")
        for c in p.get("conditional_parameter_specs", [])
    }
    assert nested["training.fan_outs"] == ("training.mode", ["sampled"])
    assert nested["model.propagation_steps"] == ("model.type", ["appnp"])
    assert nested["model.identity_strength"] == ("model.type", ["gcnii"])
    assert _constant(job, "max_trial_count") == 4
    assert yaml.safe_load(post.json["runtimeConfig"]["parameterValues"]["config"]) == load_config(config_uri).model_dump(mode="json")


# ------------------------------------------------------------------ the trials' CustomJob setup

SCHEDULED = """resources:
  runner: vertex
  world_size: 2
  strategy: spot
  custom_job:
    timeout_s: 7200
    service_account: trainer@demo-project.iam.gserviceaccount.com
    tensorboard: projects/demo-project/locations/europe-west4/tensorboards/42
"""


def _as_backend_renders(value: object) -> object:
    """A constant as the pipeline backend writes it into a placeholder: the spec stores numbers as
    doubles, and a whole double is written without a fraction (goal ``1``, not ``1.0``)."""
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, list):
        return [_as_backend_renders(v) for v in value]
    if isinstance(value, dict):
        return {k: _as_backend_renders(v) for k, v in value.items()}
    return value


def _payload(spec: dict, task: dict, worker_pool_specs: list) -> dict:
    """The tuning-job executor's ``--payload`` as the KFP backend renders it from the task's inputs."""
    args = spec["deploymentSpec"]["executors"]["exec-hyperparameter-tuning-job"]["container"]["args"]
    pieces = json.loads(args[args.index("--payload") + 1])["Concat"]
    values = {name: _constant(task, name) for name in task["inputs"]["parameters"] if name != "worker_pool_specs"}
    values["worker_pool_specs"] = worker_pool_specs

    def render(piece: str) -> str:
        match = re.fullmatch(r"\{\{\$\.inputs\.parameters\['(\w+)'\]\}\}", piece)
        if match is None:
            return piece
        value = values[match[1]]
        return value if isinstance(value, str) else json.dumps(_as_backend_renders(value))

    return json.loads("".join(render(p) for p in pieces))


def test_the_trials_are_scheduled_as_trains_custom_job_and_upload_to_the_tensorboard(tmp_path):
    """strategy, restarts, timeout, TensorBoard and service account reach each trial's CustomJob spec."""
    from google.cloud.aiplatform_v1 import HyperparameterTuningJob

    config_path = _config(tmp_path, SCHEDULED)
    package = tmp_path / "tuning.yaml"
    argv = ["compile", "--tuning", "--config", str(config_path), "--trials", "3", "--image", TEST_IMAGE, "-o", str(package)]
    assert gnnflow(argv) == 0
    spec = yaml.safe_load(package.read_text())
    job = spec["root"]["dag"]["tasks"]["hyperparameter-tuning-job"]
    assert _constant(job, "scheduling") == {"strategy": "SPOT", "restart_job_on_worker_restart": True, "timeout": "7200s"}
    assert _constant(job, "tensorboard") == "projects/demo-project/locations/europe-west4/tensorboards/42"
    assert _constant(job, "service_account") == "trainer@demo-project.iam.gserviceaccount.com"
    config = load_config(str(config_path))
    template = _constant(spec["root"]["dag"]["tasks"]["trial-specs"], "template")
    pools = trial_specs(config.to_yaml(), "{}", "gs://bucket/root/partitions", template, "val_accuracy")
    payload = _payload(spec, job, pools)
    parsed = HyperparameterTuningJob(payload)  # what the launcher sends: a valid request
    trial_job = parsed.trial_job_spec
    assert trial_job.scheduling.strategy.name == "SPOT" and trial_job.scheduling.restart_job_on_worker_restart
    assert trial_job.scheduling.timeout.total_seconds() == 7200
    assert trial_job.tensorboard == "projects/demo-project/locations/europe-west4/tensorboards/42"
    assert trial_job.service_account == "trainer@demo-project.iam.gserviceaccount.com"
    assert trial_job.base_output_directory.output_uri_prefix == "{{$.pipeline_root}}/{{$.pipeline_job_uuid}}/tuning"
    assert [p.replica_count for p in trial_job.worker_pool_specs] == [1, 1]
    assert (parsed.max_trial_count, parsed.max_failed_trial_count) == (3, 3)
    assert [p.parameter_id for p in parsed.study_spec.parameters][0] == "training.learning_rate"
    # The best-config task follows the job, reading the job it names.
    best = spec["root"]["dag"]["tasks"]["best-config"]
    assert best["inputs"]["parameters"]["gcp_resources"]["taskOutputParameter"] == {
        "outputParameterKey": "gcp_resources",
        "producerTask": "hyperparameter-tuning-job",
    }
    assert set(spec["components"]["comp-best-config"]["outputDefinitions"]["artifacts"]) == {"study", "best_config"}
    assert _constant(best, "metric") == "val_accuracy"
    # Without those keys the trials get Vertex AI's defaults: standard, restarts on, no timeout.
    assert trial_scheduling(load_config(str(_config(tmp_path))).resources) == {
        "strategy": "STANDARD",
        "restart_job_on_worker_restart": True,
    }


# ------------------------------------------------------------------ the study it publishes

JOB = "projects/demo-project/locations/europe-west4/hyperparameterTuningJobs/8123"


def _trial(trial_id: str, state: str, rate: float, batch: float, fan_outs: str, value: float | None, **extra: object) -> dict:
    """A trial as Vertex AI's REST API returns it (int parameters arrive as doubles, choices as text)."""
    trial: dict = {
        "id": trial_id,
        "state": state,
        "parameters": [
            {"parameterId": "training.learning_rate", "value": rate},
            {"parameterId": "training.batch_size", "value": batch},
            {"parameterId": "training.fan_outs", "value": fan_outs},
        ],
        "startTime": "2026-11-27T10:00:00Z",
        "endTime": "2026-11-27T10:03:30.500Z",
        **extra,
    }
    if value is not None:
        trial["finalMeasurement"] = {"stepCount": "4", "metrics": [{"metricId": "val_accuracy", "value": value}]}
    return trial


RECORDED_TRIALS = [
    _trial("1", "SUCCEEDED", 0.004, 128.0, "[10,5]", 0.71),
    _trial("2", "SUCCEEDED", 0.0215, 256.0, "[15,10]", 0.83),
    _trial("3", "INFEASIBLE", 0.04, 64.0, "[10,5]", None, infeasibleReason="The replica workerpool0-0 exited with a non-zero status of 2."),
    _trial("4", "SUCCEEDED", 0.03, 512.0, "[15,10]", 0.83),  # ties trial 2: the earlier one wins, as locally
]


def test_the_best_config_task_publishes_the_study_from_the_jobs_trials(tmp_path):
    """The task's function on recorded trial results: Vertex AI's job read through the real client
    from the request recorder, the best trial's parameters applied to the run's config."""
    from kfp.dsl import Artifact

    from pipelines.tune.space import load_space
    from pipelines.tune.vertex_study import space_json
    from pipelines.tuning_pipeline import best_config

    space_file = tmp_path / "space.yaml"
    space_file.write_text(yaml.safe_dump(SPACE, sort_keys=False))
    config = load_config(str(_config(tmp_path)))
    space = load_space(str(space_file), config)
    study, best = Artifact(name="study", uri=str(tmp_path / "study")), Artifact(name="best_config", uri=str(tmp_path / "best.yaml"))
    with RecordingServer() as server:
        server.route("GET", f"/v1/{JOB}", (200, {"name": JOB, "state": "JOB_STATE_SUCCEEDED", "trials": RECORDED_TRIALS}))
        resources = json.dumps({"resources": [{"resourceType": "HyperparameterTuningJob", "resourceUri": f"{server.url}/v1/{JOB}"}]})
        best_config(config.to_yaml(), '{"training.epochs": 4}', resources, space_json(space), "val_accuracy", study, best)
        assert [r.path for r in server.seen()] == [f"/v1/{JOB}"]

    chosen = load_config(str(tmp_path / "best.yaml"))  # gnnflow run --config takes it
    assert (chosen.training.learning_rate, chosen.training.batch_size, chosen.training.fan_outs) == (0.0215, 256, [15, 10])
    assert chosen.training.epochs == 4  # the run's own overrides, as the trials trained with
    assert (
        chosen.model_dump()
        == apply_overrides(
            config, {"training.epochs": 4, "training.learning_rate": 0.0215, "training.batch_size": 256, "training.fan_outs": [15, 10]}, "t"
        ).model_dump()
    )
    text = (tmp_path / "best.yaml").read_text()
    assert text.startswith("# gnnflow tune: the best of 4 trial(s) by val_accuracy (validation):\n# trial 2, 0.8300, with\n")
    published = storage.open_published(tmp_path / "study", step="tune")
    assert published.read_bytes("best_config.yaml").decode() == text
    rows = list(csv.DictReader(io.StringIO(published.read_bytes("trials.csv").decode())))
    assert [(r["trial"], r["state"], r["training.batch_size"], r["val_accuracy"], r["epochs_run"]) for r in rows] == [
        ("1", "COMPLETE", "128", "0.71", "4"),
        ("2", "COMPLETE", "256", "0.83", "4"),
        ("3", "FAIL", "64", "", ""),
        ("4", "COMPLETE", "512", "0.83", "4"),
    ]
    assert rows[2]["error"] == "The replica workerpool0-0 exited with a non-zero status of 2." and rows[0]["seconds"] == "210.5"
    assert published.manifest.counts == {"trials": 4, "complete": 3}
    assert study.metadata["best_trial"] == 2 and best.metadata["val_accuracy"] == 0.83


def test_the_best_config_task_fails_naming_the_job_when_every_trial_failed(tmp_path, caplog):
    from kfp.dsl import Artifact

    from pipelines.tune.space import load_space
    from pipelines.tune.vertex_study import space_json
    from pipelines.tuning_pipeline import best_config

    space_file = tmp_path / "space.yaml"
    space_file.write_text(yaml.safe_dump(SPACE, sort_keys=False))
    config = load_config(str(_config(tmp_path)))
    failed = [t for t in RECORDED_TRIALS if t["state"] != "SUCCEEDED"]
    study, best = Artifact(name="study", uri=str(tmp_path / "study")), Artifact(name="best_config", uri=str(tmp_path / "best.yaml"))
    with RecordingServer() as server:
        server.route("GET", f"/v1/{JOB}", (200, {"name": JOB, "trials": failed}))
        resources = json.dumps({"resources": [{"resourceType": "HyperparameterTuningJob", "resourceUri": f"{server.url}/v1/{JOB}"}]})
        with pytest.raises(SystemExit) as exit_:
            best_config(config.to_yaml(), "{}", resources, space_json(load_space(str(space_file), config)), "val_accuracy", study, best)
    assert exit_.value.code == 2
    assert "every one of the 1 trial(s) failed; trial 3: The replica workerpool0-0 exited" in caplog.text
    assert not (tmp_path / "best.yaml").exists() and not (tmp_path / "study" / "manifest.json").exists()
