"""Where a Vertex AI Model Registry model is, and how gnnflow talks to it.

``vertex://projects/PROJECT/locations/REGION/models/MODEL`` names one model of the Model
Registry. ``MODEL`` is the model's resource id: an existing model's (ids Vertex AI generates
are numbers), or the id the first registration creates the model with (lower-case letters,
digits, ``_`` and ``-``, starting with a letter, at most 63 characters; the model's display
name is the same), so the URI keeps naming the model after its first version.

Requests go to ``https://REGION-aiplatform.googleapis.com`` over REST with the application
default credentials, or to ``GNNFLOW_VERTEX_ENDPOINT`` (a recorder or emulator in tests): an
``http://`` endpoint gets anonymous credentials, since gnnflow never sends credentials over
plain HTTP. Every call is retried on transient failures only until the service deadline
(``resources.service_deadline_s`` / ``GNNFLOW_SERVICE_DEADLINE_S``), then fails with one line
naming the model and the endpoint (:mod:`components.services.deadline`).
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from components.errors import GnnflowError
from components.registry.base import VERTEX_SCHEME
from components.services import deadline
from components.services.endpoints import credentials_for, endpoint_url, is_plain_http, vertex_endpoint

ENDPOINT_VARIABLE = "GNNFLOW_VERTEX_ENDPOINT"
SERVICE_NAME = "Vertex AI Model Registry"
_URI = re.compile(r"^vertex://projects/(?P<project>[^/@\s]+)/locations/(?P<region>[a-z]+-[a-z0-9-]+)/models/(?P<name>[^/@\s]+)/?$")
_MODEL_ID = re.compile(r"^(?:[0-9]+|[a-z][a-z0-9_-]{0,62})$")
NEW_MODEL_ID = re.compile(r"^[a-z][a-z0-9_-]{0,62}$")  # what a first upload may create
T = TypeVar("T")


class ModelMissing(GnnflowError):
    """Vertex AI answered 404 for a model or one of its versions (the message names which)."""


@dataclass(frozen=True)
class VertexModelUri:
    """A parsed ``vertex://`` model URI."""

    project: str
    region: str
    name: str  # the model's resource id

    @property
    def uri(self) -> str:
        return f"{VERTEX_SCHEME}{self.resource_name}"

    @property
    def parent(self) -> str:
        return f"projects/{self.project}/locations/{self.region}"

    @property
    def resource_name(self) -> str:
        return f"{self.parent}/models/{self.name}"

    def versioned(self, version: int | str) -> str:
        """The resource name of one version (a version id or an alias)."""
        return f"{self.resource_name}@{version}"

    @property
    def api_endpoint(self) -> str:
        """What the client is given: the region's host, or ``GNNFLOW_VERTEX_ENDPOINT``."""
        return vertex_endpoint(self.region, os.environ.get(ENDPOINT_VARIABLE, "").strip())

    @property
    def endpoint_url(self) -> str:
        return endpoint_url(self.api_endpoint)

    @property
    def plain_http(self) -> bool:
        return is_plain_http(self.api_endpoint)

    @property
    def service(self) -> deadline.Service:
        return deadline.Service(SERVICE_NAME, self.endpoint_url)


def parse_vertex_uri(uri: str) -> VertexModelUri:
    """``vertex://projects/P/locations/R/models/NAME`` → its parts; an error naming ``uri`` otherwise."""
    match = _URI.match(uri)
    if not match or not _MODEL_ID.match(match["name"]):
        raise GnnflowError(
            f"registry {uri!r}: not a Vertex AI Model Registry model; expected "
            "vertex://projects/PROJECT/locations/REGION/models/MODEL, where MODEL is an existing model's id or the id "
            "of a new one (lower-case letters, digits, '_' and '-', starting with a letter, at most 63 characters)"
        )
    return VertexModelUri(match["project"], match["region"], match["name"])


def model_client(target: VertexModelUri) -> Any:
    """The SDK's generated Model service client, over REST."""
    from google.auth import exceptions as auth_exceptions
    from google.cloud.aiplatform_v1.services.model_service import ModelServiceClient

    try:
        return ModelServiceClient(
            credentials=credentials_for(target.api_endpoint), transport="rest", client_options={"api_endpoint": target.api_endpoint}
        )
    except auth_exceptions.DefaultCredentialsError as exc:
        raise GnnflowError(f"{target.uri}: no Google Cloud credentials for {SERVICE_NAME} ({deadline.first_line(exc)})") from exc


def init_sdk(target: VertexModelUri) -> None:
    """Points the SDK's resource classes (``aiplatform.Model``) at ``target``'s endpoint, over REST."""
    from google.cloud import aiplatform

    aiplatform.init(
        project=target.project,
        location=target.region,
        credentials=credentials_for(target.api_endpoint),
        api_endpoint=target.api_endpoint,
        api_transport="rest",
    )


def request(target: VertexModelUri, subject: str, fn: Callable[[], T], *, idempotent: bool = True) -> T:
    """``fn()`` within the service deadline; a refusal becomes one line naming ``subject``:
    :class:`ModelMissing` for a 404, a :class:`GnnflowError` for any other answer."""
    from google.api_core import exceptions as api_exceptions

    try:
        return deadline.call(target.service, subject, fn, idempotent=idempotent)
    except api_exceptions.NotFound as exc:
        raise ModelMissing(f"{subject}: not found in {SERVICE_NAME} at {target.endpoint_url} ({exc.message})") from exc
    except api_exceptions.GoogleAPICallError as exc:
        raise GnnflowError(f"{subject}: {SERVICE_NAME} at {target.endpoint_url} refused: {exc.code} {exc.message}") from exc
    except ValueError as exc:  # the SDK's own checks (labels, display name)
        raise GnnflowError(f"{subject}: {exc}") from exc


def timeout_s() -> float:
    """One request's timeout: the service deadline (a dropped connection must not hang a call)."""
    return deadline.deadline_s()
