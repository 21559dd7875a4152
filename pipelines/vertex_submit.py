"""One run on Vertex AI Pipelines, optionally in a Vertex AI Experiment, through ``google-cloud-aiplatform`` (REST).

Without an experiment the SDK's ``PipelineJob`` builds and checks the spec and runtime config,
and its generated client sends the request: ``PipelineJob.submit()`` would also create a
missing root bucket and rewrite its IAM policy (``run_request.check_pipeline_root`` checks the
bucket instead).

With ``--experiment NAME`` the run joins a Vertex AI Experiment the way the SDK's
``PipelineJob.submit(experiment=NAME)`` does it, with its own classes and requests, minus that
bucket step (which also asks Cloud Resource Manager for the project number): it gets or creates
the experiment (``aiplatform.Experiment.get_or_create``: a metadata context of schema
``system.Experiment`` in the region's default metadata store), creates the job, waits until
Vertex AI has made the run's ``system.PipelineRun`` context, and adds that context to the
experiment's children. Vertex AI Experiments then shows the run with its parameters and, as
its metrics, the metadata of every ``system.Metrics`` artifact the run produced, merged into
one row (``PipelineJob._query_experiment_row``): gnnflow's are train's, infer's and report's,
whose shared keys hold the same values (report's are the final metrics).
"""

from __future__ import annotations

import datetime
import logging
import re
import secrets
import time
from collections.abc import Callable
from typing import Any, TypeVar

from components.errors import GnnflowError
from components.services import deadline
from components.services.endpoints import credentials_for
from pipelines.platform_spec import pipeline_spec_only
from pipelines.run_request import PreparedRun, RunRequest, SubmissionError, SubmittedRun, VertexTarget, api_message, is_retryable

log = logging.getLogger("gnnflow.submit")

_JOB_ID = re.compile(r"^[a-z][-a-z0-9]{0,127}$")
DONE_STATES = {"PIPELINE_STATE_SUCCEEDED", "PIPELINE_STATE_FAILED", "PIPELINE_STATE_CANCELLED", "PIPELINE_STATE_PAUSED"}
SUCCEEDED = "PIPELINE_STATE_SUCCEEDED"
CONTEXT_WAIT_S, CONTEXT_POLL_S = 300.0, 2.0  # how long a new run's metadata context is waited for, and how often asked
T = TypeVar("T")


def vertex_call(target: VertexTarget, subject: str, call: Callable[[], T], *, idempotent: bool = True) -> T:
    """``call()`` to Vertex AI, retried on transient failures until the service deadline (on
    failures to connect only, unless ``idempotent``); then a retryable :class:`SubmissionError`
    naming ``subject`` and the endpoint, so a Pub/Sub trigger has the message redelivered."""
    try:
        return deadline.call(deadline.Service("Vertex AI", target.endpoint), subject, call, idempotent=idempotent)
    except deadline.ServiceUnreachable as exc:
        raise SubmissionError(str(exc), retryable=True) from exc


def init_vertex(target: VertexTarget) -> None:
    """Points the Vertex SDK's resource classes at ``target``, over REST (as submissions go)."""
    from google.cloud import aiplatform

    aiplatform.init(
        project=target.project,
        location=target.region,
        credentials=vertex_credentials(target),
        api_endpoint=target.api_endpoint,
        api_transport="rest",
    )


def vertex_credentials(target: VertexTarget) -> Any:
    """Anonymous credentials for a plain-HTTP endpoint; None (application default) otherwise."""
    return credentials_for(target.endpoint)


def vertex_pipeline_job(
    target: VertexTarget, request: RunRequest, prepared: PreparedRun, package: str, *, job_id: str | None = None
) -> Any:
    """The SDK's ``PipelineJob`` (spec, runtime config, labels, caching), validated."""
    from google.cloud import aiplatform

    try:
        with pipeline_spec_only(package) as template:  # the SDK reads one YAML document
            return aiplatform.PipelineJob(
                display_name=prepared.display_name,
                template_path=template,
                job_id=job_id,
                pipeline_root=target.pipeline_root,
                parameter_values=prepared.parameters,
                enable_caching=request.enable_caching,
                labels=dict(request.labels) or None,
                credentials=vertex_credentials(target),
                project=target.project,
                location=target.region,
            )
    except ValueError as exc:
        raise GnnflowError(f"invalid Vertex AI pipeline job: {exc}") from exc


def submit_vertex(target: VertexTarget, request: RunRequest, prepared: PreparedRun, package: str) -> SubmittedRun:
    """Creates the pipeline job (joining ``target.experiment`` if set); a job id that exists already is that run."""
    stamp = datetime.datetime.now(datetime.UTC).strftime("%Y%m%d-%H%M%S")
    job_id = request.job_id or f"gnnflow-{stamp}-{secrets.token_hex(3)}"
    if not _JOB_ID.match(job_id):
        raise GnnflowError(f"job id {job_id!r} must be lower-case letters, digits and dashes, starting with a letter")
    if target.experiment:
        name = _create_in_experiment(target, request, prepared, package, job_id)
    else:
        name = _create(target, request, prepared, package, job_id)
    url = f"https://console.cloud.google.com/vertex-ai/locations/{target.region}/pipelines/runs/{job_id}?project={target.project}"
    return SubmittedRun("vertex", name, prepared.display_name, prepared.parameters, url)


def _create(target: VertexTarget, request: RunRequest, prepared: PreparedRun, package: str, job_id: str) -> str:
    from google.api_core import exceptions as api_exceptions
    from google.cloud.aiplatform_v1 import PipelineJob

    built = vertex_pipeline_job(target, request, prepared, package, job_id=job_id)
    job = PipelineJob(
        display_name=prepared.display_name,
        pipeline_spec=built.pipeline_spec,
        runtime_config=built.runtime_config,
        labels=dict(request.labels),
        service_account=target.service_account or "",
    )
    parent = f"projects/{target.project}/locations/{target.region}"
    service = pipeline_service(target)
    try:
        # Repeated here only when the request never left this machine; an error the service
        # answered is the caller's to retry (a trigger's Pub/Sub message is redelivered).
        return vertex_call(
            target,
            f"pipeline job {parent}/pipelineJobs/{job_id}",
            lambda: service.create_pipeline_job(parent=parent, pipeline_job=job, pipeline_job_id=job_id),
            idempotent=False,
        ).name
    except SubmissionError:
        raise
    except api_exceptions.Conflict as exc:  # 409: e.g. a redelivered trigger message whose run exists already
        return _existing_job(service, f"{parent}/pipelineJobs/{job_id}", exc)
    except Exception as exc:  # noqa: BLE001
        raise SubmissionError(f"Vertex AI refused pipeline job {job_id}: {api_message(exc)}", is_retryable(exc)) from exc


def _create_in_experiment(target: VertexTarget, request: RunRequest, prepared: PreparedRun, package: str, job_id: str) -> str:
    """What ``PipelineJob.submit(experiment=...)`` does, without its root-bucket step (see the module docstring)."""
    from google.cloud import aiplatform
    from google.cloud.aiplatform_v1.services.metadata_service import MetadataServiceClient

    experiment_name = target.experiment or ""
    init_vertex(target)  # the SDK's experiment classes take their endpoint from aiplatform.init
    try:
        experiment = vertex_call(
            target,
            f"Vertex AI Experiment {experiment_name!r}",
            lambda: aiplatform.Experiment.get_or_create(
                experiment_name, project=target.project, location=target.region, credentials=vertex_credentials(target)
            ),
        )
    except SubmissionError:
        raise
    except ValueError as exc:  # a metadata context of that name that is not an experiment (e.g. a TensorBoard one)
        raise GnnflowError(f"--experiment {experiment_name!r}: {exc}") from exc
    except Exception as exc:  # noqa: BLE001
        raise SubmissionError(
            f"Vertex AI Experiment {experiment_name!r} could not be found or created: {api_message(exc)}", is_retryable(exc)
        ) from exc
    name = _create(target, request, prepared, package, job_id)
    run_context = _run_context(target, name)
    metadata = MetadataServiceClient(
        credentials=vertex_credentials(target), transport="rest", client_options={"api_endpoint": target.endpoint}
    )
    try:
        vertex_call(
            target,
            f"pipeline job {name} (joining Vertex AI Experiment {experiment_name!r})",
            lambda: metadata.add_context_children(context=experiment.resource_name, child_contexts=[run_context]),
        )
    except Exception as exc:  # noqa: BLE001
        raise SubmissionError(
            f"pipeline job {name} was submitted and runs, but joining Vertex AI Experiment {experiment_name!r} failed: {api_message(exc)}"
        ) from exc
    log.info("pipeline job %s joined Vertex AI Experiment %s: %s", name, experiment_name, experiment.dashboard_url)
    return name


def _run_context(target: VertexTarget, name: str) -> str:
    """The ``system.PipelineRun`` metadata context of job ``name``, which Vertex AI makes shortly after the job."""
    service = pipeline_service(target)
    deadline = time.monotonic() + CONTEXT_WAIT_S
    while True:
        job = vertex_call(target, f"pipeline job {name}", lambda: service.get_pipeline_job(name=name))
        if job.job_detail.pipeline_run_context.name:
            return str(job.job_detail.pipeline_run_context.name)
        if job.state.name in DONE_STATES or time.monotonic() > deadline:
            raise SubmissionError(
                f"pipeline job {name} was submitted, but Vertex AI made no run context to add to the "
                f"experiment ({job.state.name}{': ' + job.error.message if job.error.message else ''})"
            )
        time.sleep(CONTEXT_POLL_S)


def _existing_job(service: Any, name: str, conflict: Exception) -> str:
    """``name`` when that job exists (it was submitted before), else the conflict as an error."""
    try:
        service.get_pipeline_job(name=name)
    except Exception:  # noqa: BLE001 - not there after all: report the original refusal
        raise SubmissionError(f"Vertex AI refused pipeline job {name}: {api_message(conflict)}", is_retryable(conflict)) from conflict
    log.info("pipeline job %s exists already; not submitting it again", name)
    return name


def pipeline_service(target: VertexTarget) -> Any:
    """The SDK's generated Vertex AI pipeline client, over REST."""
    from google.cloud.aiplatform_v1.services.pipeline_service import PipelineServiceClient

    return PipelineServiceClient(credentials=vertex_credentials(target), transport="rest", client_options={"api_endpoint": target.endpoint})
