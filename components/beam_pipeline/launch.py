"""Runs a Beam pipeline to the end: FnApiRunner processes here, or a Dataflow job it waits for.

A Dataflow job outlives the process that submitted it; when the step's process is stopped
(KFP sends SIGTERM to a cancelled run's task), the job is cancelled too, so a cancelled
pipeline run leaves no workers behind.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import threading
from collections.abc import Callable, Iterator
from typing import Any

from components.beam_pipeline.options import pipeline_options
from components.config import BeamSpec
from components.errors import GnnflowError
from components.runtime.runlog import timed

log = logging.getLogger("gnnflow.beam")

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


@contextlib.contextmanager
def _cancel_on_termination(result: Any, step: str) -> Iterator[None]:
    """While waiting, SIGTERM/SIGINT cancel the running job before the process exits."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def cancel(signum: int, _frame: object) -> None:
        log.warning("%s: stopped (signal %d): cancelling the Beam job", step, signum)
        with contextlib.suppress(Exception):
            result.cancel()
        raise GnnflowError(f"{step}: stopped by signal {signum}; the Beam job was cancelled")

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
        result = _beam_call(step, "failed", pipeline.run)
        job_id = getattr(result, "job_id", lambda: None)() if spec.runner == "dataflow" else None
        if job_id:
            log.info("%s: Dataflow job %s submitted; waiting for it", step, job_id)
        with _cancel_on_termination(result, step):
            state = _beam_call(step, "failed", result.wait_until_finish)
    if str(state) not in ("DONE", "PipelineState.DONE"):
        raise GnnflowError(f"{step}: the Beam pipeline ended in state {state}")
    log.info("%s: the Beam pipeline finished in %.1f s", step, elapsed[0])


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
