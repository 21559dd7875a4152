"""What ``gnnflow deploy`` is asked to do, and what Vertex AI Prediction would refuse about it.

Every check here runs before any request is sent: a deployment that Vertex AI refuses does so
only after the model is uploaded and the endpoint exists, and one whose container cannot start
fails after many minutes of replicas restarting. The machine rules are Vertex AI Prediction's
(dedicated CPU machines; no shared-core machines; GPU machine families only with their GPUs,
which ``gnnflow deploy`` does not attach) and Compute Engine's N1 and E2 sizes. Other families
are let through for Vertex AI to judge, as :mod:`pipelines.vertex_machines` does for jobs.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field

from components.errors import GnnflowError
from components.services.endpoints import endpoint_url, vertex_endpoint
from pipelines.vertex_machines import GPU_FAMILIES

DEFAULT_ENDPOINT = "gnnflow"
DEFAULT_MACHINE = "n1-standard-4"
NEW = "new"  # the deployment being made, in --traffic-split
PORT = 8080  # the server's $AIP_HTTP_PORT: the first of the container's ports
PREDICT_ROUTE, HEALTH_ROUTE = "/predict", "/health"

_MACHINE = re.compile(r"[a-z][a-z0-9]*(-[a-z0-9]+)+")
_SHARED_CORE = ("e2-micro", "e2-small", "e2-medium", "f1-micro", "g1-small")
# Compute Engine's sizes (vCPUs) of the families whose every size is known here.
_SIZES = {
    # Vertex AI's prediction machine table starts N1 at 2 vCPUs (highcpu at 4); 64 and 96 are
    # Compute Engine sizes the table may not list yet, let through.
    r"n1-(standard|highmem)-(\d+)": {2, 4, 8, 16, 32, 64, 96},
    r"n1-highcpu-(\d+)": {4, 8, 16, 32, 64, 96},
    r"e2-(standard|highcpu)-(\d+)": {2, 4, 8, 16, 32},
    r"e2-highmem-(\d+)": {2, 4, 8, 16},
}
_REGION = re.compile(r"^[a-z]+-[a-z]+[0-9]+$")
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_DEPLOYED_ID = re.compile(r"^[0-9]+$")
_ENDPOINT_RESOURCE = re.compile(r"^projects/[^/]+/locations/[^/]+/endpoints/[0-9]+$")


@dataclass(frozen=True)
class DeployRequest:
    """One ``gnnflow deploy``: what to serve, where, and on what. Refuses on creation what
    Vertex AI would refuse (see the module docstring), each in one line naming the flag."""

    model: str  # a published model URI, or REGISTRY@SELECTOR
    partitions: str
    project: str
    region: str
    image: str
    embeddings: str | None = None
    endpoint: str = DEFAULT_ENDPOINT  # a display name (found or created), or projects/P/locations/R/endpoints/ID
    machine_type: str = DEFAULT_MACHINE
    min_replicas: int = 1
    max_replicas: int = 1
    traffic_split: Mapping[str, int] | None = None  # deployed model id (or NEW) → percent; None: 100 % to the new one
    api_endpoint: str | None = None  # None: https://REGION-aiplatform.googleapis.com
    env: Mapping[str, str] = field(default_factory=dict)
    service_account: str | None = None
    operation_timeout_s: float = 1800.0  # how long an upload, endpoint creation or deployment may take

    def __post_init__(self) -> None:
        if not self.project:
            raise GnnflowError("gnnflow deploy needs --project")
        if not _REGION.match(self.region or ""):
            raise GnnflowError(f"--region {self.region!r} is not a Vertex AI region (like europe-west4, us-central1)")
        check_image(self.image)
        check_replicas(self.min_replicas, self.max_replicas)
        check_machine_type(self.machine_type)
        for flag, uri in (("--partitions", self.partitions), ("--embeddings", self.embeddings)):
            if uri is not None and not uri.startswith("gs://"):
                raise GnnflowError(f"{flag} {uri}: the server on Vertex AI reads it from Cloud Storage only; publish it to a gs:// output")
        if self.traffic_split is not None:
            check_traffic_split(self.traffic_split)
        for name in self.env:
            if not _ENV_NAME.match(name) or name.startswith("AIP_"):
                raise GnnflowError(
                    f"--env {name}: an environment variable name is letters, digits and '_', not starting with AIP_ (Vertex AI's)"
                )
        if "/" in self.endpoint and not _ENDPOINT_RESOURCE.match(self.endpoint):
            raise GnnflowError(f"--endpoint {self.endpoint!r}: give a display name, or projects/P/locations/R/endpoints/ID")
        if _ENDPOINT_RESOURCE.match(self.endpoint) and not self.endpoint.startswith(f"projects/{self.project}/locations/{self.region}/"):
            raise GnnflowError(f"--endpoint {self.endpoint}: not in --project {self.project} and --region {self.region}")
        if not 0 < len(self.endpoint) <= 128:
            raise GnnflowError(f"--endpoint {self.endpoint!r}: a display name is 1 to 128 characters")
        if not self.operation_timeout_s > 0:
            raise GnnflowError(f"--operation-timeout-s {self.operation_timeout_s:g}: expected a number of seconds greater than 0")

    @property
    def api_url(self) -> str:
        """The Vertex AI API's base URL that requests go to."""
        return endpoint_url(self.client_endpoint)

    @property
    def client_endpoint(self) -> str:
        """What the clients are given: ``--api-endpoint``, or the region's Vertex AI host."""
        return vertex_endpoint(self.region, self.api_endpoint)

    @property
    def parent(self) -> str:
        return f"projects/{self.project}/locations/{self.region}"

    def serve_args(self) -> list[str]:
        """The container's arguments after ``gnnflow``: the server, which reads the model from
        ``$AIP_STORAGE_URI`` (where Vertex AI copied the uploaded model folder)."""
        args = ["serve", "--partitions", self.partitions]
        return args + (["--embeddings", self.embeddings] if self.embeddings else [])


def check_image(image: str) -> None:
    """Vertex AI pulls the serving image from a registry: its name must start with that registry's host."""
    host, slash, _ = (image or "").partition("/")
    if not slash or not ("." in host or ":" in host or host == "localhost"):
        raise GnnflowError(
            f"--image {image!r} names no registry host: Vertex AI pulls the serving container from a registry; push the "
            "step image to one and name it there (like europe-west4-docker.pkg.dev/PROJECT/REPOSITORY/gnnflow:TAG)"
        )
    if host.split(":")[0] in ("localhost", "127.0.0.1"):
        raise GnnflowError(f"--image {image!r} is on this machine's registry, which Vertex AI cannot reach; push it to Artifact Registry")


def check_replicas(low: int, high: int) -> None:
    if low < 1:
        raise GnnflowError(f"--min-replicas {low}: Vertex AI serves with at least 1 replica")
    if high < low:
        raise GnnflowError(f"--max-replicas {high} is less than --min-replicas {low}")


def check_machine_type(machine: str) -> None:
    """Refuses the machine types Vertex AI Prediction is known to refuse for a CPU deployment."""
    if not _MACHINE.fullmatch(machine or ""):
        raise GnnflowError(f"--machine-type {machine!r} is not a Compute Engine machine type (like n1-standard-4, n2-standard-8)")
    family = machine.split("-")[0]
    if machine in _SHARED_CORE:
        raise GnnflowError(
            f"--machine-type {machine}: a shared-core machine, which Vertex AI Prediction does not serve on; use {DEFAULT_MACHINE}"
        )
    if family in GPU_FAMILIES or family.startswith("ct"):
        raise GnnflowError(
            f"--machine-type {machine} comes with GPUs or TPUs, which gnnflow deploy does not attach: the server runs on CPUs "
            f"(like {DEFAULT_MACHINE}, n2-standard-8)"
        )
    for pattern, sizes in _SIZES.items():
        match = re.fullmatch(pattern, machine)
        if match and int(match.groups()[-1]) not in sizes:
            listed = ", ".join(str(n) for n in sorted(sizes))
            raise GnnflowError(f"--machine-type {machine}: Vertex AI Prediction offers these machines with {listed} vCPUs")


def check_traffic_split(split: Mapping[str, int]) -> None:
    for key, percent in split.items():
        if key != NEW and not _DEPLOYED_ID.match(key):
            raise GnnflowError(f"--traffic-split {key}={percent}: name '{NEW}' or a deployed model's id (a number)")
        if not 0 <= percent <= 100:
            raise GnnflowError(f"--traffic-split {key}={percent}: a share is a percentage from 0 to 100")
    if sum(split.values()) != 100:
        raise GnnflowError(f"--traffic-split {format_split(split)} sums to {sum(split.values())}; the shares must sum to 100")


def parse_traffic_split(text: str) -> dict[str, int]:
    """``new=80,1234=20`` → {"new": 80, "1234": 20}; a one-line error naming the malformed part."""
    split: dict[str, int] = {}
    for part in text.split(","):
        key, sep, value = part.strip().partition("=")
        if not sep or not value.strip().isdigit() or not key.strip():
            raise GnnflowError(f"--traffic-split {text!r}: expected ID=PERCENT pairs, like {NEW}=20,1234567=80 ('{NEW}': this deployment)")
        if key.strip() in split:
            raise GnnflowError(f"--traffic-split {text!r} names {key.strip()} twice")
        split[key.strip()] = int(value)
    return split


def parse_env(items: list[str]) -> dict[str, str]:
    """``--env NAME=VALUE`` (repeatable) → a mapping."""
    env: dict[str, str] = {}
    for item in items:
        name, sep, value = item.partition("=")
        if not sep or not name:
            raise GnnflowError(f"--env {item!r}: expected NAME=VALUE")
        env[name] = value
    return env


def format_split(split: Mapping[str, int]) -> str:
    return ",".join(f"{k}={v}" for k, v in split.items())
