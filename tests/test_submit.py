"""`gnnflow submit`: the real aiplatform and kfp clients against a local recording endpoint.

Inputs live on the GCS emulator; the Vertex AI / KFP APIs are `tests.recording_server`. The
assertions read what the clients actually sent.
"""

from __future__ import annotations

import json

import pytest
import yaml

from components import storage
from components.config import load_config
from pipelines.cli import main as gnnflow
from pipelines.submit import RunRequest, prepare_run
from tests.recording_server import TEST_IMAGE, RecordingServer, add_kfp_routes, add_metadata_routes, add_vertex_routes

STEPS = {"preprocess", "serialize", "partition", "train", "infer", "report"}
JOBS = r"/v1/projects/demo-project/locations/europe-west4/pipelineJobs"


# The session's GCS emulator also points metadata, gRPC proxy and GCE lookups at a closed
# loopback port (conftest's _GCS_TEST_ENVIRONMENT): nothing here can leave the machine.
pytestmark = pytest.mark.usefixtures("gcs_emulator")


def vertex_args(recorder: RecordingServer, bucket: str, *extra: str) -> list[str]:
    return [
        "--project",
        "demo-project",
        "--region",
        "europe-west4",
        "--pipeline-root",
        f"gs://{bucket}/pipeline-root",
        "--api-endpoint",
        recorder.url,
        *extra,
    ]


def test_vertex_submission_sends_spec_parameters_account_labels_and_root(recorder, gcs_bucket, config_uri, package, capsys):
    code = gnnflow(
        [
            "submit",
            "--config",
            config_uri,
            "--set",
            "training.epochs=5",
            "--display-name",
            "nightly",
            "--label",
            "team=graphs",
            "--label",
            "env=test",
            "--service-account",
            "runner@demo-project.iam.gserviceaccount.com",
            "--job-id",
            "gnnflow-test-1",
            *vertex_args(recorder, gcs_bucket),
        ]
    )
    assert code == 0
    assert capsys.readouterr().out.strip() == "projects/demo-project/locations/europe-west4/pipelineJobs/gnnflow-test-1"

    [post] = recorder.seen("POST", JOBS)
    assert post.query["pipelineJobId"] == ["gnnflow-test-1"]
    assert "authorization" not in post.headers  # plain HTTP: anonymous, no credentials sent
    job = post.json
    assert job["displayName"] == "nightly"
    assert job["serviceAccount"] == "runner@demo-project.iam.gserviceaccount.com"
    assert job["labels"] == {"team": "graphs", "env": "test"}
    assert job["runtimeConfig"]["gcsOutputDirectory"] == f"gs://{gcs_bucket}/pipeline-root"
    spec = job["pipelineSpec"]
    assert spec["pipelineInfo"]["name"] == "gnnflow"
    assert set(spec["root"]["dag"]["tasks"]) == STEPS
    images = {e["container"]["image"] for e in spec["deploymentSpec"]["executors"].values()}
    assert images == {"gnnflow:latest"}  # compiled now, for the default image
    assert [t["cachingOptions"] for t in spec["root"]["dag"]["tasks"].values()] == [{"enableCache": True}] * 6

    parameters = job["runtimeConfig"]["parameterValues"]
    assert set(parameters) == {"config", "overrides", "data_version", "infer_mode"}
    assert yaml.safe_load(parameters["config"]) == load_config(config_uri).model_dump(mode="json")
    assert json.loads(parameters["overrides"]) == {"training.epochs": 5}
    assert parameters["data_version"].startswith("sha256:") and len(parameters["data_version"]) == 39
    assert parameters["infer_mode"] == "auto"


def test_experiment_is_created_and_the_run_joins_it(recorder, gcs_bucket, config_uri, package, capsys):
    """--experiment: what the SDK's PipelineJob.submit(experiment=...) sends. Vertex AI then lists the
    run in the experiment with the metadata of its system.Metrics artifacts (report's: the final metrics)."""
    add_metadata_routes(recorder)
    assert (
        gnnflow(
            [
                "submit",
                "--config",
                config_uri,
                "--package",
                package,
                "--job-id",
                "gnnflow-exp-1",
                "--experiment",
                "gnn-sweeps",
                "--service-account",
                "runner@demo-project.iam.gserviceaccount.com",
                *vertex_args(recorder, gcs_bucket),
            ]
        )
        == 0
    )
    job = "projects/demo-project/locations/europe-west4/pipelineJobs/gnnflow-exp-1"
    assert capsys.readouterr().out.strip() == job
    store = "/v1/projects/demo-project/locations/europe-west4/metadataStores/default"
    [created] = recorder.seen("POST", store + "/contexts")
    assert created.query["contextId"] == ["gnn-sweeps"]
    assert created.json["schemaTitle"] == "system.Experiment" and created.json["displayName"] == "gnn-sweeps"
    [post] = recorder.seen("POST", JOBS)
    assert post.query["pipelineJobId"] == ["gnnflow-exp-1"]
    assert post.json["serviceAccount"] == "runner@demo-project.iam.gserviceaccount.com"
    assert post.json["runtimeConfig"]["parameterValues"]["infer_mode"] == "auto"
    [link] = recorder.seen("POST", store + "/contexts/gnn-sweeps:addContextChildren")
    assert link.json == {"childContexts": [f"{store[4:]}/contexts/gnnflow-exp-1"]}  # the run's system.PipelineRun context
    order = [r.path for r in recorder.requests if r.method == "POST"]
    assert order.index(created.path) < order.index(post.path) < order.index(link.path)  # the experiment first, the link last
    assert all("authorization" not in r.headers for r in recorder.requests)

    # The experiment exists now: a second run joins it without creating it again.
    assert (
        gnnflow(
            [
                "submit",
                "--config",
                config_uri,
                "--package",
                package,
                "--job-id",
                "gnnflow-exp-2",
                "--experiment",
                "gnn-sweeps",
                *vertex_args(recorder, gcs_bucket),
            ]
        )
        == 0
    )
    assert len(recorder.seen("POST", store + "/contexts")) == 1
    assert len(recorder.seen("POST", store + "/contexts/gnn-sweeps:addContextChildren")) == 2


def test_experiment_name_and_schedule_misuse_are_refused_before_sending(recorder, gcs_bucket, config_uri, package, capsys):
    assert (
        gnnflow(["submit", "--config", config_uri, "--package", package, "--experiment", "GNN_Sweeps", *vertex_args(recorder, gcs_bucket)])
        == 2
    )
    assert "--experiment 'GNN_Sweeps': a Vertex AI Experiment name is lower-case letters" in capsys.readouterr().err
    assert (
        gnnflow(
            [
                "schedule",
                "create",
                "--config",
                config_uri,
                "--package",
                package,
                "--cron",
                "0 3 * * *",
                "--experiment",
                "gnn-sweeps",
                *vertex_args(recorder, gcs_bucket),
            ]
        )
        == 2
    )
    assert "a Vertex AI schedule cannot put its runs in an experiment" in capsys.readouterr().err
    assert not recorder.seen("POST")


def test_a_package_compiled_for_another_layout_is_refused_before_sending(recorder, gcs_bucket, config_uri, package, capsys):
    assert (
        gnnflow(
            [
                "submit",
                "--config",
                config_uri,
                "--package",
                package,
                "--set",
                "resources.runner=vertex",
                "--set",
                "resources.world_size=2",
                *vertex_args(recorder, gcs_bucket),
            ]
        )
        == 2
    )
    err = capsys.readouterr().err
    assert (
        f"pipeline package {package}: the pipeline was compiled for runner local, but the run's config asks for "
        "runner vertex with 2 replica(s)" in err
    )
    assert not recorder.seen("POST")


def test_a_given_package_is_sent_as_compiled_and_no_cache_disables_every_task(recorder, gcs_bucket, config_uri, package):
    assert (
        gnnflow(
            [
                "submit",
                "--config",
                config_uri,
                "--package",
                package,
                "--no-cache",
                "--infer-mode",
                "exact",
                *vertex_args(recorder, gcs_bucket),
            ]
        )
        == 0
    )
    [post] = recorder.seen("POST", JOBS)
    spec = post.json["pipelineSpec"]
    assert {e["container"]["image"] for e in spec["deploymentSpec"]["executors"].values()} == {TEST_IMAGE}
    assert [t["cachingOptions"] for t in spec["root"]["dag"]["tasks"].values()] == [{"enableCache": False}] * 6
    assert post.json["runtimeConfig"]["parameterValues"]["infer_mode"] == "exact"
    assert post.query["pipelineJobId"][0].startswith("gnnflow-")


def test_data_version_follows_the_table_files(gcs_bucket, config_uri):
    request = RunRequest(config=config_uri)
    first = prepare_run(request).parameters["data_version"]
    assert prepare_run(request).parameters["data_version"] == first
    # the same bytes rewritten at the same URI are a new object generation: new data for the cache
    storage.write_text(f"gs://{gcs_bucket}/raw/edges.csv", "src,dst\na,b\nb,c\n")
    second = prepare_run(request).parameters["data_version"]
    assert second != first
    storage.write_text(f"gs://{gcs_bucket}/raw/nodes/part-2.csv", "node_id,label,f0\nd,1,0.0\n")
    assert prepare_run(request).parameters["data_version"] not in (first, second)


def test_wait_exits_non_zero_naming_the_failed_job(gcs_bucket, config_uri, package, capsys):
    with RecordingServer() as recorder:
        add_vertex_routes(recorder, job_states=["PIPELINE_STATE_RUNNING", "PIPELINE_STATE_FAILED"])
        code = gnnflow(
            [
                "submit",
                "--config",
                config_uri,
                "--package",
                package,
                "--job-id",
                "gnnflow-doomed",
                "--wait",
                "--poll-seconds",
                "0.01",
                *vertex_args(recorder, gcs_bucket),
            ]
        )
        assert code == 2
        err = capsys.readouterr().err
        assert "projects/demo-project/locations/europe-west4/pipelineJobs/gnnflow-doomed ended PIPELINE_STATE_FAILED" in err
        assert "some tasks failed: train" in err
        assert len(recorder.seen("GET", JOBS + "/gnnflow-doomed")) == 2


def test_wait_returns_once_the_job_succeeded(recorder, gcs_bucket, config_uri, package, capsys):
    recorder_states = RecordingServer()
    with recorder_states:
        add_vertex_routes(recorder_states, job_states=["PIPELINE_STATE_RUNNING", "PIPELINE_STATE_RUNNING", "PIPELINE_STATE_SUCCEEDED"])
        assert (
            gnnflow(
                [
                    "submit",
                    "--config",
                    config_uri,
                    "--package",
                    package,
                    "--job-id",
                    "gnnflow-fine",
                    "--wait",
                    "--poll-seconds",
                    "0.01",
                    *vertex_args(recorder_states, gcs_bucket),
                ]
            )
            == 0
        )
        assert capsys.readouterr().out.split() == [
            "projects/demo-project/locations/europe-west4/pipelineJobs/gnnflow-fine",
            "PIPELINE_STATE_SUCCEEDED",
        ]
        assert len(recorder_states.seen("GET", JOBS + "/gnnflow-fine")) == 3


def test_kfp_submission_creates_the_experiment_and_the_run(recorder, config_uri, package, capsys):
    assert (
        gnnflow(
            [
                "submit",
                "--config",
                config_uri,
                "--package",
                package,
                "--kfp-host",
                recorder.url,
                "--experiment",
                "graphs",
                "--overrides",
                '{"training.epochs": 2}',
                "--display-name",
                "try-kfp",
                "--pipeline-root",
                "gs://kfp-artifacts/root",
                "--service-account",
                "pipeline-runner",
                "--wait",
                "--poll-seconds",
                "0.01",
            ]
        )
        == 0
    )
    assert capsys.readouterr().out.split()[-2:] == ["run-2", "SUCCEEDED"]
    assert recorder.seen("GET", "/apis/v2beta1/healthz")
    [lookup] = recorder.seen("GET", "/apis/v2beta1/experiments")
    assert json.loads(lookup.query["filter"][0])["predicates"][0]["stringValue"] == "graphs"
    [experiment] = recorder.seen("POST", "/apis/v2beta1/experiments")
    assert experiment.json["display_name"] == "graphs"
    [run] = recorder.seen("POST", "/apis/v2beta1/runs")
    body = run.json
    assert body["experiment_id"] == "experiment-1" and body["display_name"] == "try-kfp"
    assert body["service_account"] == "pipeline-runner"
    sent = body["pipeline_spec"]  # the pipeline spec, and the Kubernetes platform spec of the in-memory /dev/shm
    assert sent["pipeline_spec"]["pipelineInfo"]["name"] == "gnnflow"
    assert set(sent["pipeline_spec"]["root"]["dag"]["tasks"]) == STEPS
    mounts = sent["platform_spec"]["platforms"]["kubernetes"]["deploymentSpec"]["executors"]
    assert sorted(mounts) == ["exec-infer", "exec-partition", "exec-train"]
    assert body["runtime_config"]["pipeline_root"] == "gs://kfp-artifacts/root"
    parameters = body["runtime_config"]["parameters"]
    assert json.loads(parameters["overrides"]) == {"training.epochs": 2}
    assert yaml.safe_load(parameters["config"])["training"]["epochs"] == 3  # the file's text; the override travels apart
    assert parameters["data_version"].startswith("sha256:")
    assert recorder.seen("GET", "/apis/v2beta1/runs/run-2")


def test_kfp_wait_exits_non_zero_naming_the_failed_run(config_uri, package, capsys):
    with RecordingServer() as recorder:
        add_kfp_routes(recorder, run_states=["RUNNING", "FAILED"])
        assert (
            gnnflow(
                ["submit", "--config", config_uri, "--package", package, "--kfp-host", recorder.url, "--wait", "--poll-seconds", "0.01"]
            )
            == 2
        )
    assert "pipeline run run-2 ended FAILED: task train failed" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--region", "europe-west4", "--pipeline-root", "gs://b/root"], "Vertex AI needs --project"),
        (["--project", "p", "--region", "r"], "Vertex AI needs --pipeline-root"),
        (["--project", "p", "--region", "r", "--pipeline-root", "/tmp/root"], "--pipeline-root must be a gs:// URI"),
        (
            ["--project", "p", "--region", "r", "--pipeline-root", "gs://b/root", "--set", "training.epochz=3"],
            "key 'training.epochz' does not name a config field",
        ),
        (
            ["--project", "p", "--region", "r", "--pipeline-root", "gs://b/root", "--set", "training.epochs=-1"],
            "key 'training.epochs': Input should be greater than 0",
        ),
        (["--project", "p", "--region", "r", "--pipeline-root", "gs://b/root", "--overrides", "[1]"], "--overrides must be a JSON object"),
        (["--project", "p", "--region", "r", "--pipeline-root", "gs://b/root", "--label", "Team"], "--label 'Team': expected KEY=VALUE"),
        (["--kfp-host", "kfp.example:8080"], "--kfp-host must start with http:// or https://"),
        (["--kfp-host", "http://127.0.0.1:9", "--label", "a=b"], "labels are a Vertex AI feature"),
    ],
)
def test_bad_submissions_fail_before_sending_anything(recorder, config_uri, package, capsys, extra, message):
    assert gnnflow(["submit", "--config", config_uri, "--package", package, "--api-endpoint", recorder.url, *extra]) == 2
    assert message in capsys.readouterr().err
    assert not recorder.seen("POST")


def test_bad_config_files_fail_naming_the_key_or_uri(recorder, gcs_bucket, config_uri, package, tmp_path, capsys):
    text = storage.read_text(config_uri)
    storage.write_text(f"gs://{gcs_bucket}/bad.yaml", text.replace("training: {epochs: 3}", "training: {epochs: 3, epoks: 4}"))
    local_tables = tmp_path / "local.yaml"
    local_tables.write_text(text.replace(f"gs://{gcs_bucket}/raw/edges.csv", "edges.csv"))
    cases = [
        (f"gs://{gcs_bucket}/bad.yaml", "key 'training.epoks': unknown key"),
        (f"gs://{gcs_bucket}/missing.yaml", f"gs://{gcs_bucket}/missing.yaml does not exist"),
        (str(local_tables), f"graph.edges[0].uri '{tmp_path / 'edges.csv'}' is not a gs:// URI"),
    ]
    for config, message in cases:
        assert gnnflow(["submit", "--config", config, "--package", package, *vertex_args(recorder, gcs_bucket)]) == 2
        assert message in capsys.readouterr().err
    storage.delete(f"gs://{gcs_bucket}/raw/edges.csv")
    assert gnnflow(["submit", "--config", config_uri, "--package", package, *vertex_args(recorder, gcs_bucket)]) == 2
    assert f"input gs://{gcs_bucket}/raw/edges.csv does not exist" in capsys.readouterr().err
    assert not recorder.seen("POST")


def test_missing_pipeline_root_bucket_or_foreign_package_sends_nothing(recorder, gcs_bucket, config_uri, package, tmp_path, capsys):
    args = ["--project", "p", "--region", "us-central1", "--api-endpoint", recorder.url]
    assert gnnflow(["submit", "--config", config_uri, "--package", package, "--pipeline-root", "gs://no-such-bucket-here/root", *args]) == 2
    assert "bucket gs://no-such-bucket-here does not exist" in capsys.readouterr().err
    other = tmp_path / "other.yaml"
    other.write_text(open(package).read().replace("data_version", "data_revision"))
    assert gnnflow(["submit", "--config", config_uri, "--package", str(other), "--pipeline-root", f"gs://{gcs_bucket}/r", *args]) == 2
    assert "lacks the parameter(s) data_version" in capsys.readouterr().err
    assert not recorder.seen("POST")
    # a user without storage.buckets.get skips the check explicitly
    assert (
        gnnflow(
            [
                "submit",
                "--config",
                config_uri,
                "--package",
                package,
                "--pipeline-root",
                "gs://no-such-bucket-here/root",
                "--no-root-check",
                *args,
            ]
        )
        == 0
    )
    assert len(recorder.seen("POST")) == 1


def test_service_errors_name_the_job(gcs_bucket, config_uri, package, capsys):
    with RecordingServer() as recorder:
        recorder.route(
            "POST",
            JOBS,
            (403, {"error": {"code": 403, "message": "Permission 'aiplatform.pipelineJobs.create' denied", "status": "PERMISSION_DENIED"}}),
        )
        assert (
            gnnflow(
                ["submit", "--config", config_uri, "--package", package, "--job-id", "gnnflow-denied", *vertex_args(recorder, gcs_bucket)]
            )
            == 2
        )
    err = capsys.readouterr().err
    assert "Vertex AI refused pipeline job gnnflow-denied: 403" in err
    assert "Permission 'aiplatform.pipelineJobs.create' denied" in err
