"""A run of the pipeline per message: the target of Cloud Scheduler → Pub/Sub → Cloud Run / Functions.

The payload names a config and its overrides, e.g. ``{"config_uri": "gs://b/gnnflow.yaml",
"overrides": {"training.epochs": 20}}``; it arrives as a Pub/Sub push envelope, a CloudEvent
(structured or binary, as Eventarc sends it) or as the plain JSON body of an HTTP call. Where
runs go comes from the environment (``GNNFLOW_PROJECT``, ``GNNFLOW_REGION``,
``GNNFLOW_PIPELINE_ROOT``, ... or ``GNNFLOW_KFP_HOST``), never from the message.

- ``handle(payload)``: validate one payload and submit one run (``pipelines.submit``);
- ``respond(body, headers)``: the HTTP contract: 200 with the job name, 400 naming what is
  wrong with the message or its config, 502 when the pipeline service failed;
- ``python -m pipelines.trigger``: a standard-library HTTP server on ``$PORT`` (Cloud Run);
- ``cloud_function(request)``: the same for a Cloud Functions HTTP entry point.
"""

from pipelines.trigger.handler import TriggerSettings, cloud_function, handle, respond
from pipelines.trigger.message import TriggerPayload, parse_payload, payload_from_request

__all__ = ["TriggerPayload", "TriggerSettings", "cloud_function", "handle", "parse_payload", "payload_from_request", "respond"]
