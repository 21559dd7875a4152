"""``preprocess.beam.runner: dataflow``: the real Beam DataflowRunner submits to a local request
recorder (``dataflow_endpoint``), stages its files on the GCS emulator, and is cancelled when
the step is stopped. Nothing is sent for an invalid config, and nothing is published."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator

import pytest
import yaml

from components import storage
from components.config import GnnflowConfig, load_config
from components.errors import GnnflowError
from components.preprocess.step import preprocess
from tests.recording_server import RecordingServer
from tests.tiny_graph import write_tiny_graph

PROJECT, REGION, JOB_ID = "proj", "europe-west4", "2026-11-23_01_02_03-42"
IMAGE = "europe-docker.pkg.dev/proj/gnnflow/gnnflow:1.0"
JOBS = f"/v1b3/projects/{PROJECT}/locations/{REGION}/jobs"


def dataflow_recorder(state: str) -> RecordingServer:
    """A recorder answering like the Dataflow API; every job it knows is in ``state``."""
    server = RecordingServer()
    job = {"id": JOB_ID, "projectId": PROJECT, "location": REGION, "type": "JOB_TYPE_BATCH", "currentState": state}
    server.route("POST", JOBS, lambda request, _m: (200, {**request.json, **job}))
    server.route("GET", f"{JOBS}/[^/]+", (200, job))
    server.route("GET", f"{JOBS}/[^/]+/messages", (200, {}))
    server.route("PUT", f"{JOBS}/[^/]+", lambda request, _m: (200, {**job, **(request.json or {})}))
    return server


@pytest.fixture
def running_recorder() -> Iterator[RecordingServer]:
    with dataflow_recorder("JOB_STATE_RUNNING") as server:
        yield server


@pytest.fixture
def done_recorder() -> Iterator[RecordingServer]:
    with dataflow_recorder("JOB_STATE_DONE") as server:
        yield server


def dataflow_config(tmp_path, bucket: str, endpoint: str, **dataflow: object) -> dict:
    raw = yaml.safe_load(write_tiny_graph(tmp_path / "tables").read_text())
    for table in (*raw["graph"]["nodes"], *raw["graph"]["edges"]):
        table["uri"] = str(tmp_path / "tables" / table["uri"])
    # The REST transport is chosen for endpoints naming localhost (Beam's rule).
    settings = {
        "project": PROJECT,
        "region": REGION,
        "temp_location": f"gs://{bucket}/tmp",
        "dataflow_endpoint": endpoint.replace("127.0.0.1", "localhost"),
        **dataflow,
    }
    raw["preprocess"] = {"engine": "beam", "beam": {"runner": "dataflow", "dataflow": settings}}
    return raw


def test_job_request_names_image_workers_and_options(tmp_path, gcs_bucket, done_recorder):
    raw = dataflow_config(
        tmp_path,
        gcs_bucket,
        done_recorder.url,
        machine_type="n2-highmem-8",
        num_workers=3,
        max_num_workers=40,
        disk_size_gb=200,
        service_account="etl@proj.iam.gserviceaccount.com",
        network="vpc",
        subnetwork="regions/europe-west4/subnetworks/etl",
        use_public_ips=False,
    )
    output = f"gs://{gcs_bucket}/run/preprocessed"
    # The recorder reports the job done though no worker ran: the step says so and publishes nothing.
    with pytest.raises(GnnflowError, match="finished without writing its result"):
        preprocess(GnnflowConfig.model_validate(raw), output, image=IMAGE)
    assert not storage.exists(f"{output}/manifest.json")

    (create,) = done_recorder.seen("POST", JOBS)
    job = create.json
    assert job["name"].startswith("gnnflow-preprocess-")
    environment = job["environment"]
    assert environment["tempStoragePrefix"].startswith(f"storage.googleapis.com/{gcs_bucket}/tmp/")
    assert environment["serviceAccountEmail"] == "etl@proj.iam.gserviceaccount.com"
    (pool,) = environment["workerPools"]
    assert (pool["machineType"], pool["numWorkers"], pool["autoscalingSettings"]["maxNumWorkers"]) == ("n2-highmem-8", 3, 40)
    assert (pool["diskSizeGb"], pool["network"], pool["subnetwork"]) == (200, "vpc", "regions/europe-west4/subnetworks/etl")
    assert pool["ipConfiguration"] in (2, "WORKER_IP_PRIVATE")
    assert [image["containerImage"] for image in pool["sdkHarnessContainerImages"]] == [IMAGE]
    assert pool["workerHarnessContainerImage"] == IMAGE
    # Nothing to install on the workers: the image holds gnnflow and the lock.
    assert [p["name"] for p in pool.get("packages", [])] == ["submission_environment_dependencies.txt"]
    options = {d["key"]: d["value"] for d in environment["sdkPipelineOptions"]["display_data"]}
    assert (options["sdk_location"], options["region"], options["project"]) == ("container", REGION, PROJECT)
    # The staged job files went to the staging location on GCS (the emulator).
    staged = storage.list_files(f"gs://{gcs_bucket}/tmp/staging")
    assert any(str(f).endswith("pipeline.pb") for f in staged)


def test_config_image_used_when_the_step_has_none(tmp_path, gcs_bucket, done_recorder):
    raw = dataflow_config(tmp_path, gcs_bucket, done_recorder.url, sdk_container_image=IMAGE)
    with pytest.raises(GnnflowError):
        preprocess(GnnflowConfig.model_validate(raw), f"gs://{gcs_bucket}/out")
    (create,) = done_recorder.seen("POST", JOBS)
    assert create.json["environment"]["workerPools"][0]["workerHarnessContainerImage"] == IMAGE


def test_invalid_config_sends_nothing(tmp_path, gcs_bucket, done_recorder):
    raw = dataflow_config(tmp_path, gcs_bucket, done_recorder.url)
    del raw["preprocess"]["beam"]["dataflow"]["temp_location"]
    config_file = tmp_path / "config.yaml"
    config_file.write_text(yaml.safe_dump(raw))
    with pytest.raises(GnnflowError, match=r"runner dataflow needs preprocess\.beam\.dataflow\.temp_location"):
        load_config(str(config_file))
    # A valid config but no worker image: refused before anything is submitted.
    raw = dataflow_config(tmp_path / "again", gcs_bucket, done_recorder.url)
    with pytest.raises(GnnflowError, match="sdk_container_image"):
        preprocess(GnnflowConfig.model_validate(raw), f"gs://{gcs_bucket}/out")
    assert done_recorder.requests == []
    assert not storage.exists(f"gs://{gcs_bucket}/out/manifest.json")


def test_stopped_step_cancels_its_job(tmp_path, gcs_bucket, running_recorder):
    config = tmp_path / "config.yaml"
    config.write_text(yaml.safe_dump(dataflow_config(tmp_path, gcs_bucket, running_recorder.url)))
    output = f"gs://{gcs_bucket}/run/preprocessed"
    step = subprocess.Popen(
        [sys.executable, "-m", "components.preprocess", "--config", str(config), "--output", output, "--image", IMAGE],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=os.environ.copy(),
    )
    try:
        deadline = time.monotonic() + 120
        while not running_recorder.seen("GET", f"{JOBS}/{JOB_ID}") and time.monotonic() < deadline and step.poll() is None:
            time.sleep(0.2)
        assert running_recorder.seen("POST", JOBS), "the job was never submitted"
        step.send_signal(signal.SIGTERM)  # what KFP does to a cancelled run's task
        _, err = step.communicate(timeout=60)
    finally:
        step.kill()
    assert step.returncode == 2, err
    assert "stopped by signal 15; the Beam job was cancelled" in err.strip().splitlines()[-1]
    (cancel,) = running_recorder.seen("PUT", f"{JOBS}/{JOB_ID}")
    assert cancel.json["requestedState"] in ("JOB_STATE_CANCELLED", 5)
    assert not storage.exists(f"{output}/manifest.json")
    assert storage.list_files(f"gs://{gcs_bucket}/run") == []  # the staged generation was removed
