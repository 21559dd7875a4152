"""``gnnflow submit``: one run of the compiled pipeline on Vertex AI Pipelines or a KFP endpoint.

Everything a run gets is checked here, before any request is sent: the config is read and
validated with its overrides (errors name the key), the input tables are listed to fingerprint
them, and on Vertex AI the pipeline root's bucket must exist. The run's parameters are then

- ``config``: the validated config as canonical YAML text, so KFP's cache keys on its content
  (``RunRequest.config_as="uri"`` passes the config's URI instead; schedules use that),
- ``overrides``: the dotted-key overrides as a JSON object (visible in the console),
- ``data_version``: a fingerprint of every input table file (size and generation / CRC32C on
  GCS), so a cached step reruns when new data lands at the same URIs,
- ``infer_mode``: ``sampled`` or ``exact``.

``pipelines.schedule`` and ``pipelines.trigger`` reuse the targets, the parameters and the
command-line arguments defined here.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import logging
import os
import re
import secrets
import sys
import tempfile
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import yaml

from components import storage
from components.config import GnnflowConfig, load_config, parse_overrides, resolve_config
from components.errors import GnnflowError
from components.storage import gcs as gcs_backend
from components.tables import tables_fingerprint

log = logging.getLogger("gnnflow.submit")

PIPELINE_PARAMETERS = ("config", "overrides", "data_version", "infer_mode")
_JOB_ID = re.compile(r"^[a-z][-a-z0-9]{0,127}$")


# ---------------------------------------------------------------------------------- options
@dataclass(frozen=True)
class VertexTarget:
    """A Vertex AI Pipelines project and region (endpoint: ``{region}-aiplatform.googleapis.com``).

    An ``http://`` endpoint (an emulator, a recorder) gets anonymous credentials: gnnflow never
    sends credentials over plain HTTP. ``check_pipeline_root``: the root's bucket must exist.
    """

    project: str
    region: str
    pipeline_root: str | None = None
    service_account: str | None = None
    api_endpoint: str | None = None
    check_pipeline_root: bool = True

    def __post_init__(self) -> None:
        missing = [flag for flag, value in (("--project", self.project), ("--region", self.region)) if not value]
        if missing:
            raise GnnflowError(f"Vertex AI needs {' and '.join(missing)} (or use --kfp-host for a KFP endpoint)")
        if self.pipeline_root is not None and not self.pipeline_root.startswith("gs://"):
            raise GnnflowError(f"--pipeline-root must be a gs:// URI on Vertex AI, got {self.pipeline_root!r}")

    @property
    def endpoint(self) -> str:
        return self.api_endpoint or f"{self.region}-aiplatform.googleapis.com"

    @property
    def plain_http(self) -> bool:
        return self.endpoint.startswith("http://")


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
    infer_mode: Literal["sampled", "exact"] = "sampled"
    enable_caching: bool | None = None
    package: str | None = None
    image: str | None = None
    job_id: str | None = None
    config_as: Literal["text", "uri"] = "text"


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
    if request.infer_mode == "exact":
        from components.infer.layerwise import check_exact_config

        check_exact_config(resolved)  # refused here, not by the infer task after hours of training
    for section, tables in (("graph.nodes", resolved.graph.nodes), ("graph.edges", resolved.graph.edges)):
        for i, table in enumerate(tables):
            if not table.uri.startswith("gs://"):
                raise GnnflowError(f"config {request.config}: {section}[{i}].uri {table.uri!r} is not a gs:// URI; "
                                   "a pipeline run on Vertex AI or KFP can only read tables on GCS")
    config_parameter = str(storage.parse_uri(request.config)) if request.config_as == "uri" else text
    if request.config_as == "uri" and not config_parameter.startswith("gs://"):
        raise GnnflowError(f"config {request.config}: a run that reads its config by URI needs a gs:// URI")
    parameters = {"config": config_parameter, "overrides": overrides, "data_version": data_version(resolved),
                  "infer_mode": request.infer_mode}
    stamp = datetime.datetime.now(datetime.timezone.utc).strftime("%Y%m%d-%H%M%S")
    return PreparedRun(parameters, request.display_name or f"gnnflow-{stamp}", resolved)


def data_version(config: GnnflowConfig) -> str:
    """A fingerprint of every file the config's tables expand to (name, size, generation, CRC32C)."""
    return "sha256:" + tables_fingerprint(config.graph)


@contextlib.contextmanager
def pipeline_package(request: RunRequest, config: GnnflowConfig) -> Iterator[str]:
    """``request.package`` after checking its parameters, or the pipeline compiled now for
    ``request.image`` with the task requests of ``config.resources`` (fixed at compile time)."""
    if request.package:
        check_package(request.package)
        yield request.package
        return
    from pipelines.dag import DEFAULT_IMAGE, compile_pipeline  # kfp's compiler loads only when needed

    image = request.image or DEFAULT_IMAGE
    with tempfile.TemporaryDirectory(prefix="gnnflow-package-") as folder:
        path = os.path.join(folder, "gnnflow.yaml")
        compile_pipeline(path, image, config.resources)
        log.info("compiled the pipeline for image %s", image)
        yield path


def check_package(path: str) -> None:
    """A package must be a KFP pipeline spec taking gnnflow's four parameters."""
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


def check_pipeline_root(root: str) -> None:
    """The pipeline root's bucket must exist and be readable, named in the error otherwise."""
    uri = storage.parse_uri(root)
    assert isinstance(uri, storage.GcsUri)
    try:
        exists = gcs_backend.client().bucket(uri.bucket).exists(retry=gcs_backend.RETRY)
    except Exception as exc:  # noqa: BLE001
        raise GnnflowError(f"cannot check the pipeline root bucket gs://{uri.bucket}: {exc} (--no-root-check skips this)") from exc
    if not exists:
        raise GnnflowError(
            f"pipeline root {root}: bucket gs://{uri.bucket} does not exist; create it in the pipeline's region "
            f"(gcloud storage buckets create gs://{uri.bucket} --location=REGION) or pass another --pipeline-root"
        )


# ---------------------------------------------------------------------------------- clients
def vertex_credentials(target: VertexTarget) -> Any:
    """Anonymous credentials for a plain-HTTP endpoint; None (application default) otherwise."""
    if target.plain_http:
        from google.auth.credentials import AnonymousCredentials

        return AnonymousCredentials()
    return None


def vertex_pipeline_job(target: VertexTarget, request: RunRequest, prepared: PreparedRun, package: str, *, job_id: str | None = None) -> Any:
    """The SDK's ``PipelineJob`` (spec, runtime config, labels, caching), validated."""
    from google.cloud import aiplatform

    try:
        return aiplatform.PipelineJob(
            display_name=prepared.display_name, template_path=package, job_id=job_id,
            pipeline_root=target.pipeline_root, parameter_values=prepared.parameters,
            enable_caching=request.enable_caching, labels=dict(request.labels) or None,
            credentials=vertex_credentials(target), project=target.project, location=target.region,
        )
    except ValueError as exc:
        raise GnnflowError(f"invalid Vertex AI pipeline job: {exc}") from exc


def kfp_client(target: KfpTarget) -> Any:
    import warnings

    import kfp

    try:
        with warnings.catch_warnings():  # "only works with KFP v2.0.0-beta.2 and later": noise on every command
            warnings.simplefilter("ignore", FutureWarning)
            return kfp.Client(host=target.host, namespace=target.namespace or "kubeflow", existing_token=target.token)
    except Exception as exc:  # noqa: BLE001 - unreachable or refusing endpoint
        raise SubmissionError(f"KFP endpoint {target.host} did not answer: {api_message(exc)}", retryable=True) from exc


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


# ------------------------------------------------------------------------------ submission
def submit(request: RunRequest, target: Target, wait: WaitOptions | None = None) -> SubmittedRun:
    """Validates ``request``, submits one run to ``target`` and, with ``wait``, follows it to its end."""
    if isinstance(target, KfpTarget) and request.labels:
        raise GnnflowError("labels are a Vertex AI feature; KFP runs have none (drop --label)")
    if isinstance(target, VertexTarget) and not target.pipeline_root:
        raise GnnflowError("Vertex AI needs --pipeline-root (a gs:// folder for the run's artifacts)")
    prepared = prepare_run(request)
    with pipeline_package(request, prepared.config) as package:
        if isinstance(target, VertexTarget):
            if target.check_pipeline_root:
                check_pipeline_root(target.pipeline_root or "")
            run = _submit_vertex(target, request, prepared, package)
        else:
            run = _submit_kfp(target, request, prepared, package)
    log.info("submitted %s; parameters data_version=%s overrides=%s", run.name, run.parameters["data_version"], run.parameters["overrides"])
    log.info("follow it at %s", run.url)
    return wait_for(run, target, wait) if wait else run


def _submit_vertex(target: VertexTarget, request: RunRequest, prepared: PreparedRun, package: str) -> SubmittedRun:
    from google.api_core import exceptions as api_exceptions
    from google.cloud.aiplatform_v1 import PipelineJob

    stamp = datetime.datetime.now(datetime.timezone.utc).strftime("%Y%m%d-%H%M%S")
    job_id = request.job_id or f"gnnflow-{stamp}-{secrets.token_hex(3)}"
    if not _JOB_ID.match(job_id):
        raise GnnflowError(f"job id {job_id!r} must be lower-case letters, digits and dashes, starting with a letter")
    # The SDK's PipelineJob builds and checks the spec and runtime config; the request is sent
    # by its generated client, since PipelineJob.submit() would also create the root bucket,
    # rewrite its IAM policy and only log when that fails (check_pipeline_root replaces it).
    built = vertex_pipeline_job(target, request, prepared, package, job_id=job_id)
    job = PipelineJob(display_name=prepared.display_name, pipeline_spec=built.pipeline_spec, runtime_config=built.runtime_config,
                      labels=dict(request.labels), service_account=target.service_account or "")
    parent = f"projects/{target.project}/locations/{target.region}"
    service = _vertex_pipeline_service(target)
    try:
        name = service.create_pipeline_job(parent=parent, pipeline_job=job, pipeline_job_id=job_id).name
    except api_exceptions.Conflict as exc:  # 409: e.g. a redelivered trigger message whose run exists already
        name = _existing_job(service, f"{parent}/pipelineJobs/{job_id}", exc)
    except Exception as exc:  # noqa: BLE001
        raise SubmissionError(f"Vertex AI refused pipeline job {job_id}: {api_message(exc)}", is_retryable(exc)) from exc
    url = f"https://console.cloud.google.com/vertex-ai/locations/{target.region}/pipelines/runs/{job_id}?project={target.project}"
    return SubmittedRun("vertex", name, prepared.display_name, prepared.parameters, url)


def _existing_job(service: Any, name: str, conflict: Exception) -> str:
    """``name`` when that job exists (it was submitted before), else the conflict as an error."""
    try:
        service.get_pipeline_job(name=name)
    except Exception:  # noqa: BLE001 - not there after all: report the original refusal
        raise SubmissionError(f"Vertex AI refused pipeline job {name}: {api_message(conflict)}", is_retryable(conflict)) from conflict
    log.info("pipeline job %s exists already; not submitting it again", name)
    return name


def _vertex_pipeline_service(target: VertexTarget) -> Any:
    """The SDK's generated Vertex AI pipeline client, over REST."""
    from google.cloud.aiplatform_v1.services.pipeline_service import PipelineServiceClient

    return PipelineServiceClient(credentials=vertex_credentials(target), transport="rest",
                                 client_options={"api_endpoint": target.endpoint})


def _kfp_run_named(client: Any, target: KfpTarget, run_name: str) -> Any | None:
    """The run of ``target``'s experiment called ``run_name``, if one exists."""
    try:
        experiment = client.get_experiment(experiment_name=target.experiment, namespace=target.namespace)
    except ValueError:  # no such experiment yet: no run either
        return None
    predicate = {"key": "display_name", "operation": "EQUALS", "string_value": run_name}
    found = client.list_runs(experiment_id=experiment.experiment_id, namespace=target.namespace, page_size=1,
                             filter=json.dumps({"predicates": [predicate]}))
    return (found.runs or [None])[0]


def _submit_kfp(target: KfpTarget, request: RunRequest, prepared: PreparedRun, package: str) -> SubmittedRun:
    client = kfp_client(target)
    # KFP has no caller-chosen run ids: with a job id the run is named after it, and a run of
    # that name in the experiment is the one already submitted (a redelivered trigger message).
    run_name = f"{prepared.display_name}-{request.job_id}" if request.job_id else prepared.display_name
    try:
        existing = _kfp_run_named(client, target, run_name) if request.job_id else None
        if existing is not None:
            log.info("KFP run %s (%s) exists already: not submitted again", run_name, existing.run_id)
            url = f"{target.host.rstrip('/')}/#/runs/details/{existing.run_id}"
            return SubmittedRun("kfp", existing.run_id, run_name, prepared.parameters, url)
        result = client.create_run_from_pipeline_package(
            package, arguments=prepared.parameters, run_name=run_name, experiment_name=target.experiment,
            namespace=target.namespace, pipeline_root=target.pipeline_root, enable_caching=request.enable_caching,
            service_account=target.service_account,
        )
    except Exception as exc:  # noqa: BLE001
        raise SubmissionError(f"KFP endpoint {target.host} refused run {prepared.display_name!r}: {api_message(exc)}", is_retryable(exc)) from exc
    url = f"{target.host.rstrip('/')}/#/runs/details/{result.run_id}"
    return SubmittedRun("kfp", result.run_id, run_name, prepared.parameters, url)


_VERTEX_DONE = {"PIPELINE_STATE_SUCCEEDED", "PIPELINE_STATE_FAILED", "PIPELINE_STATE_CANCELLED", "PIPELINE_STATE_PAUSED"}
_KFP_DONE = {"SUCCEEDED", "SKIPPED", "FAILED", "CANCELED", "PAUSED"}
_POLL_RETRIES = 5  # transient failures in a row that --wait rides out


def wait_for(run: SubmittedRun, target: Target, options: WaitOptions) -> SubmittedRun:
    """Polls until ``run`` ends; an error naming the run unless it succeeded."""
    if isinstance(target, VertexTarget):
        client = _vertex_pipeline_service(target)
        done, succeeded = _VERTEX_DONE, "PIPELINE_STATE_SUCCEEDED"

        def poll() -> tuple[str, str]:
            job = client.get_pipeline_job(name=run.name)
            return job.state.name, job.error.message
    else:
        api = kfp_client(target)
        done, succeeded = _KFP_DONE, "SUCCEEDED"

        def poll() -> tuple[str, str]:
            got = api.get_run(run.name)
            return str(got.state), (got.error.message if got.error else "") or ""

    start, last, failures = time.monotonic(), None, 0
    while True:
        try:
            state, error = poll()
            failures = 0
        except Exception as exc:  # noqa: BLE001
            failures += 1
            if not is_retryable(exc) or failures > _POLL_RETRIES:
                raise SubmissionError(f"cannot get the state of {run.name}: {api_message(exc)}", is_retryable(exc)) from exc
            log.warning("getting the state of %s failed (%s); trying again", run.name, api_message(exc))
            time.sleep(options.poll_seconds)
            continue
        if state != last:
            log.info("%s: %s", run.name, state)
            last = state
        if state in done:
            break
        if options.timeout_seconds is not None and time.monotonic() - start > options.timeout_seconds:
            raise GnnflowError(f"{run.name} still {state} after {options.timeout_seconds:g} s (it keeps running)")
        time.sleep(options.poll_seconds)
    if state != succeeded:
        raise GnnflowError(f"pipeline run {run.name} ended {state}" + (f": {error}" if error else ""))
    return SubmittedRun(run.target, run.name, run.display_name, run.parameters, run.url, state)


# -------------------------------------------------------------------------------- command line
def add_target_arguments(parser: argparse.ArgumentParser, *, run: bool) -> None:
    """Where runs go: Vertex AI (--project, --region, ...) or a KFP endpoint (--kfp-host)."""
    vertex = parser.add_argument_group("Vertex AI Pipelines")
    vertex.add_argument("--project", help="Google Cloud project")
    vertex.add_argument("--region", help="Vertex AI region, e.g. us-central1")
    vertex.add_argument("--api-endpoint", help="Vertex AI API endpoint (default: REGION-aiplatform.googleapis.com)")
    kfp = parser.add_argument_group("Kubeflow Pipelines")
    kfp.add_argument("--kfp-host", help="KFP API endpoint, e.g. http://localhost:8080 (token: $GNNFLOW_KFP_TOKEN)")
    kfp.add_argument("--kfp-namespace", help="namespace of a multi-user KFP deployment")
    kfp.add_argument("--experiment", default="gnnflow", help="KFP experiment (default: gnnflow)")
    if run:
        vertex.add_argument("--pipeline-root", help="gs:// folder for the run's artifacts (KFP: optional)")
        vertex.add_argument("--service-account", help="service account the run uses (KFP: a Kubernetes one)")
        vertex.add_argument("--no-root-check", action="store_true", help="do not check that the pipeline root's bucket exists")


def target_from_args(args: argparse.Namespace) -> Target:
    root, account = getattr(args, "pipeline_root", None), getattr(args, "service_account", None)
    if args.kfp_host:
        return KfpTarget(args.kfp_host, args.experiment, args.kfp_namespace, root, account, os.environ.get("GNNFLOW_KFP_TOKEN"))
    return VertexTarget(args.project or "", args.region or "", root, account, args.api_endpoint,
                        not getattr(args, "no_root_check", False))


def add_run_arguments(parser: argparse.ArgumentParser) -> None:
    """What runs: the config, its overrides, naming and the pipeline package."""
    parser.add_argument("--config", required=True, help="config YAML, local or gs://")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="override one config key (repeatable), e.g. training.epochs=5")
    parser.add_argument("--overrides", help='overrides as a JSON object, e.g. \'{"training.epochs": 5}\'')
    parser.add_argument("--display-name", help="name shown in the console (default: gnnflow-<timestamp>)")
    parser.add_argument("--label", action="append", default=[], metavar="KEY=VALUE", help="Vertex AI label (repeatable)")
    parser.add_argument("--infer-mode", choices=["sampled", "exact"], default="sampled")
    caching = parser.add_mutually_exclusive_group()
    caching.add_argument("--cache", dest="enable_caching", action="store_true", default=None, help="force step caching on")
    caching.add_argument("--no-cache", dest="enable_caching", action="store_false", help="rerun every step")
    package = parser.add_mutually_exclusive_group()
    package.add_argument("--package", help="a compiled pipeline YAML (default: compile now)")
    package.add_argument("--image", help="step image to compile the pipeline for")


def _pairs(items: Sequence[str], flag: str) -> dict[str, str]:
    bad = [item for item in items if not item.partition("=")[0] or "=" not in item]
    if bad:
        raise GnnflowError(f"{flag} {bad[0]!r} must look like KEY=VALUE")
    return dict(item.split("=", 1) for item in items)


def run_request_from_args(args: argparse.Namespace, **extra: Any) -> RunRequest:
    overrides: dict[str, Any] = parse_overrides(args.overrides, "--overrides")
    for key, value in _pairs(args.set, "--set").items():
        overrides[key.strip()] = yaml.safe_load(value)  # as `gnnflow run --set`: 5 → int, true → bool
    return RunRequest(
        config=args.config, overrides=overrides, display_name=args.display_name, labels=_pairs(args.label, "--label"),
        infer_mode=args.infer_mode, enable_caching=args.enable_caching, package=args.package, image=args.image, **extra,
    )


def _main(args: argparse.Namespace) -> None:
    wait = WaitOptions(args.poll_seconds, args.timeout) if args.wait else None
    run = submit(run_request_from_args(args, job_id=args.job_id), target_from_args(args), wait)
    print(run.name if run.state is None else f"{run.name} {run.state}", file=sys.stdout)


def register(commands: argparse._SubParsersAction) -> None:
    """Adds ``gnnflow submit``."""
    parser = commands.add_parser("submit", help="submit one run to Vertex AI Pipelines or a KFP endpoint")
    add_run_arguments(parser)
    add_target_arguments(parser, run=True)
    parser.add_argument("--job-id", help="Vertex AI job id (default: gnnflow-<timestamp>-<random>)")
    parser.add_argument("--wait", action="store_true", help="wait for the run to end; exit non-zero unless it succeeded")
    parser.add_argument("--poll-seconds", type=float, default=30.0, help="--wait: seconds between state checks (default 30)")
    parser.add_argument("--timeout", type=float, help="--wait: give up after this many seconds")
    parser.set_defaults(handler=_main)
