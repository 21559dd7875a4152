"""A multi-worker step (partition, train, infer) as one Vertex AI CustomJob.

The pipeline task of the step submits the job and waits for it. The job has
``world_size / processes_per_replica`` replicas of the step image: a chief pool of one
replica and a worker pool of the rest, every one running ``python -m components.<step>
--config-yaml <config> <arguments>``. Vertex AI tells each replica its place through
``CLUSTER_SPEC``, which :mod:`components.launcher` reads; the chief publishes the output. The
config travels inside the job's arguments (already resolved, overrides applied), so a
replica reads no file that could differ from what the pipeline task saw.

Submission goes through ``google-cloud-aiplatform`` over its REST transport.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import logging
import signal
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from components import storage
from components.config import CustomJobSpec, GnnflowConfig
from components.errors import GnnflowError

log = logging.getLogger("gnnflow.custom_job")

MULTI_WORKER_STEPS: tuple[str, ...] = ("partition", "train", "infer")
JOB_FILES = "_custom_job"  # below the step's output: the job's base output directory


@dataclass(frozen=True)
class StepJob:
    """What one step's CustomJob runs: the image, the step and its arguments, and where it publishes."""

    step: str
    image: str
    arguments: tuple[str, ...]  # the step's command-line arguments, after --config-yaml
    output: storage.GcsUri

    def __post_init__(self) -> None:
        if self.step not in MULTI_WORKER_STEPS:
            raise GnnflowError(f"step {self.step!r} does not run as a CustomJob: only {', '.join(MULTI_WORKER_STEPS)} do")
        if "/" not in self.image:
            raise GnnflowError(
                f"{self.step}: resources.runner is vertex, but the pipeline was compiled with image {self.image!r}, "
                "which Vertex AI cannot pull: compile with --image REGISTRY/PATH/gnnflow:TAG"
            )


def container_args(job: StepJob, config: GnnflowConfig) -> list[str]:
    """The arguments every replica's ``python -m components.<step>`` receives."""
    return ["--config-yaml", config.to_yaml(), *job.arguments]


def worker_pool_specs(job: StepJob, config: GnnflowConfig) -> list[dict[str, Any]]:
    """The chief pool (one replica) and, for more than one replica, the worker pool (the rest)."""
    spec = config.resources.custom_job
    machine: dict[str, Any] = {"machine_type": spec.machine_type}
    if spec.accelerator_type:
        machine |= {"accelerator_type": spec.accelerator_type, "accelerator_count": spec.accelerator_count}
    pool = {
        "machine_spec": machine,
        "disk_spec": {"boot_disk_type": "pd-ssd", "boot_disk_size_gb": spec.boot_disk_gb},
        "container_spec": {
            "image_uri": job.image,
            "command": ["python", "-m", f"components.{job.step}"],
            "args": container_args(job, config),
        },
    }
    replicas = config.resources.replica_count
    pools = [{**pool, "replica_count": 1}]
    if replicas > 1:
        pools.append({**pool, "replica_count": replicas - 1})
    return pools


def display_name(job: StepJob) -> str:
    return f"gnnflow-{job.step}-{dt.datetime.now(dt.timezone.utc):%Y%m%d-%H%M%S}"


def run_step_job(job: StepJob, config: GnnflowConfig, credentials: Any = None) -> str:
    """Submits the step's CustomJob, waits until it ends, and returns its resource name.

    ``credentials``: default, the environment's (application default credentials; on Vertex AI
    the pipeline's service account). A job that fails or is cancelled is a :class:`GnnflowError`
    with Vertex AI's message; a task stopped by SIGTERM (a cancelled pipeline run) or an
    interrupt cancels its job first.
    """
    from google.api_core import exceptions as api_exceptions
    from google.cloud import aiplatform

    spec = config.resources.custom_job
    _check_accelerator(spec)
    aiplatform.init(api_endpoint=spec.api_endpoint, api_transport="rest")
    custom_job = aiplatform.CustomJob(
        display_name=display_name(job),
        worker_pool_specs=worker_pool_specs(job, config),
        base_output_dir=str(job.output.join(JOB_FILES)),
        project=spec.project,
        location=spec.location,
        credentials=credentials,
        labels={"gnnflow-step": job.step},
        staging_bucket=spec.staging_bucket or f"gs://{job.output.bucket}",
    )
    replicas = config.resources.replica_count
    log.info("%s: submitting a Vertex AI CustomJob: %d replica(s) of %s on %s in %s", job.step, replicas, job.image,
             spec.machine_type, spec.location)
    try:
        custom_job.submit(**_submit_options(spec))
    except api_exceptions.GoogleAPICallError as exc:
        raise GnnflowError(f"{job.step}: Vertex AI refused the CustomJob in {spec.location}: {exc.message or exc}") from None
    name = custom_job.resource_name
    log.info("%s: CustomJob %s submitted; waiting for it", job.step, name)
    with _cancelled_when_stopped(custom_job, name):
        try:
            custom_job.wait_for_completion()
        except RuntimeError as exc:
            resource = custom_job.gca_resource  # as the last poll saw it; no further request
            detail = resource.error.message or str(exc)
            state = resource.state.name
            raise GnnflowError(f"{job.step}: Vertex AI CustomJob {name} ended in {state}: {detail}") from None
    log.info("%s: CustomJob %s succeeded", job.step, name)
    return name


def _check_accelerator(spec: CustomJobSpec) -> None:
    """The client would fail on an unknown accelerator with a bare KeyError; name the key instead."""
    from google.cloud.aiplatform_v1.types import AcceleratorType

    known = [name for name in AcceleratorType.__members__ if name != "ACCELERATOR_TYPE_UNSPECIFIED"]
    if spec.accelerator_type is not None and spec.accelerator_type not in known:
        raise GnnflowError(
            f"resources.custom_job.accelerator_type {spec.accelerator_type!r} is not a Vertex AI accelerator; "
            f"known: {', '.join(sorted(known))}"
        )


def _submit_options(spec: CustomJobSpec) -> dict[str, Any]:
    return {
        "service_account": spec.service_account,
        "network": spec.network,
        "timeout": spec.timeout_s,
        "restart_job_on_worker_restart": spec.restart_job_on_worker_restart,
    }


class _Stopped(BaseException):
    """SIGTERM arrived while waiting (a cancelled pipeline run stops its tasks that way)."""


@contextlib.contextmanager
def _cancelled_when_stopped(custom_job: Any, name: str) -> Iterator[None]:
    """Cancels the job if the wait ends by SIGTERM or an interrupt: replicas must not outlive their task."""
    previous = None
    if threading.current_thread() is threading.main_thread():
        def stop(signum: int, frame: object) -> None:
            raise _Stopped()

        previous = signal.signal(signal.SIGTERM, stop)
    try:
        yield
    except (_Stopped, KeyboardInterrupt):
        log.warning("stopped while waiting: cancelling CustomJob %s", name)
        try:
            custom_job.cancel()
        except Exception as exc:  # noqa: BLE001 - best effort; the original stop matters more
            log.error("could not cancel CustomJob %s: %s", name, exc)
        raise SystemExit(143) from None
    finally:
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)
