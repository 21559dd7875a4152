"""Every cloud client against an endpoint that refuses connections (a closed loopback port): the
step retries, says so, and fails once the service deadline has passed, with one line naming
what it was reading or writing and the endpoint. The deadline is set low here (a few seconds);
the bound asserted on the elapsed time is a bound on a hang (the reported one lasted over five
minutes), not a speed figure."""

from __future__ import annotations

import logging
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from components import storage
from components.config import GnnflowConfig, parse_config
from components.config.resources import DEFAULT_SERVICE_DEADLINE_S
from components.errors import GnnflowError
from components.services import deadline
from pipelines.run_request import KfpTarget, RunRequest, SubmissionError, VertexTarget
from pipelines.submit import submit
from tests.tiny_graph import write_tiny_graph

DEADLINE_S = 3.0
# A Dataflow submission (staging the job on the GCS emulator) is bounded by the deadline too: about
# a second here, a few on a loaded machine. The tests that need one to succeed give it this; the
# wait that then fails takes the whole of it, so it is no longer than that needs.
DATAFLOW_DEADLINE_S = 8.0
MARGIN_S = 30.0  # a hang is minutes; this leaves room for a loaded machine


@pytest.fixture
def closed_port() -> int:
    """A loopback port nothing listens on: bound, then closed, so connections are refused."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.fixture
def low_deadline(monkeypatch: pytest.MonkeyPatch) -> Iterator[float]:
    monkeypatch.setenv(deadline.ENV_VARIABLE, str(DEADLINE_S))
    yield DEADLINE_S


def _ended(step: subprocess.Popen[str]) -> str:
    """What a step that stopped early wrote last (for an assertion's message)."""
    step.kill()
    _, err = step.communicate(timeout=30)
    return err[-3000:]


def _bq_config(folder: Path) -> Path:
    """The tiny graph's config with its tables in BigQuery (``bq://test.graph.nodes`` / ``edges``)."""
    path = write_tiny_graph(folder)
    raw = yaml.safe_load(path.read_text())
    for table in (*raw["graph"]["nodes"], *raw["graph"]["edges"]):
        table["uri"] = f"bq://test.graph.{Path(table['uri']).name.split('.')[0]}"
    path.write_text(yaml.safe_dump(raw))
    return path


# ------------------------------------------------------------------------------- the deadline
def test_the_deadline_comes_from_the_config_and_the_environment_wins(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv(deadline.ENV_VARIABLE, raising=False)
    assert deadline.FALLBACK_DEADLINE_S == DEFAULT_SERVICE_DEADLINE_S
    raw = yaml.safe_load(write_tiny_graph(tmp_path).read_text())
    try:
        parse_config(yaml.safe_dump({**raw, "resources": {"service_deadline_s": 7.5}}), "test")
        assert deadline.deadline_s() == 7.5
        monkeypatch.setenv(deadline.ENV_VARIABLE, "2")
        assert deadline.deadline_s() == 2.0
        monkeypatch.setenv(deadline.ENV_VARIABLE, "soon")
        with pytest.raises(GnnflowError, match=f"{deadline.ENV_VARIABLE}='soon'"):
            deadline.deadline_s()
    finally:
        deadline.configure(None)
    monkeypatch.delenv(deadline.ENV_VARIABLE)
    assert deadline.deadline_s() == DEFAULT_SERVICE_DEADLINE_S


def test_only_what_may_pass_is_retried() -> None:
    from google.api_core import exceptions

    assert deadline.is_transient(ConnectionRefusedError()) and deadline.is_transient(exceptions.ServiceUnavailable("busy"))
    assert deadline.is_transient(exceptions.TooManyRequests("slow"))
    assert not deadline.is_transient(exceptions.NotFound("gone")) and not deadline.is_transient(exceptions.Forbidden("no"))
    assert not deadline.is_transient(deadline.ServiceUnreachable("spent"))
    # A create is repeated only when its request never left this machine.
    assert deadline.is_connect_failure(ConnectionRefusedError()) and not deadline.is_connect_failure(exceptions.ServiceUnavailable("?"))


# ------------------------------------------------------------------------------------- GCS
def test_gcs_gives_up_at_the_deadline_naming_the_uri_and_the_endpoint(
    monkeypatch: pytest.MonkeyPatch, closed_port: int, low_deadline: float, caplog: pytest.LogCaptureFixture
) -> None:
    endpoint = f"http://127.0.0.1:{closed_port}"
    monkeypatch.setenv("STORAGE_EMULATOR_HOST", endpoint)
    start = time.monotonic()
    with caplog.at_level(logging.WARNING, logger="gnnflow.services"), pytest.raises(GnnflowError) as info:
        storage.read_text("gs://bucket/runs/config.yaml")
    assert time.monotonic() - start < low_deadline + MARGIN_S
    message = str(info.value)
    assert "\n" not in message
    assert "gs://bucket/runs/config.yaml" in message and f"Cloud Storage at {endpoint} did not answer within 3 s" in message
    assert "Connection refused" in message
    # While retrying, the step said what it waits for.
    assert any(endpoint in r.getMessage() and "retrying" in r.getMessage() for r in caplog.records)


def test_gcs_writes_give_up_too(monkeypatch: pytest.MonkeyPatch, closed_port: int, low_deadline: float) -> None:
    monkeypatch.setenv("STORAGE_EMULATOR_HOST", f"http://127.0.0.1:{closed_port}")
    start = time.monotonic()
    with pytest.raises(GnnflowError, match=rf"gs://bucket/out/x\.bin: Cloud Storage at http://127\.0\.0\.1:{closed_port} did not answer"):
        storage.write_bytes("gs://bucket/out/x.bin", b"abc")
    assert time.monotonic() - start < low_deadline + MARGIN_S


# -------------------------------------------------------------------------------- BigQuery
def test_preprocess_of_bigquery_tables_fails_at_the_deadline_from_the_command_line(tmp_path: Path, closed_port: int) -> None:
    """The reported case: ``BIGQUERY_EMULATOR_HOST`` at a closed port printed nothing for minutes."""
    config = _bq_config(tmp_path / "in")
    endpoint = f"http://127.0.0.1:{closed_port}"
    env = {
        **os.environ,
        "BIGQUERY_EMULATOR_HOST": endpoint,
        "BIGQUERY_STORAGE_EMULATOR_HOST": f"127.0.0.1:{closed_port}",
        deadline.ENV_VARIABLE: str(DEADLINE_S),
    }
    start = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-m", "components.preprocess", "--config", str(config), "--output", str(tmp_path / "out")],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    elapsed = time.monotonic() - start
    assert done.returncode != 0, done.stderr
    assert elapsed < DEADLINE_S + MARGIN_S + 30, f"{elapsed:.0f} s (includes the interpreter's start)"
    last = done.stderr.strip().splitlines()[-1]
    assert "bq://test.graph." in last and f"BigQuery at {endpoint} did not answer within 3 s" in last, done.stderr
    assert "Traceback" not in done.stderr
    assert f"BigQuery at {endpoint} did not answer" in done.stderr.split(last)[0], "no warning while retrying"
    assert not (tmp_path / "out" / "manifest.json").exists()


def test_the_storage_read_api_gives_up_at_the_deadline(
    bigquery_dataset: str, monkeypatch: pytest.MonkeyPatch, closed_port: int, low_deadline: float
) -> None:
    """REST (the table's schema) answers; the Storage Read API's gRPC endpoint refuses."""
    from google.cloud import bigquery

    from components.warehouse.clients import bigquery_client
    from components.warehouse.reading import start_read
    from components.warehouse.table_ref import parse_table_uri

    client = bigquery_client(bigquery_dataset.split(".")[0])
    client.create_table(bigquery.Table(f"{bigquery_dataset}.papers", schema=[bigquery.SchemaField("id", "STRING")]))
    monkeypatch.setenv("BIGQUERY_STORAGE_EMULATOR_HOST", f"127.0.0.1:{closed_port}")
    table = parse_table_uri(f"bq://{bigquery_dataset}.papers")
    start = time.monotonic()
    with pytest.raises(GnnflowError) as info:
        start_read(table, ["id"], None, max_streams=1)
    assert time.monotonic() - start < low_deadline + MARGIN_S
    assert str(info.value).startswith(f"bq://{bigquery_dataset}.papers: the BigQuery Storage Read API at 127.0.0.1:{closed_port} ")
    assert "did not answer within 3 s" in str(info.value)


# ------------------------------------------------------------------------ Vertex AI and KFP
def test_vertex_submission_gives_up_at_the_deadline(
    config_uri: str, package: str, gcs_bucket: str, closed_port: int, low_deadline: float
) -> None:
    endpoint = f"http://127.0.0.1:{closed_port}"
    target = VertexTarget("proj", "europe-west4", pipeline_root=f"gs://{gcs_bucket}/root", api_endpoint=endpoint)
    start = time.monotonic()
    with pytest.raises(SubmissionError) as info:
        submit(RunRequest(config=config_uri, package=package, job_id="nightly-1"), target)
    assert time.monotonic() - start < low_deadline + MARGIN_S
    assert info.value.retryable  # a Pub/Sub trigger has the message redelivered
    message = str(info.value)
    assert "pipeline job projects/proj/locations/europe-west4/pipelineJobs/nightly-1" in message
    assert f"Vertex AI at {endpoint} did not answer within 3 s" in message


def test_kfp_submission_gives_up_at_the_deadline(config_uri: str, package: str, closed_port: int, low_deadline: float) -> None:
    endpoint = f"http://127.0.0.1:{closed_port}"
    start = time.monotonic()
    with pytest.raises(SubmissionError) as info:
        submit(RunRequest(config=config_uri, package=package, job_id="nightly-1"), KfpTarget(endpoint))
    assert time.monotonic() - start < low_deadline + MARGIN_S
    assert info.value.retryable
    assert f"KFP run 'nightly-1' (experiment 'gnnflow'): the KFP API at {endpoint} did not answer within 3 s" in str(info.value)


# ------------------------------------------------------------------------------- Dataflow
def test_dataflow_submission_gives_up_at_the_deadline(
    tmp_path: Path, gcs_bucket: str, closed_port: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Staging on the GCS emulator works (about a second); the Dataflow API refuses (Beam alone
    retries ~35 s). Staging is under the same deadline, so where a loaded machine has not finished
    it at the deadline the step gives up with the same line: the low deadline asserts both."""
    from components.preprocess.step import preprocess
    from tests.test_dataflow_submission import IMAGE, dataflow_config

    monkeypatch.setenv(deadline.ENV_VARIABLE, str(DEADLINE_S))
    endpoint = f"http://localhost:{closed_port}"
    raw = dataflow_config(tmp_path, gcs_bucket, f"http://127.0.0.1:{closed_port}")
    output = f"gs://{gcs_bucket}/run/preprocessed"
    start = time.monotonic()
    with pytest.raises(GnnflowError) as info:
        preprocess(GnnflowConfig.model_validate(raw), output, image=IMAGE)
    assert time.monotonic() - start < DEADLINE_S + MARGIN_S
    message = str(info.value)
    assert "submitting Dataflow job gnnflow-preprocess-" in message and f"Dataflow at {endpoint} did not answer within 3 s" in message
    assert "gcloud dataflow jobs list --region europe-west4" in message
    assert not storage.exists(f"{output}/manifest.json")


def test_a_failed_cancel_says_the_job_keeps_running_and_how_to_cancel_it(tmp_path: Path, gcs_bucket: str) -> None:
    """The step is stopped (SIGTERM, as KFP does); Dataflow refuses the cancel: the step must not
    claim the job was cancelled, and must name the job and the command that cancels it."""
    import signal

    from tests.test_dataflow_submission import JOB_ID, JOBS, REGION, dataflow_recorder

    with dataflow_recorder("JOB_STATE_RUNNING") as recorder:
        recorder.route(
            "PUT", f"{JOBS}/[^/]+", (400, {"error": {"code": 400, "message": "cannot cancel now", "status": "FAILED_PRECONDITION"}})
        )
        step = _dataflow_step(tmp_path, gcs_bucket, recorder)
        try:
            _wait_until_polled(step, recorder)
            assert recorder.seen("POST", JOBS), f"the job was never submitted: {_ended(step)}"
            step.send_signal(signal.SIGTERM)
            _, err = step.communicate(timeout=60)
        finally:
            step.kill()
        assert recorder.seen("PUT", f"{JOBS}/{JOB_ID}"), "no cancel was asked for"
    assert step.returncode not in (0, None), err
    last = err.strip().splitlines()[-1]
    assert "was cancelled" not in err
    assert f"cancelling Dataflow job {JOB_ID} failed" in last and "keeps running and billing" in last, err
    assert f"gcloud dataflow jobs cancel {JOB_ID} --region {REGION}" in last


def test_a_dataflow_endpoint_that_stops_answering_while_the_job_runs_fails_the_step(tmp_path: Path, gcs_bucket: str) -> None:
    """Submitted, then the service only answers 503: the wait gives up at the deadline, saying the
    job may still be running and how to cancel it (Beam's own wait retries each poll ~10 min)."""
    from tests.test_dataflow_submission import JOB_ID, JOBS, REGION, dataflow_recorder

    with dataflow_recorder("JOB_STATE_RUNNING") as recorder:
        step = _dataflow_step(tmp_path, gcs_bucket, recorder)
        try:
            _wait_until_polled(step, recorder)
            assert recorder.seen("GET", f"{JOBS}/{JOB_ID}"), f"the job was never polled: {_ended(step)}"
            recorder.route("GET", f"{JOBS}/[^/]+", (503, {"error": {"code": 503, "message": "backend down", "status": "UNAVAILABLE"}}))
            failing = time.monotonic()
            _, err = step.communicate(timeout=120)
        finally:
            step.kill()
    assert time.monotonic() - failing < DATAFLOW_DEADLINE_S + MARGIN_S
    assert step.returncode not in (0, None), err
    last = err.strip().splitlines()[-1]
    assert f"Dataflow job {JOB_ID}: Dataflow at " in last and f"did not answer within {DATAFLOW_DEADLINE_S:g} s" in last, err
    assert f"may still be running and billing: gcloud dataflow jobs cancel {JOB_ID} --region {REGION}" in last


def _dataflow_step(tmp_path: Path, gcs_bucket: str, recorder) -> subprocess.Popen:
    """``python -m components.preprocess`` submitting its Beam job to Dataflow at ``recorder``,
    under :data:`DATAFLOW_DEADLINE_S`."""
    from tests.test_dataflow_submission import IMAGE, dataflow_config

    config = tmp_path / "config.yaml"
    config.write_text(yaml.safe_dump(dataflow_config(tmp_path, gcs_bucket, recorder.url)))
    command = [sys.executable, "-m", "components.preprocess", "--config", str(config), "--output", f"gs://{gcs_bucket}/run/p"]
    return subprocess.Popen(
        [*command, "--image", IMAGE],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, deadline.ENV_VARIABLE: str(DATAFLOW_DEADLINE_S)},
    )


def _wait_until_polled(step: subprocess.Popen, recorder) -> None:
    """Until the step has submitted its job and polled its state once (or ended, or 120 s passed)."""
    from tests.test_dataflow_submission import JOB_ID, JOBS

    until = time.monotonic() + 120
    while not recorder.seen("GET", f"{JOBS}/{JOB_ID}") and time.monotonic() < until and step.poll() is None:
        time.sleep(0.2)
