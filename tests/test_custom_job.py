"""Multi-worker steps as Vertex AI CustomJobs: the real google-cloud-aiplatform client (REST)
against a local endpoint that records requests and answers like the Vertex AI API."""

from __future__ import annotations

import itertools
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterable, Iterator

import pytest
import yaml
from google.auth.credentials import AnonymousCredentials
from google.cloud.aiplatform_v1.types import AcceleratorType

from components import pipeline_task, storage
from components.config import GnnflowConfig, apply_overrides, load_config, parse_config
from components.config_source import config_from_arguments
from components.custom_job import StepJob, run_step_job, worker_pool_specs
from components.errors import GnnflowError
from components.train.__main__ import parse_args as train_args
from tests.recording_server import RecordedRequest, RecordingServer

IMAGE = "us-docker.pkg.dev/acme-ml/gnn/gnnflow:2.0"
PARENT = "projects/acme-ml/locations/europe-west4"
JOB = r"/v1/(?P<name>projects/[^/]+/locations/[^/]+/customJobs/[^/:]+)"
CONFIG = """\
graph:
  nodes: [{type: paper, uri: gs://data/nodes.parquet, label_column: label}]
  edges: [{type: cites, uri: gs://data/edges.parquet, src_type: paper, dst_type: paper}]
training: {epochs: 7}
resources:
  world_size: 4
  runner: vertex
  custom_job:
    project: acme-ml
    location: europe-west4
    machine_type: n1-highmem-16
    accelerator_type: NVIDIA_TESLA_T4
    accelerator_count: 2
    boot_disk_gb: 200
    service_account: gnn-trainer@acme-ml.iam.gserviceaccount.com
    network: projects/1234/global/networks/ml
    timeout_s: 7200
"""
OFFLINE = {"GCE_METADATA_HOST": "127.0.0.1:9", "GCE_METADATA_IP": "127.0.0.1:9", "grpc_proxy": "http://127.0.0.1:9"}


def add_custom_job_routes(server: RecordingServer, states: Iterable[str]) -> None:
    """Create answers JOB_STATE_PENDING; each GET answers the next of ``states`` (the last repeats)."""
    jobs: dict[str, dict] = {}
    ids = itertools.count(1)
    states = list(states)
    polls = itertools.chain(states, itertools.repeat(states[-1]))

    def create(request: RecordedRequest, match: re.Match[str]):
        name = f"{match['parent']}/customJobs/{next(ids)}"
        jobs[name] = {**request.json, "name": name, "state": "JOB_STATE_PENDING"}
        return 200, jobs[name]

    def get(request: RecordedRequest, match: re.Match[str]):
        job = jobs[match["name"]] = {**jobs[match["name"]], "state": next(polls)}
        if job["state"] == "JOB_STATE_FAILED":
            job["error"] = {"code": 3, "message": "The replica workerpool1-0 exited with a non-zero status of 2."}
        return 200, job

    server.route("POST", r"/v1/(?P<parent>projects/[^/]+/locations/[^/]+)/customJobs", create)
    server.route("GET", JOB, get)
    server.route("POST", JOB + ":cancel", (200, {}))


@pytest.fixture
def vertex(monkeypatch) -> Iterator[RecordingServer]:
    for name, value in OFFLINE.items():
        monkeypatch.setenv(name, value)
    with RecordingServer() as server:
        yield server


def _config(server: RecordingServer, **overrides: object) -> GnnflowConfig:
    config = parse_config(CONFIG, "test config")
    return apply_overrides(config, {"resources.custom_job.api_endpoint": server.url, **overrides})


def _train_job() -> StepJob:
    output = storage.parse_uri("gs://acme-pipelines/root/123/train/model")
    return StepJob("train", IMAGE, ("--input", "gs://acme-pipelines/root/123/partition/partitions", "--output", str(output)), output)


def test_train_job_request_carries_replicas_machine_image_and_config(vertex):
    add_custom_job_routes(vertex, ["JOB_STATE_SUCCEEDED"])
    config = _config(vertex)
    name = run_step_job(_train_job(), config, credentials=AnonymousCredentials())

    assert name == f"{PARENT}/customJobs/1"
    [create] = vertex.seen("POST", rf"/v1/{PARENT}/customJobs")
    body = create.json
    assert body["displayName"].startswith("gnnflow-train-")
    assert body["labels"] == {"gnnflow-step": "train"}
    spec = body["jobSpec"]
    assert spec["serviceAccount"] == "gnn-trainer@acme-ml.iam.gserviceaccount.com"
    assert spec["network"] == "projects/1234/global/networks/ml"
    assert spec["scheduling"] == {"timeout": "7200s", "restartJobOnWorkerRestart": True}
    assert spec["baseOutputDirectory"]["outputUriPrefix"] == "gs://acme-pipelines/root/123/train/model/_custom_job"
    chief, workers = spec["workerPoolSpecs"]
    assert (chief["replicaCount"], workers["replicaCount"]) == ("1", "3")  # world_size 4, one process per replica
    for pool in (chief, workers):
        assert pool["machineSpec"]["machineType"] == "n1-highmem-16"
        assert pool["machineSpec"]["acceleratorType"] == AcceleratorType.NVIDIA_TESLA_T4.value  # REST sends enums as numbers
        assert pool["machineSpec"]["acceleratorCount"] == 2
        assert pool["diskSpec"] == {"bootDiskType": "pd-ssd", "bootDiskSizeGb": 200}
        container = pool["containerSpec"]
        assert container["imageUri"] == IMAGE
        assert container["command"] == ["python", "-m", "components.train"]
        args = container["args"]
        assert args[0] == "--config-yaml"
        assert args[2:] == ["--input", "gs://acme-pipelines/root/123/partition/partitions", "--output", "gs://acme-pipelines/root/123/train/model"]
        # What a replica's command line makes of those arguments is the config the task resolved.
        assert config_from_arguments(train_args(args)) == config
    assert yaml.safe_load(chief["containerSpec"]["args"][1])["training"]["epochs"] == 7
    assert len(vertex.seen("GET", JOB)) >= 1  # waited for the job


def test_one_pool_when_every_worker_fits_one_replica(vertex):
    config = _config(vertex, **{"resources.processes_per_replica": 4, "resources.custom_job.accelerator_type": None})
    [pool] = worker_pool_specs(_train_job(), config)
    assert pool["replica_count"] == 1
    assert pool["machine_spec"] == {"machine_type": "n1-highmem-16"}


def test_failed_job_is_an_error_with_vertex_message(vertex):
    add_custom_job_routes(vertex, ["JOB_STATE_FAILED"])
    with pytest.raises(GnnflowError) as error:
        run_step_job(_train_job(), _config(vertex), credentials=AnonymousCredentials())
    message = str(error.value)
    assert f"CustomJob {PARENT}/customJobs/1 ended in JOB_STATE_FAILED" in message
    assert "workerpool1-0 exited with a non-zero status of 2" in message


def test_refused_job_is_an_error_naming_the_location(vertex):
    vertex.route("POST", r"/v1/.*/customJobs", (403, {"error": {"code": 403, "status": "PERMISSION_DENIED",
                                                                  "message": "Permission 'aiplatform.customJobs.create' denied"}}))
    with pytest.raises(GnnflowError, match="refused the CustomJob in europe-west4: .*Permission 'aiplatform.customJobs.create' denied"):
        run_step_job(_train_job(), _config(vertex), credentials=AnonymousCredentials())


def test_placeholder_image_and_local_output_are_refused_before_any_request(vertex):
    with pytest.raises(GnnflowError, match="compile with --image"):
        StepJob("train", "gnnflow:latest", (), storage.parse_uri("gs://b/model"))
    config = _config(vertex)
    with pytest.raises(GnnflowError, match="not on gs://"):
        pipeline_task.run_multi_worker(config, "train", IMAGE, [], storage.parse_uri("/tmp/model"), lambda: None)
    bad = apply_overrides(config, {"resources.custom_job.accelerator_type": "NVIDIA_TESLA_T5"})
    with pytest.raises(GnnflowError, match="resources.custom_job.accelerator_type 'NVIDIA_TESLA_T5' is not a Vertex AI accelerator"):
        run_step_job(_train_job(), bad, credentials=AnonymousCredentials())
    assert vertex.requests == []


_WAITER = """
import sys
from google.auth.credentials import AnonymousCredentials
from components.config import apply_overrides, parse_config
from tests.test_custom_job import CONFIG, _train_job
from components.custom_job import run_step_job
config = apply_overrides(parse_config(CONFIG, "test"), {"resources.custom_job.api_endpoint": sys.argv[1]})
run_step_job(_train_job(), config, credentials=AnonymousCredentials())
"""


def test_sigterm_while_waiting_cancels_the_job(vertex):
    add_custom_job_routes(vertex, ["JOB_STATE_RUNNING"])
    waiter = subprocess.Popen([sys.executable, "-c", _WAITER, vertex.url], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.monotonic() + 60
        while not vertex.seen("GET", JOB) and waiter.poll() is None and time.monotonic() < deadline:
            time.sleep(0.2)
        assert vertex.seen("GET", JOB), waiter.communicate(timeout=10)[0] if waiter.poll() is not None else "no poll within 60 s"
        waiter.send_signal(signal.SIGTERM)
        output = waiter.communicate(timeout=30)[0]
    finally:
        if waiter.poll() is None:
            waiter.kill()
    assert waiter.returncode == 143, output
    assert [r.path for r in vertex.seen("POST", JOB + ":cancel")] == [f"/v1/{PARENT}/customJobs/1:cancel"]
    assert "cancelling CustomJob" in output
    assert len(vertex.seen("POST", rf"/v1/{PARENT}/customJobs")) == 1


def test_the_replicas_the_job_describes_run_the_step_together(tmp_path, gcs_bucket):
    """Each pool's container command, run as Vertex AI would (one process per replica, CLUSTER_SPEC
    naming its place), partitions a graph on gs:// (the emulator): the chief publishes."""
    from components.preprocess.step import preprocess
    from components.serialize.step import serialize
    from tests.tiny_graph import write_tiny_graph

    config = apply_overrides(load_config(write_tiny_graph(tmp_path / "graph")),
                             {"resources.world_size": 2, "resources.runner": "vertex"})
    root = storage.parse_uri(f"gs://{gcs_bucket}/run")
    preprocess(config, root.join("preprocessed"))
    serialize(config, root.join("preprocessed"), root.join("tfrecords"))
    output = root.join("partitions")
    job = StepJob("partition", IMAGE, ("--input", str(root.join("tfrecords")), "--output", str(output)), output)
    pools = worker_pool_specs(job, config)
    assert [pool["replica_count"] for pool in pools] == [1, 1]

    master = _free_port()  # the RPC port is the master's + 1, as on Vertex AI
    cluster = {"workerpool0": [f"127.0.0.1:{master}"], "workerpool1": ["127.0.0.1:1"]}
    replicas = []
    for index, pool in enumerate(pools):
        container = pool["container_spec"]
        command = [sys.executable, *container["command"][1:], *container["args"]]
        spec = json.dumps({"cluster": cluster, "task": {"type": f"workerpool{index}", "index": 0}})
        environment = {**os.environ, "CLUSTER_SPEC": spec}
        replicas.append(subprocess.Popen(command, env=environment, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
    logs = [replica.communicate(timeout=300)[0] for replica in replicas]
    assert [replica.returncode for replica in replicas] == [0, 0], "\n".join(logs)
    published = storage.open_published(output, step="partition")
    assert published.manifest.counts["partitions"] == 2
    assert published.manifest.counts["nodes.item"] == 5


def _free_port() -> int:
    """A loopback port free now (the replicas here are started by the test, as a platform would)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]
