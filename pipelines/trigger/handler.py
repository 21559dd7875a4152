"""Submitting one run per message, with the target taken from the environment."""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from components.errors import GnnflowError
from components.services.deadline import ServiceUnreachable
from pipelines.submit import KfpTarget, RunRequest, SubmissionError, SubmittedRun, Target, VertexTarget, submit
from pipelines.trigger.message import TriggerError, job_id_for, parse_payload, payload_from_request

log = logging.getLogger("gnnflow.trigger")


@dataclass(frozen=True)
class TriggerSettings:
    """Where runs go and which compiled pipeline they run, read once from the environment.

    ``GNNFLOW_KFP_HOST`` selects a KFP endpoint (with ``GNNFLOW_KFP_EXPERIMENT``,
    ``GNNFLOW_KFP_NAMESPACE``, ``GNNFLOW_KFP_TOKEN``); otherwise Vertex AI with
    ``GNNFLOW_PROJECT`` (or ``GOOGLE_CLOUD_PROJECT``), ``GNNFLOW_REGION``,
    ``GNNFLOW_PIPELINE_ROOT``, and optionally ``GNNFLOW_SERVICE_ACCOUNT``,
    ``GNNFLOW_VERTEX_ENDPOINT`` and ``GNNFLOW_CHECK_PIPELINE_ROOT=false``. ``GNNFLOW_PACKAGE``
    names a compiled pipeline (e.g. baked into the image); without it each message compiles the
    pipeline (tens of milliseconds) for ``GNNFLOW_IMAGE`` with its config's task requests.
    """

    target: Target
    package: str | None = None
    image: str | None = None

    @classmethod
    def from_environment(cls, environ: Mapping[str, str] = os.environ) -> TriggerSettings:
        get = lambda name: environ.get(name) or None  # noqa: E731 - empty means unset
        root, account = get("GNNFLOW_PIPELINE_ROOT"), get("GNNFLOW_SERVICE_ACCOUNT")
        target: Target
        if get("GNNFLOW_KFP_HOST"):
            target = KfpTarget(
                environ["GNNFLOW_KFP_HOST"],
                get("GNNFLOW_KFP_EXPERIMENT") or "gnnflow",
                get("GNNFLOW_KFP_NAMESPACE"),
                root,
                account,
                get("GNNFLOW_KFP_TOKEN"),
            )
        else:
            project = get("GNNFLOW_PROJECT") or get("GOOGLE_CLOUD_PROJECT")
            missing = [
                n
                for n, v in (("GNNFLOW_PROJECT", project), ("GNNFLOW_REGION", get("GNNFLOW_REGION")), ("GNNFLOW_PIPELINE_ROOT", root))
                if not v
            ]
            if missing:
                raise GnnflowError(f"the trigger needs {', '.join(missing)} in its environment (or GNNFLOW_KFP_HOST)")
            target = VertexTarget(
                project or "",
                environ["GNNFLOW_REGION"],
                root,
                account,
                get("GNNFLOW_VERTEX_ENDPOINT"),
                (get("GNNFLOW_CHECK_PIPELINE_ROOT") or "true").lower() != "false",
            )
        return cls(target, get("GNNFLOW_PACKAGE"), get("GNNFLOW_IMAGE"))


def handle(payload: dict[str, Any], settings: TriggerSettings | None = None, message_id: str | None = None) -> SubmittedRun:
    """Validates ``payload`` (and the config it names) and submits one run.

    ``message_id`` (the Pub/Sub or CloudEvent id) becomes the job id (Vertex AI's pipeline job id,
    a suffix of KFP's run name), so a message delivered twice starts one run on either.
    """
    settings = settings or TriggerSettings.from_environment()
    parsed = parse_payload(payload)
    request = RunRequest(
        config=parsed.config_uri,
        overrides=parsed.overrides,
        display_name=parsed.display_name,
        labels=parsed.labels,
        infer_mode=parsed.infer_mode,
        enable_caching=parsed.enable_caching,
        package=settings.package,
        image=settings.image,
        job_id=job_id_for(message_id),
        from_model=parsed.from_model,
    )
    run = submit(request, settings.target)
    log.info("message %s: submitted %s for %s", message_id or "-", run.name, parsed.config_uri)
    return run


def respond(body: bytes, headers: Mapping[str, str], settings: TriggerSettings | None = None) -> tuple[int, dict[str, Any]]:
    """The HTTP answer to one delivery: (status, JSON body).

    400: the message, its payload or the config it names is wrong (the reason says which field
    or key); Pub/Sub redelivers until its retry policy gives up, so give the subscription a
    dead-letter topic. 502: the pipeline service failed (503 when retrying may help, or when
    Cloud Storage or BigQuery did not answer within the service deadline). 200: the
    job name.
    """
    try:
        settings = settings or TriggerSettings.from_environment()
    except GnnflowError as exc:
        log.error("misconfigured: %s", exc)
        return 500, {"error": f"the trigger is misconfigured: {exc}"}
    try:
        payload, message_id = payload_from_request(body, headers)
        run = handle(payload, settings, message_id)
    except SubmissionError as exc:
        log.error("submission failed: %s", exc)
        return (503 if exc.retryable else 502), {"error": str(exc)}
    except ServiceUnreachable as exc:  # GCS or BigQuery down while the run is prepared: a redelivery may succeed
        log.error("a service did not answer: %s", exc)
        return 503, {"error": str(exc)}
    except (TriggerError, GnnflowError) as exc:
        log.warning("rejected: %s", exc)
        return 400, {"error": str(exc)}
    return 200, {
        "job": run.name,
        "display_name": run.display_name,
        "url": run.url,
        "data_version": run.parameters["data_version"],
        "overrides": run.parameters["overrides"],
    }


def cloud_function(request: Any) -> tuple[str, int, dict[str, str]]:
    """A Cloud Functions HTTP entry point (``--entry-point cloud_function``); ``request`` is Flask's."""
    import json

    status, reply = respond(request.get_data(), dict(request.headers))
    return json.dumps(reply), status, {"Content-Type": "application/json"}
