"""``gnnflow deploy``: serve a trained model on a Vertex AI endpoint with gnnflow's own server.

``gnnflow deploy --model MODEL --partitions P [--embeddings E] --project P --region R --image IMAGE
[--endpoint NAME] [--machine-type M] [--min-replicas N --max-replicas N] [--traffic-split new=100]``

1. resolves MODEL (a published model folder on Cloud Storage, or ``REGISTRY@blessed`` / ``@vN``);
2. uploads it to the Vertex AI Model Registry with the step image as the serving container:
   ``gnnflow serve --partitions P [--embeddings E]`` on port 8080, predict route ``/predict``,
   health route ``/health``; the server reads the model from ``$AIP_STORAGE_URI``, where Vertex AI
   copies the model folder (the upload's artifact URI);
3. finds the endpoint with that display name, or creates it;
4. deploys the model there on dedicated machines and gives it the traffic (100 % unless
   ``--traffic-split`` says otherwise), then prints the endpoint and its predict URL.

A rerun with the same model, container and endpoint uploads and deploys nothing: the serving
model is found by a label holding a digest of its artifacts (folder and generation) and container,
and a deployment of it on the endpoint is reused. A version of a ``vertex://`` registry is deployed
itself when its container already runs the server this way; the registry's own uploads carry no
serving command (and cannot: the partitions belong to the deployment), so otherwise a serving
model is uploaded whose labels name the registry version.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import logging
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass

from components import storage
from components.errors import GnnflowError
from components.registry.base import VERTEX_SCHEME, split_reference
from components.registry.open import resolve_model_reference
from pipelines.deploy_request import (
    DEFAULT_ENDPOINT,
    DEFAULT_MACHINE,
    NEW,
    DeployRequest,
    format_split,
    parse_env,
    parse_traffic_split,
)
from pipelines.deploy_vertex import KEY_LABEL, Deployment, ServingModel, VertexPrediction, container_signature

log = logging.getLogger("gnnflow.deploy")

IMAGE_VARIABLE = "GNNFLOW_IMAGE"
ENDPOINT_VARIABLE = "GNNFLOW_VERTEX_ENDPOINT"
_LABEL = re.compile(r"[^a-z0-9_-]")


@dataclass(frozen=True)
class RegistryVersion:
    """A version of a Vertex AI Model Registry model that MODEL named."""

    model: str  # projects/P/locations/R/models/ID
    version: int


@dataclass(frozen=True)
class ResolvedModel:
    artifact_uri: str  # the published model folder on Cloud Storage
    generation: str  # its published generation (a re-published folder is another model)
    registry: RegistryVersion | None = None


@dataclass(frozen=True)
class DeployResult:
    endpoint: str
    predict_url: str
    model: ServingModel
    deployment: Deployment


def resolve_model(text: str) -> ResolvedModel:
    """The published model folder MODEL names; a one-line error for one outside Cloud Storage."""
    reference = split_reference(text)
    registry: RegistryVersion | None = None
    if reference is not None and reference[0].startswith(VERTEX_SCHEME):
        from components.registry.vertex import VertexRegistry  # aiplatform's SDK loads only for Vertex registries

        opened = VertexRegistry.open(reference[0], create=False)
        version = opened.resolve(reference[1])
        model_uri, registry = version.model_uri, RegistryVersion(opened.target.resource_name, version.version)
    elif reference is not None:
        model_uri = resolve_model_reference(text)
    else:
        model_uri = text
    if not model_uri.startswith("gs://"):
        named = f"{model_uri} ({text})" if model_uri != text else model_uri
        raise GnnflowError(f"--model {named}: Vertex AI copies a model from Cloud Storage only; publish it to a gs:// output (output.root)")
    model_uri = model_uri.rstrip("/")
    published = storage.open_published(model_uri, step="train")
    return ResolvedModel(model_uri, published.manifest.generation, registry)


def deploy(request: DeployRequest) -> DeployResult:
    """Uploads (or finds) the serving model, finds or creates the endpoint, deploys (or finds the deployment)."""
    model = resolve_model(request.model)
    storage.open_published(request.partitions.rstrip("/"), step="partition")
    if request.embeddings:
        storage.open_published(request.embeddings.rstrip("/"), step="infer")
    vertex = VertexPrediction(request)
    endpoint = vertex.find_endpoint()  # before anything is created: the traffic split is checked against it
    deployed = list(endpoint.deployed_models) if endpoint is not None else []
    split = dict(request.traffic_split or {NEW: 100})
    _check_split(split, [d.id for d in deployed], request.endpoint)
    serving = _serving_model(vertex, request, model)
    existing = next((d for d in deployed if _same_model(d, serving)), None)
    if endpoint is not None and existing is not None:
        log.info("deploy: %s is already deployed to %s as %s; not deploying it again", serving.versioned, endpoint.name, existing.id)
        if request.traffic_split is not None:
            log.warning(
                "deploy: --traffic-split %s is not applied to a deployment that exists; change the traffic in the console "
                "or with gcloud ai endpoints update --traffic-split", format_split(request.traffic_split),
            )  # fmt: skip
        deployment = Deployment(
            endpoint.name, existing.id, deployed=False, endpoint_created=False, traffic_split=dict(endpoint.traffic_split)
        )
    else:
        created = endpoint is None
        if endpoint is None:
            endpoint = vertex.create_endpoint()
        deployment = vertex.deploy(endpoint.name, serving, _display_name(request, model), split)
        deployment = Deployment(deployment.endpoint, deployment.deployed_model_id, True, created, deployment.traffic_split)
        idle = [d.id for d in deployed if deployment.traffic_split.get(d.id, 0) == 0]
        if idle:
            log.warning(
                "deploy: %s keeps deployed models %s with 0 %% of the traffic (they still run and cost): undeploy them "
                "when the new one serves (gcloud ai endpoints undeploy-model)", endpoint.name, ", ".join(idle),
            )  # fmt: skip
    predict_url = f"{request.api_url}/v1/{deployment.endpoint}:predict"
    return DeployResult(deployment.endpoint, predict_url, serving, deployment)


def _serving_model(vertex: VertexPrediction, request: DeployRequest, model: ResolvedModel) -> ServingModel:
    """The registry version itself when it serves this way already, else the serving model an
    earlier deploy uploaded for the same artifacts and container, else a new upload."""
    spec = vertex.container_spec()
    if model.registry is not None and model.registry.model.startswith(request.parent + "/"):
        version = vertex.model_version(model.registry.model, str(model.registry.version))
        if container_signature(version.container_spec) == container_signature(spec):
            log.info("deploy: %s@%d serves with this container already; deploying it", model.registry.model, model.registry.version)
            return ServingModel(model.registry.model, str(model.registry.version), uploaded=False)
    key = _serving_key(model, spec)
    found = vertex.find_serving_model(key)
    if found is not None:
        return found
    labels = {KEY_LABEL: key, "gnnflow-generation": _label(model.generation)}
    if model.registry is not None:
        labels.update(
            {
                "gnnflow-registry-model": _label(model.registry.model.rsplit("/", 1)[-1]),
                "gnnflow-registry-version": str(model.registry.version),
            }
        )
    source = f"{model.registry.model}@{model.registry.version} ({model.artifact_uri})" if model.registry else model.artifact_uri
    description = f"gnnflow serving model: {source}, generation {model.generation}; partitions {request.partitions}" + (
        f"; embeddings {request.embeddings}" if request.embeddings else ""
    )
    return vertex.upload(model.artifact_uri, _display_name(request, model), description, labels)


def _serving_key(model: ResolvedModel, spec: object) -> str:
    """A digest of what the serving model is: its artifacts (folder and generation) and its container."""
    text = json.dumps([model.artifact_uri, model.generation, list(container_signature(spec))], sort_keys=True, default=list)
    return hashlib.sha256(text.encode()).hexdigest()[:40]


def _display_name(request: DeployRequest, model: ResolvedModel) -> str:
    if model.registry is not None:
        return f"{model.registry.model.rsplit('/', 1)[-1]} v{model.registry.version}"
    return request.endpoint if not request.endpoint.startswith("projects/") else DEFAULT_ENDPOINT


def _same_model(deployed: object, serving: ServingModel) -> bool:
    """Whether a deployed model is ``serving`` (Vertex AI may name the project by number: compare the model id)."""
    name = str(getattr(deployed, "model", ""))
    model_id, _, version = name.rpartition("/")[2].partition("@")
    wanted = serving.name.rsplit("/", 1)[-1]
    return model_id == wanted and (version or str(getattr(deployed, "model_version_id", "")) or "1") == serving.version


def _check_split(split: Mapping[str, int], deployed: list[str], endpoint: str) -> None:
    unknown = [key for key in split if key != NEW and key not in deployed]
    if unknown:
        have = ", ".join(deployed) or "none"
        raise GnnflowError(
            f"--traffic-split {format_split(split)}: endpoint {endpoint!r} has no deployed model {', '.join(unknown)} (it has: {have})"
        )
    if not deployed and split.get(NEW, 0) != 100:
        raise GnnflowError(f"--traffic-split {format_split(split)}: endpoint {endpoint!r} serves nothing yet; give {NEW}=100")


def _label(value: str) -> str:
    return _LABEL.sub("-", value.lower())[:63]


def summary(result: DeployResult) -> str:
    model, deployment = result.model, result.deployment
    return "\n".join(
        [
            f"endpoint: {result.endpoint}" + (" (created)" if deployment.endpoint_created else ""),
            f"predict URL: {result.predict_url}",
            f"model: {model.versioned}" + (" (uploaded)" if model.uploaded else " (already uploaded)"),
            f"deployed model: {deployment.deployed_model_id}" + ("" if deployment.deployed else " (already deployed; nothing changed)"),
            f"traffic: {format_split(deployment.traffic_split)}",
        ]
    )


# ---------------------------------------------------------------------------- command line
def add_parser(commands: argparse._SubParsersAction) -> None:
    """Adds ``deploy`` to the ``gnnflow`` parser."""
    parser = commands.add_parser(
        "deploy",
        help="upload a model to the Vertex AI Model Registry and deploy it to an endpoint (gnnflow serve)",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--model", required=True, help="a published model folder (gs://...), or REGISTRY@blessed / REGISTRY@vN")
    parser.add_argument("--partitions", required=True, help="the published partitions the server samples from (gs://...)")
    parser.add_argument("--embeddings", help="the published embeddings (infer's output, gs://...) for top-k candidates")
    parser.add_argument("--project", required=True, help="Google Cloud project")
    parser.add_argument("--region", required=True, help="Vertex AI region, e.g. europe-west4")
    parser.add_argument(
        "--image", default=os.environ.get(IMAGE_VARIABLE), help=f"the step image in a registry (default: ${IMAGE_VARIABLE})"
    )
    parser.add_argument(
        "--endpoint",
        default=DEFAULT_ENDPOINT,
        help=f"endpoint display name, found or created (default: {DEFAULT_ENDPOINT}), or its resource name",
    )
    parser.add_argument("--machine-type", default=DEFAULT_MACHINE, help=f"machine of each replica (default: {DEFAULT_MACHINE})")
    parser.add_argument("--min-replicas", type=int, default=1, help="replicas always running (default: 1)")
    parser.add_argument("--max-replicas", type=int, help="replicas under load (default: --min-replicas)")
    parser.add_argument(
        "--traffic-split",
        metavar="ID=PERCENT,...",
        help=f"traffic shares, '{NEW}' being this deployment, e.g. {NEW}=20,1234567=80 (default: {NEW}=100)",
    )
    parser.add_argument(
        "--env", action="append", default=[], metavar="NAME=VALUE", help="an environment variable of the server (repeatable)"
    )
    parser.add_argument("--service-account", help="the service account the server runs as (it reads the gs:// folders)")
    parser.add_argument(
        "--operation-timeout-s", type=float, default=1800.0, help="how long an upload or deployment may take (default: 1800)"
    )
    parser.add_argument(
        "--api-endpoint", default=os.environ.get(ENDPOINT_VARIABLE) or None,
        help=f"Vertex AI API endpoint (default: ${ENDPOINT_VARIABLE}, else REGION-aiplatform.googleapis.com)",
    )  # fmt: skip
    parser.set_defaults(handler=run_deploy)


def request_from(args: argparse.Namespace) -> DeployRequest:
    if not args.image:
        raise GnnflowError(f"gnnflow deploy needs --image (the step image in a registry) or ${IMAGE_VARIABLE}")
    return DeployRequest(
        model=args.model,
        partitions=args.partitions,
        embeddings=args.embeddings,
        project=args.project,
        region=args.region,
        image=args.image,
        endpoint=args.endpoint,
        machine_type=args.machine_type,
        min_replicas=args.min_replicas,
        max_replicas=args.min_replicas if args.max_replicas is None else args.max_replicas,
        traffic_split=parse_traffic_split(args.traffic_split) if args.traffic_split else None,
        api_endpoint=args.api_endpoint,
        env=parse_env(args.env),
        service_account=args.service_account,
        operation_timeout_s=args.operation_timeout_s,
    )


def run_deploy(args: argparse.Namespace) -> None:
    print(summary(deploy(request_from(args))))
