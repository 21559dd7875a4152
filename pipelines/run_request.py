"""What a pipeline run gets, checked before anything is sent: where it goes, its parameters, its package.

Everything is checked here: the config is read and validated with its overrides (errors name
the key), the input tables are listed to fingerprint them, and the pipeline package is compiled
(or a given one checked). A run's parameters are

- ``config``: the validated config as canonical YAML text, so KFP's cache keys on its content
  (``RunRequest.config_as="uri"`` passes the config's URI instead; schedules use that),
- ``overrides``: the dotted-key overrides as a JSON object (visible in the console),
- ``data_version``: a fingerprint of every input table file (size and generation / CRC32C on
  GCS), so a cached step reruns when new data lands at the same URIs,
- ``infer_mode``: ``sampled`` or ``exact``.

``pipelines.submit`` (one run), ``pipelines.schedule`` and ``pipelines.trigger`` share it;
``pipelines.vertex_submit`` and ``pipelines.kfp_submit`` send the run.
"""

from __future__ import annotations

import contextlib
import datetime
import json
import logging
import os
import re
import tempfile
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import yaml

from components import storage
from components.config import EdgeTableSpec, GnnflowConfig, NodeTableSpec, load_config, resolve_config
from components.config.preflight import PlannedRun
from components.errors import GnnflowError
from components.registry.open import resolve_model_reference
from components.services.endpoints import vertex_endpoint
from components.storage import gcs as gcs_backend
from components.tables.reading import tables_fingerprint
from pipelines.preflight import check_before_run

log = logging.getLogger("gnnflow.submit")

PIPELINE_PARAMETERS = ("config", "overrides", "data_version", "infer_mode")
_EXPERIMENT = re.compile(r"^[a-z0-9][-a-z0-9]{0,127}$")  # a Vertex AI metadata context id


# ---------------------------------------------------------------------------------- options
@dataclass(frozen=True)
class VertexTarget:
    """A Vertex AI Pipelines project and region (endpoint: ``{region}-aiplatform.googleapis.com``).

    An ``http://`` endpoint (an emulator, a recorder) gets anonymous credentials: gnnflow never
    sends credentials over plain HTTP. ``check_pipeline_root``: the root's bucket must exist.
    ``experiment``: the Vertex AI Experiment the run joins (``gnnflow submit --experiment``).
    """

    project: str
    region: str
    pipeline_root: str | None = None
    service_account: str | None = None
    api_endpoint: str | None = None
    check_pipeline_root: bool = True
    experiment: str | None = None  # a Vertex AI Experiment the run is associated with (created if missing)

    def __post_init__(self) -> None:
        missing = [flag for flag, value in (("--project", self.project), ("--region", self.region)) if not value]
        if missing:
            raise GnnflowError(f"Vertex AI needs {' and '.join(missing)} (or use --kfp-host for a KFP endpoint)")
        if self.pipeline_root is not None and not self.pipeline_root.startswith("gs://"):
            raise GnnflowError(f"--pipeline-root must be a gs:// URI on Vertex AI, got {self.pipeline_root!r}")
        if self.experiment is not None and not _EXPERIMENT.match(self.experiment):
            raise GnnflowError(
                f"--experiment {self.experiment!r}: a Vertex AI Experiment name is lower-case letters, digits "
                "and dashes, starting with a letter or digit, at most 128 characters"
            )

    @property
    def endpoint(self) -> str:
        return vertex_endpoint(self.region, self.api_endpoint)


@dataclass(frozen=True)
class KfpTarget:
    """A Kubeflow Pipelines API endpoint; ``service_account`` is a Kubernetes one, ``token`` a
    bearer token (the CLI reads ``$GNNFLOW_KFP_TOKEN``, never a command-line argument)."""

    host: str
    experiment: str = "gnnflow"
    namespace: str | None = None
    pipeline_root: str | None = None
    service_account: str | None = None
    token: str | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        if not self.host.startswith(("http://", "https://")):
            raise GnnflowError(f"--kfp-host must start with http:// or https://, got {self.host!r}")


Target = VertexTarget | KfpTarget


@dataclass(frozen=True)
class RunRequest:
    """What to run: a config file (local or gs://), its overrides and how the run is named.

    ``package`` is a compiled pipeline YAML; without it the pipeline is compiled for ``image``.
    ``job_id`` makes a submission idempotent: the same id is never run twice (Vertex AI: the
    pipeline job id; KFP: a suffix of the run name, looked up in the experiment first).
    """

    config: str
    overrides: Mapping[str, Any] = field(default_factory=dict)
    display_name: str | None = None
    labels: Mapping[str, str] = field(default_factory=dict)
    infer_mode: Literal["auto", "sampled", "exact"] = "auto"
    enable_caching: bool | None = None
    package: str | None = None
    image: str | None = None
    job_id: str | None = None
    config_as: Literal["text", "uri"] = "text"
    from_model: str | None = None  # inference-only: a published model URI or REGISTRY@blessed / @vN, resolved when the run starts


@dataclass(frozen=True)
class WaitOptions:
    """``--wait``: poll the run until it ends; a failed, cancelled or timed-out run is an error."""

    poll_seconds: float = 30.0
    timeout_seconds: float | None = None


@dataclass(frozen=True)
class SubmittedRun:
    target: Literal["vertex", "kfp"]
    name: str  # Vertex AI: the job's resource name; KFP: the run id
    display_name: str
    parameters: dict[str, str]
    url: str
    state: str | None = None


# ------------------------------------------------------------------------------- parameters
@dataclass(frozen=True)
class PreparedRun:
    """A validated request: the parameters a run gets and the name it will show."""

    parameters: dict[str, str]
    display_name: str
    config: GnnflowConfig


def prepare_run(request: RunRequest) -> PreparedRun:
    """Reads and validates the config and fingerprints its tables; nothing is sent yet."""
    base = load_config(request.config)
    text = base.to_yaml()
    overrides = json.dumps(dict(request.overrides), sort_keys=True)
    resolved = resolve_config(text, overrides)
    sections: list[tuple[str, Sequence[NodeTableSpec | EdgeTableSpec]]] = [
        ("graph.nodes", resolved.graph.nodes),
        ("graph.edges", resolved.graph.edges),
    ]
    for section, tables in sections:
        for i, table in enumerate(tables):
            if not table.uri.startswith(("gs://", "bq://")):
                raise GnnflowError(
                    f"config {request.config}: {section}[{i}].uri {table.uri!r} is not a gs:// URI (nor a bq:// table); "
                    "a pipeline run on Vertex AI or KFP can only read tables on GCS or in BigQuery"
                )
    # bq:// columns, exact inference, the export dataset, a model whose transforms cannot encode
    # the tables: refused here, not by a task hours later (the reference resolves again at run time)
    model = resolve_model_reference(request.from_model) if request.from_model else None
    check_before_run(PlannedRun(resolved, request.infer_mode, local=False, model=model, overridden=tuple(request.overrides)))
    config_parameter = str(storage.parse_uri(request.config)) if request.config_as == "uri" else text
    if request.config_as == "uri" and not config_parameter.startswith("gs://"):
        raise GnnflowError(f"config {request.config}: a run that reads its config by URI needs a gs:// URI")
    parameters = {
        "config": config_parameter,
        "overrides": overrides,
        "data_version": data_version(resolved),
        "infer_mode": request.infer_mode,
    }
    if request.from_model:
        parameters["model"] = request.from_model
    stamp = datetime.datetime.now(datetime.UTC).strftime("%Y%m%d-%H%M%S")
    return PreparedRun(parameters, request.display_name or f"gnnflow-{stamp}", resolved)


def data_version(config: GnnflowConfig) -> str:
    """A fingerprint of every file the config's tables expand to (name, size, generation, CRC32C)."""
    return "sha256:" + tables_fingerprint(config.graph)


@contextlib.contextmanager
def pipeline_package(request: RunRequest, config: GnnflowConfig) -> Iterator[str]:
    """``request.package`` after checking its parameters, or the pipeline compiled now for
    ``request.image`` with the task requests of ``config.resources`` (fixed at compile time)."""
    if request.package:
        check_package(request.package, config, inference_only=request.from_model is not None)
        yield request.package
        return
    from pipelines.dag import DEFAULT_IMAGE, compile_pipeline  # kfp's compiler loads only when needed

    image = request.image or DEFAULT_IMAGE
    with tempfile.TemporaryDirectory(prefix="gnnflow-package-") as folder:
        path = os.path.join(folder, "gnnflow.yaml")
        compile_pipeline(
            path, image, config.resources, export=config.output.exports, registry=config.registry, from_model=request.from_model is not None
        )
        log.info("compiled the pipeline for image %s", image)
        yield path


def check_package(path: str, config: GnnflowConfig | None = None, inference_only: bool = False) -> None:
    """A package must be a KFP pipeline spec taking gnnflow's four parameters (and ``model``, for an
    inference-only run), compiled for ``config``'s layout of the multi-worker steps (runner and
    replica count), if given."""
    if not os.path.isfile(path):
        raise GnnflowError(f"pipeline package {path} does not exist")
    try:
        with open(path, encoding="utf-8") as f:
            spec = next(d for d in yaml.safe_load_all(f) if d and "root" in d)
        declared = spec["root"].get("inputDefinitions", {}).get("parameters", {})
    except (yaml.YAMLError, StopIteration, AttributeError, TypeError, KeyError) as exc:
        raise GnnflowError(f"pipeline package {path} is not a compiled KFP pipeline spec") from exc
    missing = [p for p in PIPELINE_PARAMETERS if p not in declared]
    if missing:
        raise GnnflowError(f"pipeline package {path} lacks the parameter(s) {', '.join(missing)}: is it gnnflow's pipeline?")
    if inference_only != ("model" in declared):
        raise GnnflowError(
            f"pipeline package {path} is gnnflow's {'inference-only' if 'model' in declared else 'training'} pipeline: "
            + ("drop --from-model, or compile with it" if "model" in declared else "compile it with --from-model, or drop --from-model")
        )
    tasks = spec["root"].get("dag", {}).get("tasks", {})
    multi_worker = tasks.get("train") or tasks.get("infer") or {}
    compiled = multi_worker.get("inputs", {}).get("parameters", {}).get("replicas")
    if config is not None and compiled is not None:  # the same check the steps make, before anything is sent
        from components.runtime.pipeline_task import check_compiled_layout

        try:
            check_compiled_layout("train", config, int(compiled["runtimeValue"]["constant"]))
        except GnnflowError as exc:
            raise GnnflowError(f"pipeline package {path}: {str(exc).removeprefix('train: ')}") from None


def check_pipeline_root(root: str) -> None:
    """The pipeline root's bucket must exist and be readable, named in the error otherwise."""
    uri = storage.parse_uri(root)
    assert isinstance(uri, storage.GcsUri)
    try:
        exists = gcs_backend.bucket_exists(uri.bucket)
    except GnnflowError as exc:
        raise GnnflowError(f"cannot check the pipeline root bucket: {exc} (--no-root-check skips this)") from exc
    if not exists:
        raise GnnflowError(
            f"pipeline root {root}: bucket gs://{uri.bucket} does not exist; create it in the pipeline's region "
            f"(gcloud storage buckets create gs://{uri.bucket} --location=REGION) or pass another --pipeline-root"
        )


class SubmissionError(GnnflowError):
    """The service refused or failed a request; ``retryable`` when trying again may succeed."""

    def __init__(self, message: str, retryable: bool = False) -> None:
        super().__init__(message)
        self.retryable = retryable


def _status(exc: Exception) -> int | None:
    """The HTTP status of a google-api-core (``code``) or kfp-server-api (``status``) error."""
    status = getattr(exc, "code", None) or getattr(exc, "status", None)
    return int(status) if isinstance(status, int) else None


def api_message(exc: Exception) -> str:
    text = getattr(exc, "message", None) or getattr(exc, "reason", None) or str(exc)
    return f"{_status(exc)} {text}" if _status(exc) else str(text)


def is_retryable(exc: Exception) -> bool:
    """Server errors, throttling and failures without a status (connections) may pass on a retry."""
    status = _status(exc)
    return status is None or status >= 500 or status == 429
