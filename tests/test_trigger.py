"""`pipelines.trigger`: Pub/Sub push envelopes, CloudEvents and plain payloads in, one Vertex AI
or KFP run out, through the real clients against a local recording endpoint."""

from __future__ import annotations

import base64
import json
import os
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from http.server import ThreadingHTTPServer

import pytest
import yaml

from components.config import load_config
from components.errors import GnnflowError
from components.preprocess.step import preprocess
from pipelines.submit import KfpTarget, VertexTarget
from pipelines.trigger import TriggerSettings, cloud_function, handle
from pipelines.trigger.__main__ import make_server
from pipelines.trigger.handler import respond
from tests.gcs_emulator import free_port
from tests.recording_server import RecordingServer

JOBS = "/v1/projects/demo-project/locations/us-central1/pipelineJobs"


# The session's GCS emulator also points metadata, gRPC proxy and GCE lookups at a closed
# loopback port (conftest's _GCS_TEST_ENVIRONMENT): nothing here can leave the machine.
pytestmark = pytest.mark.usefixtures("gcs_emulator")


@pytest.fixture
def settings(recorder: RecordingServer, gcs_bucket: str, package: str) -> TriggerSettings:
    return TriggerSettings(
        VertexTarget("demo-project", "us-central1", f"gs://{gcs_bucket}/root", "runner@demo-project.iam.gserviceaccount.com", recorder.url),
        package=package,
    )


@pytest.fixture
def trigger_url(settings: TriggerSettings) -> Iterator[str]:
    server: ThreadingHTTPServer = make_server(settings, 0, "127.0.0.1")
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def post(url: str, body: bytes | dict, headers: dict[str, str] | None = None) -> tuple[int, dict]:
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    request = urllib.request.Request(url, data=data, method="POST", headers={"Content-Type": "application/json", **(headers or {})})
    try:
        with urllib.request.urlopen(request, timeout=60) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read())


def pubsub(payload: dict | bytes, message_id: str = "1234567890") -> dict:
    data = payload if isinstance(payload, bytes) else json.dumps(payload).encode()
    return {
        "message": {"data": base64.b64encode(data).decode(), "messageId": message_id, "attributes": {}},
        "subscription": "projects/demo-project/subscriptions/gnnflow-trigger",
    }


def test_handle_submits_the_config_text_overrides_and_data_version(recorder, settings, config_uri):
    run = handle({"config_uri": config_uri, "overrides": {"training.epochs": 9}, "labels": {"source": "scheduler"}}, settings)
    [sent] = recorder.seen("POST", JOBS)
    assert run.name == f"{JOBS[4:]}/{sent.query['pipelineJobId'][0]}"
    job = sent.json
    parameters = job["runtimeConfig"]["parameterValues"]
    assert yaml.safe_load(parameters["config"])["graph"]["edges"][0]["uri"].endswith("/raw/edges.csv")
    assert json.loads(parameters["overrides"]) == {"training.epochs": 9}
    assert parameters["data_version"] == run.parameters["data_version"] and parameters["data_version"].startswith("sha256:")
    assert job["labels"] == {"source": "scheduler"}
    assert job["serviceAccount"] == "runner@demo-project.iam.gserviceaccount.com"
    assert set(job["pipelineSpec"]["root"]["dag"]["tasks"]) == {"preprocess", "serialize", "partition", "train", "infer", "report"}


def test_pubsub_push_is_answered_with_the_job_and_redelivery_submits_nothing_new(recorder, trigger_url, config_uri):
    envelope = pubsub({"config_uri": config_uri, "overrides": '{"training.epochs": 4}', "display_name": "from-scheduler"})
    status, reply = post(trigger_url, envelope)
    assert status == 200
    assert reply["job"] == "projects/demo-project/locations/us-central1/pipelineJobs/gnnflow-msg-1234567890"
    assert reply["display_name"] == "from-scheduler" and json.loads(reply["overrides"]) == {"training.epochs": 4}
    [sent] = recorder.seen("POST", JOBS)
    assert sent.query["pipelineJobId"] == ["gnnflow-msg-1234567890"]
    assert sent.json["displayName"] == "from-scheduler"

    status, again = post(trigger_url, envelope)  # Pub/Sub delivers at least once
    assert status == 200 and again["job"] == reply["job"]
    assert len(recorder.seen("POST", JOBS)) == 2  # the service answered 409 to the second create,
    assert recorder.seen("GET", JOBS + "/gnnflow-msg-1234567890")  # and the job it conflicts with exists


def test_cloudevents_structured_and_binary_and_plain_json(recorder, trigger_url, config_uri):
    payload = {"config_uri": config_uri}
    structured = {
        "specversion": "1.0",
        "id": "evt-1",
        "source": "//pubsub.googleapis.com/projects/demo-project/topics/gnnflow",
        "type": "google.cloud.pubsub.topic.v1.messagePublished",
        "data": pubsub(payload, "777"),
    }
    status, reply = post(trigger_url, structured, {"Content-Type": "application/cloudevents+json"})
    assert status == 200 and reply["job"].endswith("/pipelineJobs/gnnflow-msg-777")

    binary_headers = {
        "ce-specversion": "1.0",
        "ce-id": "evt-2",
        "ce-source": "//pubsub.googleapis.com/x",
        "ce-type": "google.cloud.pubsub.topic.v1.messagePublished",
    }
    status, reply = post(trigger_url, pubsub(payload, "888"), binary_headers)
    assert status == 200 and reply["job"].endswith("/pipelineJobs/gnnflow-msg-888")

    status, reply = post(trigger_url, {**payload, "infer_mode": "exact"})  # Cloud Scheduler's HTTP target, no envelope
    assert status == 200 and reply["job"].startswith("projects/demo-project/locations/us-central1/pipelineJobs/gnnflow-")
    assert recorder.seen("POST", JOBS)[-1].json["runtimeConfig"]["parameterValues"]["infer_mode"] == "exact"
    assert len(recorder.seen("POST", JOBS)) == 3


def test_bad_messages_are_answered_400_naming_the_field_and_nothing_is_sent(recorder, trigger_url, gcs_bucket, config_uri):
    cases = [
        (pubsub({"overrides": {}}), "field 'config_uri': Field required"),
        (pubsub({"config_uri": config_uri, "confg": 1}), "field 'confg': unknown field"),
        (pubsub({"config_uri": config_uri, "infer_mode": "fast"}), "field 'infer_mode': Input should be 'auto', 'sampled' or 'exact'"),
        (pubsub({"config_uri": config_uri, "overrides": "[1]"}), "field 'overrides' must be a JSON object"),
        (pubsub({"config_uri": config_uri, "overrides": {"training.epoch": 2}}), "key 'training.epoch' does not name a config field"),
        (pubsub({"config_uri": f"gs://{gcs_bucket}/nope.yaml"}), f"gs://{gcs_bucket}/nope.yaml does not exist"),
        (pubsub(b"[1, 2]"), "bad payload: expected a JSON object, got list"),
        (pubsub(b"not json"), "Pub/Sub message.data is not base64-encoded JSON"),
        ({"message": {"data": "%%%", "messageId": "5"}}, "Pub/Sub message.data is not base64-encoded JSON"),
        ({"message": {"messageId": "5"}}, "the Pub/Sub message has no data"),
        (b"{not json", "bad request: the body is not JSON"),
    ]
    for body, reason in cases:
        status, reply = post(trigger_url, body)
        assert (status, reason in reply["error"]) == (400, True), (reason, reply)
    assert not recorder.seen("POST")


def test_service_failures_are_5xx_so_pubsub_retries(gcs_bucket, config_uri, package):
    with RecordingServer() as recorder:
        recorder.route("POST", JOBS, (500, {"error": {"code": 500, "message": "backend hiccup", "status": "INTERNAL"}}))
        settings = TriggerSettings(
            VertexTarget("demo-project", "us-central1", f"gs://{gcs_bucket}/root", api_endpoint=recorder.url), package=package
        )
        server = make_server(settings, 0, "127.0.0.1")
        threading.Thread(target=server.serve_forever, daemon=True).start()
        try:
            status, reply = post(f"http://127.0.0.1:{server.server_address[1]}", pubsub({"config_uri": config_uri}))
        finally:
            server.shutdown()
            server.server_close()
    assert status == 503 and "Vertex AI refused pipeline job gnnflow-msg-1234567890: 500" in reply["error"]


def test_kfp_target_and_cloud_function_entry_point(recorder, config_uri, package, monkeypatch):
    class FlaskLikeRequest:  # the two members Cloud Functions' request object offers that the entry point reads
        headers = {"Content-Type": "application/json"}

        def get_data(self) -> bytes:
            return json.dumps(pubsub({"config_uri": config_uri})).encode()

    monkeypatch.setenv("GNNFLOW_KFP_HOST", recorder.url)
    monkeypatch.setenv("GNNFLOW_PACKAGE", package)
    body, status, headers = cloud_function(FlaskLikeRequest())
    assert status == 200 and json.loads(body)["job"] == "run-2" and headers["Content-Type"] == "application/json"
    [run] = recorder.seen("POST", "/apis/v2beta1/runs")
    assert run.json["runtime_config"]["parameters"]["data_version"].startswith("sha256:")
    assert TriggerSettings.from_environment({"GNNFLOW_KFP_HOST": recorder.url}).target == KfpTarget(recorder.url)
    # Pub/Sub delivers the same message again: the run named after it exists, nothing new starts.
    again, status, _ = cloud_function(FlaskLikeRequest())
    assert status == 200 and json.loads(again)["job"] == "run-2"
    assert len(recorder.seen("POST", "/apis/v2beta1/runs")) == 1


def test_settings_name_what_the_environment_lacks():
    with pytest.raises(Exception, match="needs GNNFLOW_REGION, GNNFLOW_PIPELINE_ROOT in its environment"):
        TriggerSettings.from_environment({"GNNFLOW_PROJECT": "p"})
    settings = TriggerSettings.from_environment(
        {
            "GOOGLE_CLOUD_PROJECT": "p",
            "GNNFLOW_REGION": "us-central1",
            "GNNFLOW_PIPELINE_ROOT": "gs://b/r",
            "GNNFLOW_CHECK_PIPELINE_ROOT": "false",
        }
    )
    assert settings.target == VertexTarget("p", "us-central1", "gs://b/r", check_pipeline_root=False)


def test_python_m_pipelines_trigger_serves_on_port(recorder, gcs_bucket, config_uri, package):
    port = free_port()
    environment = {
        **os.environ,
        "PORT": str(port),
        "GNNFLOW_PROJECT": "demo-project",
        "GNNFLOW_REGION": "us-central1",
        "GNNFLOW_PIPELINE_ROOT": f"gs://{gcs_bucket}/root",
        "GNNFLOW_VERTEX_ENDPOINT": recorder.url,
        "GNNFLOW_PACKAGE": package,
    }
    process = subprocess.Popen(
        [sys.executable, "-m", "pipelines.trigger"], env=environment, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True
    )
    try:
        deadline = time.monotonic() + 60
        while True:  # wait until it listens
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=1) as response:
                    assert json.loads(response.read()) == {"status": "ok"}
                    break
            except (urllib.error.URLError, ConnectionError):
                assert process.poll() is None and time.monotonic() < deadline, (
                    process.stderr.read() if process.poll() is not None else "no answer"
                )
                time.sleep(0.1)
        status, reply = post(f"http://127.0.0.1:{port}/", pubsub({"config_uri": config_uri}, "42"))
        assert status == 200 and reply["job"].endswith("/pipelineJobs/gnnflow-msg-42")
    finally:
        process.terminate()
        process.wait(timeout=10)
    assert len(recorder.seen("POST", JOBS)) == 1

    broken = subprocess.run(
        [sys.executable, "-m", "pipelines.trigger"], env={**environment, "GNNFLOW_REGION": ""}, capture_output=True, text=True, timeout=60
    )
    assert broken.returncode == 2 and "the trigger needs GNNFLOW_REGION in its environment" in broken.stderr


def test_storage_that_does_not_answer_is_503_so_pubsub_redelivers(settings, config_uri, monkeypatch):
    with socket.socket() as sock:  # a port nothing listens on: connections are refused
        sock.bind(("127.0.0.1", 0))
        closed = sock.getsockname()[1]
    monkeypatch.setenv("STORAGE_EMULATOR_HOST", f"http://127.0.0.1:{closed}")
    monkeypatch.setenv("GNNFLOW_SERVICE_DEADLINE_S", "2")
    status, reply = respond(json.dumps(pubsub({"config_uri": config_uri})).encode(), {"Content-Type": "application/json"}, settings)
    assert status == 503, reply
    assert reply["error"].startswith(f"{config_uri}: Cloud Storage at http://127.0.0.1:{closed} did not answer within 2 s")


def test_a_message_with_from_model_submits_the_inference_only_pipeline(recorder, gcs_bucket, config_uri):
    """A daily embedding schedule: the message names the model (here a published output holding
    the fitted transforms the config's tables are encoded with); the pipeline is compiled
    inference-only and the model reference travels as the run's ``model`` parameter."""
    model = f"gs://{gcs_bucket}/fitted"
    preprocess(load_config(config_uri), model)
    settings = TriggerSettings(
        VertexTarget("demo-project", "us-central1", f"gs://{gcs_bucket}/root", None, recorder.url), image="example.com/gnnflow:1"
    )
    run = handle({"config_uri": config_uri, "from_model": model}, settings, message_id="42")
    [sent] = recorder.seen("POST", JOBS)
    assert sent.json["runtimeConfig"]["parameterValues"]["model"] == model == run.parameters["model"]
    assert set(sent.json["pipelineSpec"]["root"]["dag"]["tasks"]) == {
        "resolve-model", "preprocess-with-model", "serialize", "partition", "infer", "report"
    }  # fmt: skip
    with pytest.raises(GnnflowError, match="the model to infer with: .*missing"):  # refused before anything is sent
        handle({"config_uri": config_uri, "from_model": f"gs://{gcs_bucket}/nothing-here"}, settings, message_id="43")
    assert len(recorder.seen("POST", JOBS)) == 1
