"""One run on a Kubeflow Pipelines endpoint, through the ``kfp`` client.

KFP has no caller-chosen run ids: with a job id the run is named after it (and the display name
if one is given, never the time), and a run of that name in the experiment is the one already
submitted (a redelivered trigger message).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from typing import Any, TypeVar

from components.services import deadline
from pipelines.run_request import KfpTarget, PreparedRun, RunRequest, SubmissionError, SubmittedRun, api_message, is_retryable

log = logging.getLogger("gnnflow.submit")

DONE_STATES = {"SUCCEEDED", "SKIPPED", "FAILED", "CANCELED", "PAUSED"}
SUCCEEDED = "SUCCEEDED"
T = TypeVar("T")


def kfp_call(target: KfpTarget, subject: str, call: Callable[[], T], *, idempotent: bool = True) -> T:
    """``call()`` to the KFP API, retried on transient failures until the service deadline (on
    failures to connect only, unless ``idempotent``); then a retryable :class:`SubmissionError`
    naming ``subject`` and the endpoint."""
    try:
        return deadline.call(deadline.Service("the KFP API", target.host), subject, call, idempotent=idempotent)
    except deadline.ServiceUnreachable as exc:
        raise SubmissionError(str(exc), retryable=True) from exc


def kfp_client(target: KfpTarget, subject: str | None = None) -> Any:
    """The ``kfp.Client`` of ``target`` (it asks the endpoint's health on creation); an endpoint
    that does not answer within the service deadline is a retryable error naming ``subject``."""
    import warnings

    import kfp

    def connect() -> Any:
        with warnings.catch_warnings():  # "only works with KFP v2.0.0-beta.2 and later": noise on every command
            warnings.simplefilter("ignore", FutureWarning)
            return kfp.Client(host=target.host, namespace=target.namespace or "kubeflow", existing_token=target.token)

    try:
        return kfp_call(target, subject or f"KFP experiment {target.experiment!r}", connect)
    except SubmissionError:
        raise
    except Exception as exc:  # noqa: BLE001 - a refusing endpoint
        raise SubmissionError(f"KFP endpoint {target.host} did not answer: {api_message(exc)}", retryable=is_retryable(exc)) from exc


def _kfp_run_named(client: Any, target: KfpTarget, run_name: str) -> Any | None:
    """The run of ``target``'s experiment called ``run_name``, if one exists."""
    try:
        experiment = client.get_experiment(experiment_name=target.experiment, namespace=target.namespace)
    except ValueError:  # no such experiment yet: no run either
        return None
    predicate = {"key": "display_name", "operation": "EQUALS", "string_value": run_name}
    found = client.list_runs(
        experiment_id=experiment.experiment_id, namespace=target.namespace, page_size=1, filter=json.dumps({"predicates": [predicate]})
    )
    return (found.runs or [None])[0]


def submit_kfp(target: KfpTarget, request: RunRequest, prepared: PreparedRun, package: str) -> SubmittedRun:
    """Creates the run in ``target``'s experiment, or finds the one a previous submission of ``request.job_id`` made."""
    if request.job_id:  # a name that does not depend on when it is submitted: a redelivery finds the first run
        run_name = f"{request.display_name}-{request.job_id}" if request.display_name else request.job_id
    else:
        run_name = prepared.display_name
    subject = f"KFP run {run_name!r} (experiment {target.experiment!r})"
    client = kfp_client(target, subject)
    try:
        existing = kfp_call(target, subject, lambda: _kfp_run_named(client, target, run_name)) if request.job_id else None
        if existing is not None:
            log.info("KFP run %s (%s) exists already: not submitted again", run_name, existing.run_id)
            url = f"{target.host.rstrip('/')}/#/runs/details/{existing.run_id}"
            return SubmittedRun("kfp", existing.run_id, run_name, prepared.parameters, url)
        # KFP takes no run id: repeated only when the request never left this machine.
        result = kfp_call(
            target,
            subject,
            lambda: client.create_run_from_pipeline_package(
                package,
                arguments=prepared.parameters,
                run_name=run_name,
                experiment_name=target.experiment,
                namespace=target.namespace,
                pipeline_root=target.pipeline_root,
                enable_caching=request.enable_caching,
                service_account=target.service_account,
            ),
            idempotent=False,
        )
    except SubmissionError:
        raise
    except Exception as exc:  # noqa: BLE001
        raise SubmissionError(
            f"KFP endpoint {target.host} refused run {prepared.display_name!r}: {api_message(exc)}", is_retryable(exc)
        ) from exc
    url = f"{target.host.rstrip('/')}/#/runs/details/{result.run_id}"
    return SubmittedRun("kfp", result.run_id, run_name, prepared.parameters, url)
