"""The Vertex AI requests of ``gnnflow deploy``, through the Model and Endpoint services' generated
clients of ``google-cloud-aiplatform`` (REST transport).

Each request is retried on transient failures only until the service deadline
(``resources.service_deadline_s`` / ``GNNFLOW_SERVICE_DEADLINE_S``), and the ones that create
something (an upload, an endpoint, a deployment) only when the request never left this machine;
then one line names what was being done and the endpoint. A long-running operation (a deployment
takes minutes) is waited for up to ``--operation-timeout-s``. ``http://`` endpoints (a recorder in
tests) get anonymous credentials: gnnflow never sends credentials over plain HTTP.
"""

from __future__ import annotations

import concurrent.futures
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

from components.errors import GnnflowError
from components.services import deadline
from components.services.endpoints import credentials_for
from pipelines.deploy_request import HEALTH_ROUTE, NEW, PORT, PREDICT_ROUTE, DeployRequest
from pipelines.run_request import api_message

log = logging.getLogger("gnnflow.deploy")

SERVICE_NAME = "Vertex AI"
KEY_LABEL = "gnnflow-serving-key"  # on each serving model gnnflow uploads: what makes a rerun find it
T = TypeVar("T")


@dataclass(frozen=True)
class ServingModel:
    """A model version on Vertex AI that serves with gnnflow's container."""

    name: str  # projects/P/locations/R/models/ID
    version: str  # its version id
    uploaded: bool  # False: it existed already

    @property
    def versioned(self) -> str:
        return f"{self.name}@{self.version}"


@dataclass(frozen=True)
class Deployment:
    """The model's deployment on the endpoint."""

    endpoint: str  # projects/P/locations/R/endpoints/ID
    deployed_model_id: str
    deployed: bool  # False: it was deployed there already (a rerun)
    endpoint_created: bool
    traffic_split: dict[str, int]


def container_signature(spec: Any) -> tuple[Any, ...]:
    """What makes two serving containers the same: image, command, arguments, ports, routes, env."""
    env = tuple(sorted((e.name, e.value) for e in spec.env))
    ports = tuple(p.container_port for p in spec.ports)
    return (spec.image_uri, tuple(spec.command), tuple(spec.args), ports, spec.predict_route, spec.health_route, env)


class VertexPrediction:
    """The requests of one ``gnnflow deploy`` to one project and region."""

    def __init__(self, request: DeployRequest) -> None:
        self.request = request
        self.service = deadline.Service(SERVICE_NAME, request.api_url)
        self._models: Any = None
        self._endpoints: Any = None

    # ------------------------------------------------------------------------ models
    def container_spec(self) -> Any:
        """The serving container: the step image running ``gnnflow serve`` on Vertex AI's contract."""
        from google.cloud.aiplatform_v1 import types

        return types.ModelContainerSpec(
            image_uri=self.request.image,
            command=["gnnflow"],
            args=self.request.serve_args(),
            env=[types.EnvVar(name=k, value=v) for k, v in sorted(self.request.env.items())],
            ports=[types.Port(container_port=PORT)],
            predict_route=PREDICT_ROUTE,
            health_route=HEALTH_ROUTE,
        )

    def model_version(self, name: str, version: str) -> Any:
        """One version of a model (its container spec, artifacts)."""
        client = self._model_client()
        return self._call(f"model {name}@{version}", lambda: client.get_model(name=f"{name}@{version}", timeout=deadline.deadline_s()))

    def find_serving_model(self, key: str) -> ServingModel | None:
        """The model an earlier ``gnnflow deploy`` uploaded for the same artifacts and container."""
        client = self._model_client()
        wanted = f'labels.{KEY_LABEL}="{key}"'
        found = self._call(
            f"looking up the serving model ({wanted})",
            lambda: list(client.list_models(request={"parent": self.request.parent, "filter": wanted}, timeout=deadline.deadline_s())),
        )
        if not found:
            return None
        model = found[0]
        log.info("deploy: %s@%s already serves these artifacts with this container; not uploading again", model.name, model.version_id)
        return ServingModel(model.name, model.version_id, uploaded=False)

    def upload(self, artifact_uri: str, display_name: str, description: str, labels: Mapping[str, str]) -> ServingModel:
        """Uploads the model to the Model Registry with the serving container."""
        from google.cloud.aiplatform_v1 import types

        model = types.Model(
            display_name=display_name[:128],
            description=description,
            artifact_uri=artifact_uri,
            container_spec=self.container_spec(),
            labels=dict(labels),
        )
        client = self._model_client()
        subject = f"uploading {artifact_uri} to the Vertex AI Model Registry"
        operation = self._call(
            subject, lambda: client.upload_model(parent=self.request.parent, model=model, timeout=deadline.deadline_s()), idempotent=False
        )
        response = self._wait(operation, subject)
        log.info("deploy: uploaded %s as %s@%s", artifact_uri, response.model, response.model_version_id)
        return ServingModel(response.model, response.model_version_id or "1", uploaded=True)

    # ------------------------------------------------------------------------ endpoints
    def find_endpoint(self) -> Any | None:
        """The endpoint ``--endpoint`` names: by resource name, or the one with that display name."""
        from google.api_core import exceptions as api_exceptions

        client = self._endpoint_client()
        name = self.request.endpoint
        if name.startswith("projects/"):
            try:
                return self._call(f"endpoint {name}", lambda: client.get_endpoint(name=name, timeout=deadline.deadline_s()), missing=True)
            except api_exceptions.NotFound as exc:
                raise GnnflowError(f"--endpoint {name}: no such endpoint at {self.request.api_url}") from exc
        wanted = f'display_name="{name}"'
        found = self._call(
            f"looking up endpoint {name!r}",
            lambda: list(client.list_endpoints(request={"parent": self.request.parent, "filter": wanted}, timeout=deadline.deadline_s())),
        )
        if len(found) > 1:
            names = ", ".join(e.name for e in found)
            raise GnnflowError(f"--endpoint {name!r}: {len(found)} endpoints have this display name ({names}); pass one's resource name")
        return found[0] if found else None

    def create_endpoint(self) -> Any:
        from google.cloud.aiplatform_v1 import types

        client = self._endpoint_client()
        subject = f"creating endpoint {self.request.endpoint!r} in {self.request.parent}"
        endpoint = types.Endpoint(display_name=self.request.endpoint, labels={"gnnflow": "serving"})
        operation = self._call(
            subject, lambda: client.create_endpoint(parent=self.request.parent, endpoint=endpoint, timeout=deadline.deadline_s()),
            idempotent=False,
        )  # fmt: skip
        created = self._wait(operation, subject)
        log.info("deploy: created endpoint %s (%s)", created.name, self.request.endpoint)
        return created

    def deploy(self, endpoint: str, model: ServingModel, display_name: str, split: Mapping[str, int]) -> Deployment:
        """Deploys ``model`` to ``endpoint`` on dedicated machines, with ``split`` (``NEW``: this deployment)."""
        from google.cloud.aiplatform_v1 import types

        request = self.request
        deployed = types.DeployedModel(
            model=model.versioned,
            display_name=display_name[:128],
            dedicated_resources=types.DedicatedResources(
                machine_spec=types.MachineSpec(machine_type=request.machine_type),
                min_replica_count=request.min_replicas,
                max_replica_count=request.max_replicas,
            ),
            service_account=request.service_account or "",
        )
        traffic = {("0" if key == NEW else key): percent for key, percent in split.items()}
        client = self._endpoint_client()
        subject = f"deploying {model.versioned} to {endpoint}"
        log.info(
            "deploy: %s on %s, %d to %d replicas (this takes minutes)",
            subject,
            request.machine_type,
            request.min_replicas,
            request.max_replicas,
        )
        operation = self._call(
            subject,
            lambda: client.deploy_model(endpoint=endpoint, deployed_model=deployed, traffic_split=traffic, timeout=deadline.deadline_s()),
            idempotent=False,
        )
        response = self._wait(operation, subject)
        new_id = response.deployed_model.id
        final = {(new_id if key == "0" else key): percent for key, percent in traffic.items()}
        return Deployment(endpoint, new_id, deployed=True, endpoint_created=False, traffic_split=final)

    # ------------------------------------------------------------------------ plumbing
    def _call(self, subject: str, fn: Callable[[], T], *, idempotent: bool = True, missing: bool = False) -> T:
        """``fn()`` within the service deadline; a refusal is one line (a 404 is raised as is with ``missing``)."""
        from google.api_core import exceptions as api_exceptions

        try:
            return deadline.call(self.service, subject, fn, idempotent=idempotent)
        except api_exceptions.NotFound as exc:
            if missing:
                raise
            raise GnnflowError(f"{subject}: not found at {self.request.api_url}") from exc
        except api_exceptions.GoogleAPICallError as exc:
            raise GnnflowError(f"{subject}: {SERVICE_NAME} at {self.request.api_url} refused: {api_message(exc)}") from exc

    def _wait(self, operation: Any, subject: str) -> Any:
        """The long-running operation's result, waited for up to ``--operation-timeout-s``."""
        from google.api_core import exceptions as api_exceptions

        limit = self.request.operation_timeout_s
        name = getattr(getattr(operation, "operation", None), "name", "") or "unknown"
        try:
            return operation.result(timeout=limit)
        except concurrent.futures.TimeoutError as exc:
            raise GnnflowError(
                f"{subject}: not finished after {limit:g} s (operation {name}); it may still finish: run the same command "
                "again later, it reuses what exists (or wait longer: --operation-timeout-s)"
            ) from exc
        except api_exceptions.GoogleAPICallError as exc:
            raise GnnflowError(f"{subject}: {SERVICE_NAME} failed it: {api_message(exc)} (operation {name})") from exc
        except Exception as exc:
            if deadline.is_transient(exc):
                raise GnnflowError(
                    f"{subject}: lost {SERVICE_NAME} at {self.request.api_url} while waiting for operation {name} "
                    f"({deadline.first_line(exc)}); it may still finish: run the same command again, it reuses what exists"
                ) from exc
            raise

    def _model_client(self) -> Any:
        if self._models is None:
            from google.cloud.aiplatform_v1.services.model_service import ModelServiceClient

            self._models = self._client(ModelServiceClient)
        return self._models

    def _endpoint_client(self) -> Any:
        if self._endpoints is None:
            from google.cloud.aiplatform_v1.services.endpoint_service import EndpointServiceClient

            self._endpoints = self._client(EndpointServiceClient)
        return self._endpoints

    def _client(self, kind: Any) -> Any:
        from google.auth import exceptions as auth_exceptions

        try:
            endpoint = self.request.client_endpoint
            return kind(credentials=credentials_for(endpoint), transport="rest", client_options={"api_endpoint": endpoint})
        except auth_exceptions.DefaultCredentialsError as exc:
            raise GnnflowError(f"gnnflow deploy: no Google Cloud credentials for {SERVICE_NAME} ({deadline.first_line(exc)})") from exc
