"""Runs a Beam pipeline to the end: FnApiRunner processes here, or a Dataflow job it waits for.

A Dataflow job outlives the process that submitted it; when the step's process is stopped
(KFP sends SIGTERM to a cancelled run's task), the job is cancelled too, so a cancelled
pipeline run leaves no workers behind. When the cancel fails, the step says so, with the job id
and the command that cancels it by hand: that job keeps running and billing.

Talking to Dataflow is bounded by the service deadline (:mod:`components.services.deadline`):
the submission, each poll of the job's state (while the job itself may run for hours) and the
cancel. Beam's own client retries for up to about ten minutes per call without a word; here a
step whose Dataflow endpoint stops answering fails within the deadline, naming the job and the
endpoint. The local runners need no deadline (their BigQuery and GCS clients have their own).
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from components.beam_pipeline.options import pipeline_options
from components.config import BeamSpec
from components.errors import GnnflowError
from components.runtime.runlog import timed
from components.services import deadline

log = logging.getLogger("gnnflow.beam")

DATAFLOW_ENDPOINT = "https://dataflow.googleapis.com"
_POLL_S = 5.0  # between state checks of a running Dataflow job (Beam's own interval)
_POLL_TIMEOUT_S = 60.0  # one state check
# A cancel on SIGTERM must end (and say how it went) within the grace period before SIGKILL:
# Kubernetes' default is 30 s.
_CANCEL_LIMIT_S = 20.0


@dataclass(frozen=True)
class DataflowJob:
    """A submitted Dataflow job, as a user finds it again."""

    job_id: str
    region: str
    service: deadline.Service

    @property
    def cancel_command(self) -> str:
        return f"gcloud dataflow jobs cancel {self.job_id} --region {self.region}"


# Beam logs each worker process's start-up and its own warnings at INFO/WARNING: noise here.
_NOISY_LOGGERS = ("apache_beam", "apache_beam.runners.portability.local_job_service")


def _last_line(exc: BaseException) -> str:
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    return lines[-1] if lines else type(exc).__name__


@contextlib.contextmanager
def _loopback_without_proxy() -> Iterator[None]:
    """Local Beam workers talk gRPC to the runner on localhost; a configured gRPC proxy (one
    that cannot reach this machine's loopback) would leave them waiting forever."""
    previous = os.environ.get("no_grpc_proxy")
    present = [h for h in (previous if previous is not None else os.environ.get("no_proxy", "")).split(",") if h]
    os.environ["no_grpc_proxy"] = ",".join([*present, *(h for h in ("localhost", "127.0.0.1") if h not in present)])
    try:
        yield
    finally:
        if previous is None:
            os.environ.pop("no_grpc_proxy", None)
        else:
            os.environ["no_grpc_proxy"] = previous


def cancel_job(result: Any, job: DataflowJob, step: str, why: str) -> None:
    """Cancels ``job``; raises an error saying whether that worked, and if not, that the job
    keeps running and billing, and how to cancel it by hand."""
    log.warning("%s: %s: cancelling Dataflow job %s", step, why, job.job_id)
    try:
        deadline.call_within(job.service, f"cancelling Dataflow job {job.job_id}", result.cancel, limit_s=_CANCEL_LIMIT_S)
    except Exception as exc:  # noqa: BLE001  # whatever the reason, the job was not cancelled
        message = (
            f"{step}: {why}; cancelling Dataflow job {job.job_id} failed ({deadline.first_line(exc)}): "
            f"it keeps running and billing until cancelled by hand: {job.cancel_command}"
        )
        log.error("%s", message)
        raise GnnflowError(message) from None
    raise GnnflowError(f"{step}: {why}; the Beam job was cancelled (Dataflow job {job.job_id} in {job.region})")


@contextlib.contextmanager
def _cancel_on_termination(result: Any, step: str, job: DataflowJob | None) -> Iterator[None]:
    """While waiting, SIGTERM/SIGINT cancel the running Dataflow job before the process exits."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def cancel(signum: int, _frame: object) -> None:
        why = f"stopped by signal {signum}"
        if job is None:  # local workers are this process's own: they end with it
            raise GnnflowError(f"{step}: {why}")
        cancel_job(result, job, step, why)

    previous = {sig: signal.signal(sig, cancel) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def _beam_call(step: str, failure: str, call: Callable[[], Any]) -> Any:
    """``call()``, with any error but a GnnflowError turned into one naming the step."""
    try:
        return call()
    except GnnflowError:
        raise
    except Exception as exc:
        # The remote traceback is what a user debugging a worker needs; the error line names it.
        log.error("%s: the Beam pipeline %s:\n%s", step, failure, exc)
        raise GnnflowError(f"{step}: the Beam pipeline {failure}: {_last_line(exc)}") from exc


def run_pipeline(build: Callable[[Any], None], spec: BeamSpec, step: str, image: str | None = None) -> None:
    """Builds the pipeline with ``build(pipeline)`` and runs it to completion.

    Raises:
        GnnflowError: the pipeline could not start, failed, or was cancelled.
    """
    import apache_beam as beam
    from apache_beam.options.pipeline_options import PipelineOptions

    for name in _NOISY_LOGGERS:
        logging.getLogger(name).setLevel(logging.ERROR)
    options = PipelineOptions(flags=[], **pipeline_options(spec, step, image))
    if spec.runner == "local":
        from apache_beam.runners.portability.fn_api_runner import FnApiRunner

        runner: Any = FnApiRunner()
        where = f"{spec.num_workers} local Beam worker process(es)"
    else:
        from apache_beam.runners.dataflow.dataflow_runner import DataflowRunner

        runner = DataflowRunner()
        where = f"Dataflow in {spec.dataflow.project}/{spec.dataflow.region} (up to {spec.dataflow.max_num_workers} workers)"
    pipeline = beam.Pipeline(runner=runner, options=options)
    build(pipeline)
    log.info("%s: running the Beam pipeline on %s", step, where)
    with timed() as elapsed, _loopback_without_proxy() if spec.runner == "local" else contextlib.nullcontext():
        if spec.runner == "local":
            result = _beam_call(step, "failed", pipeline.run)
            job = None
        else:
            service = deadline.Service("Dataflow", spec.dataflow.dataflow_endpoint or DATAFLOW_ENDPOINT)
            name = str(options.get_all_options().get("job_name"))
            after = f"if job {name} was created, cancel it: gcloud dataflow jobs list --region {spec.dataflow.region} --status active"
            result = _beam_call(
                step, "failed", lambda: deadline.call_within(service, f"{step}: submitting Dataflow job {name}", pipeline.run, then=after)
            )
            job = DataflowJob(str(result.job_id()), spec.dataflow.region, service)
            log.info("%s: Dataflow job %s submitted; waiting for it", step, job.job_id)
        with _cancel_on_termination(result, step, job):
            if job is not None:
                wait_for_job(result, job, step)
            state = _beam_call(step, "failed", result.wait_until_finish)
    if str(state) not in ("DONE", "PipelineState.DONE"):
        raise GnnflowError(f"{step}: the Beam pipeline ended in state {state}")
    log.info("%s: the Beam pipeline finished in %.1f s", step, elapsed[0])


def wait_for_job(result: Any, job: DataflowJob, step: str) -> None:
    """Polls ``job`` until it ends, each poll retried only until the service deadline (Beam's
    own wait retries each poll for about ten minutes, silently). Beam's ``wait_until_finish``
    then reads the ended job's state and errors."""
    from apache_beam.runners.dataflow.dataflow_runner import DataflowPipelineResult
    from apache_beam.runners.runner import PipelineState
    from google.cloud import dataflow

    client = result._runner.dataflow_client
    request = dataflow.GetJobRequest(job_id=job.job_id, project_id=client.google_cloud_options.project, location=job.region)
    # The Dataflow client Beam built, one request per poll: not through Beam's ``get_job``, whose
    # retries take no deadline, and with a timeout (Beam's has none: a connection the service
    # holds open without answering would wait forever).
    timeout = min(deadline.deadline_s(), _POLL_TIMEOUT_S)
    last = None
    while True:
        try:
            found = deadline.call(
                job.service, f"{step}: Dataflow job {job.job_id}", lambda: client._jobs_client.get_job(request=request, timeout=timeout)
            )
        except deadline.ServiceUnreachable as exc:
            raise deadline.ServiceUnreachable(f"{exc}; the job may still be running and billing: {job.cancel_command}") from None
        state = DataflowPipelineResult.api_jobstate_to_pipeline_state(found.current_state)
        if state != last:
            log.info("%s: Dataflow job %s is %s", step, job.job_id, state)
            last = state
        if PipelineState.is_terminal(state):
            return
        time.sleep(_POLL_S)


# What a pipeline's last step hands its launcher, inside the staged generation (never published).
RESULT_FILE = "_beam_result.json"


def put_result(staging: Any, value: Any) -> None:
    """The pipeline's last step: ``value`` as JSON where :func:`take_result` reads it."""
    import json

    from components import storage

    storage.write_text(staging.uri(RESULT_FILE), json.dumps(value))


def take_result(staging: Any, step: str) -> Any:
    """Reads and deletes the JSON result the pipeline's last step wrote into ``staging``."""
    import json

    from components import storage

    uri = staging.uri(RESULT_FILE)
    if not storage.exists(uri):
        raise GnnflowError(f"{step}: the Beam pipeline finished without writing its result {uri} (did its workers run?)")
    result = json.loads(storage.read_text(uri))
    storage.delete(uri)
    return result
