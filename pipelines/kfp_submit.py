"""One run on a Kubeflow Pipelines endpoint, through the ``kfp`` client.

KFP has no caller-chosen run ids: with a job id the run is named after it (and the display name
if one is given, never the time), and a run of that name in the experiment is the one already
submitted (a redelivered trigger message).
"""

from __future__ import annotations

import json
import logging
from typing import Any

from pipelines.run_request import KfpTarget, PreparedRun, RunRequest, SubmissionError, SubmittedRun, api_message, is_retryable

log = logging.getLogger("gnnflow.submit")

DONE_STATES = {"SUCCEEDED", "SKIPPED", "FAILED", "CANCELED", "PAUSED"}
SUCCEEDED = "SUCCEEDED"


def kfp_client(target: KfpTarget) -> Any:
    """The ``kfp.Client`` of ``target``; an endpoint that does not answer is a retryable error."""
    import warnings

    import kfp

    try:
        with warnings.catch_warnings():  # "only works with KFP v2.0.0-beta.2 and later": noise on every command
            warnings.simplefilter("ignore", FutureWarning)
            return kfp.Client(host=target.host, namespace=target.namespace or "kubeflow", existing_token=target.token)
    except Exception as exc:  # noqa: BLE001 - unreachable or refusing endpoint
        raise SubmissionError(f"KFP endpoint {target.host} did not answer: {api_message(exc)}", retryable=True) from exc


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
    client = kfp_client(target)
    if request.job_id:  # a name that does not depend on when it is submitted: a redelivery finds the first run
        run_name = f"{request.display_name}-{request.job_id}" if request.display_name else request.job_id
    else:
        run_name = prepared.display_name
    try:
        existing = _kfp_run_named(client, target, run_name) if request.job_id else None
        if existing is not None:
            log.info("KFP run %s (%s) exists already: not submitted again", run_name, existing.run_id)
            url = f"{target.host.rstrip('/')}/#/runs/details/{existing.run_id}"
            return SubmittedRun("kfp", existing.run_id, run_name, prepared.parameters, url)
        result = client.create_run_from_pipeline_package(
            package,
            arguments=prepared.parameters,
            run_name=run_name,
            experiment_name=target.experiment,
            namespace=target.namespace,
            pipeline_root=target.pipeline_root,
            enable_caching=request.enable_caching,
            service_account=target.service_account,
        )
    except Exception as exc:  # noqa: BLE001
        raise SubmissionError(
            f"KFP endpoint {target.host} refused run {prepared.display_name!r}: {api_message(exc)}", is_retryable(exc)
        ) from exc
    url = f"{target.host.rstrip('/')}/#/runs/details/{result.run_id}"
    return SubmittedRun("kfp", result.run_id, run_name, prepared.parameters, url)
