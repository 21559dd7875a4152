"""The KFP v2 pipeline: preprocess → serialize → partition → train → infer → report (→ export, when
compiled with ``export``: a config whose ``output.bigquery`` or ``output.vector_search`` is set).

Every edge is a typed artifact (Dataset, Model, Metrics, HTML) whose URI KFP chooses under
the pipeline root (``gs://`` on Vertex AI); no step finds another's output by a naming
convention. What is decided when:

- at compile time (``build_pipeline`` / ``compile_pipeline``), from a config's ``resources``
  section: the image of every task, each task's CPU / memory / accelerator requests (KFP
  writes requests into the spec, so they cannot follow a run-time parameter), and where the
  multi-worker steps run (``runner``): inside their own task, or (vertex) as a Vertex AI
  CustomJob whose replica count, machine, accelerators, disk, service account, network and
  timeout (``world_size``, ``processes_per_replica``, ``custom_job``) are part of the spec
  (``pipelines/vertex_job.py``);
- at run time (pipeline parameters): the config itself (YAML text or a URI) and JSON
  overrides, which each task resolves; ``data_version`` (a fingerprint of the input tables);
  the inference mode. A run whose config asks for another layout of the multi-worker steps
  than the one compiled is refused by those steps, naming both.

Caching: KFP keys a task on its component and its inputs. Every task takes the config and
overrides, so any change to them runs the whole pipeline again, while resubmitting identical
parameters reuses every output; ``data_version`` is an input of preprocess, so new data (at
the same URIs) re-runs it and, through its new output, everything after it. A config given
as a URI keys the cache on the URI only: pass the YAML text (``gnnflow submit`` does) or
disable caching when the file changes in place.

Retries: the single-process, storage-bound steps (preprocess, serialize, report) retry twice
with backoff, since their failures are mostly transient (a storage or network hiccup) and a
re-run over the same output replaces any half-written generation cleanly. The multi-worker
steps do not: their failures are mostly deterministic (a bad config, running out of memory),
a KFP retry would provision all N replicas again, and on Vertex AI the CustomJob already
restarts its replicas together after a replica restart (train resuming from its checkpoint).
With runner vertex, their task requests do not apply (the task only launches the job).

Shared memory: with runner local, partition, train and infer get an in-memory emptyDir of
``resources.shm_size`` at ``/dev/shm`` (kfp-kubernetes; a pod's own is 64 MiB). With runner
vertex their replicas are CustomJob containers, whose ``/dev/shm`` Vertex AI decides.
"""

import os
import tempfile
from collections.abc import Callable
from typing import NamedTuple, TypeVar

import yaml
from kfp import compiler, dsl, kubernetes
from kfp.dsl import HTML, Artifact, Dataset, Metrics, Model
from pydantic import BaseModel, ValidationError

from components import storage
from components.config import OutputSpec, ResourcesSpec, StepName, TaskRequests
from components.config.resources import MULTI_WORKER_STEPS
from components.errors import GnnflowError
from components.export.component import build_component as export_component
from components.infer.component import build_component as infer_component
from components.partition.component import build_component as partition_component
from components.preprocess.component import build_component as preprocess_component
from components.report.component import build_component as report_component
from components.runtime.shm_budget import SHM_PATH
from components.serialize.component import build_component as serialize_component
from components.train.component import build_component as train_component
from pipelines.vertex_job import TENSORBOARD_BASE_OUTPUT, custom_job_component

PIPELINE_NAME = "gnnflow"
DEFAULT_IMAGE = "gnnflow:latest"  # a placeholder: give --image REGISTRY/PATH/gnnflow:TAG for a cluster
RETRIED_STEPS: tuple[StepName, ...] = ("preprocess", "serialize", "report", "export")
SHM_VOLUME = "dshm"  # the in-memory volume at /dev/shm of partition, train and infer
RETRY = {"num_retries": 2, "backoff_duration": "30s", "backoff_factor": 2.0, "backoff_max_duration": "600s"}


class PipelineOutputs(NamedTuple):
    """What a run produces, by name; ``kfp.local`` returns these, Vertex AI lists them on the run."""

    preprocessed: Dataset
    tfrecords: Dataset
    partitions: Dataset
    model: Model
    train_metrics: Metrics
    embeddings: Dataset
    infer_metrics: Metrics
    report: Artifact
    metrics: Metrics
    report_html: HTML


def apply_requests(task: dsl.PipelineTask, requests: TaskRequests) -> None:
    """Sets a task's CPU, memory and accelerator as request and limit (Vertex AI sizes machines from limits)."""
    if requests.cpu is not None:
        task.set_cpu_request(requests.cpu).set_cpu_limit(requests.cpu)
    if requests.memory is not None:
        task.set_memory_request(requests.memory).set_memory_limit(requests.memory)
    if requests.accelerator_type is not None:
        task.set_accelerator_type(requests.accelerator_type).set_accelerator_limit(requests.accelerator_count or 1)


def mount_shared_memory(task: dsl.PipelineTask, size: str) -> None:
    """Mounts an in-memory emptyDir of ``size`` (``resources.shm_size``) at the task's ``/dev/shm``
    (KFP on Kubernetes): the multi-worker steps place feature tables, adjacency and loading
    buffers there (components/runtime/shm_budget.py), and its pages count against the pod's memory."""
    kubernetes.empty_dir_mount(task, volume_name=SHM_VOLUME, mount_path=SHM_PATH, medium="Memory", size_limit=size)


def build_pipeline(
    image: str = DEFAULT_IMAGE, resources: ResourcesSpec | None = None, export: bool = False
) -> Callable[..., PipelineOutputs]:
    """The pipeline with every task in ``image`` and the task requests of ``resources`` (default: none);
    ``export``: with the export task after infer (its output is the task's, not the pipeline's)."""
    if not image.strip():
        raise GnnflowError("the pipeline image must not be empty")
    resources = resources or ResourcesSpec()
    preprocess_op, serialize_op = preprocess_component(image), serialize_component(image)
    partition_op, train_op = partition_component(image), train_component(image)
    infer_op, report_op = infer_component(image), report_component(image)
    on_vertex = resources.runner == "vertex"
    replicas = resources.replica_count if on_vertex else 0  # each multi-worker task checks its run's config against it
    job_inputs: dict[str, dict[str, str]] = {"partition": {}, "train": {}, "infer": {}}
    if on_vertex:
        if "/" not in image:  # replicas pull the image themselves; a task of the placeholder would fail hours in
            raise GnnflowError(
                f"resources.runner is vertex, but the image {image!r} names no registry that Vertex AI could "
                "pull from: compile with --image REGISTRY/PATH/gnnflow:TAG"
            )
        partition_op = custom_job_component(partition_op, "partition", resources)
        train_op = custom_job_component(train_op, "train", resources)
        infer_op = custom_job_component(infer_op, "infer", resources)
        if resources.custom_job.tensorboard:
            job_inputs["train"]["base_output_directory"] = TENSORBOARD_BASE_OUTPUT

    def configure(task: dsl.PipelineTask, step: StepName) -> dsl.PipelineTask:
        if not (on_vertex and step in MULTI_WORKER_STEPS):  # there the replicas' machines come from custom_job
            apply_requests(task, resources.requests_for(step))
            if step in MULTI_WORKER_STEPS:  # its workers run in this task's pod, whose own /dev/shm is 64 MiB
                mount_shared_memory(task, resources.shm_size)
        if step in RETRIED_STEPS:
            task.set_retry(**RETRY)
        return task

    @dsl.pipeline(
        name=PIPELINE_NAME,
        description="gnnflow: preprocess, serialize, partition, distributed GraphSAGE training (GLT), inference and report.",
    )
    def gnnflow(config: str, overrides: str = "{}", data_version: str = "", infer_mode: str = "sampled") -> PipelineOutputs:
        """``config``: YAML text or a URI of a YAML file; ``overrides``: a JSON object of dotted keys;
        ``data_version``: a fingerprint of the input tables (part of preprocess's cache key);
        ``infer_mode``: sampled or exact."""
        settings = {"config": config, "overrides": overrides}
        pre = configure(preprocess_op(**settings, data_version=data_version, image=image), "preprocess")
        ser = configure(serialize_op(**settings, image=image, preprocessed=pre.outputs["preprocessed"]), "serialize")
        part = configure(
            partition_op(**settings, replicas=replicas, tfrecords=ser.outputs["tfrecords"], **job_inputs["partition"]), "partition"
        )
        trained = configure(train_op(**settings, replicas=replicas, partitions=part.outputs["partitions"], **job_inputs["train"]), "train")
        inferred = configure(
            infer_op(
                **settings,
                replicas=replicas,
                mode=infer_mode,
                partitions=part.outputs["partitions"],
                model=trained.outputs["model"],
                **job_inputs["infer"],
            ),
            "infer",
        )
        reported = configure(report_op(**settings, model=trained.outputs["model"], embeddings=inferred.outputs["embeddings"]), "report")
        if export:
            configure(export_component(image)(**settings, embeddings=inferred.outputs["embeddings"]), "export")
        return PipelineOutputs(
            preprocessed=pre.outputs["preprocessed"],
            tfrecords=ser.outputs["tfrecords"],
            partitions=part.outputs["partitions"],
            model=trained.outputs["model"],
            train_metrics=trained.outputs["metrics"],
            embeddings=inferred.outputs["embeddings"],
            infer_metrics=inferred.outputs["metrics"],
            report=reported.outputs["report"],
            metrics=reported.outputs["metrics"],
            report_html=reported.outputs["html"],
        )

    return gnnflow


def compile_pipeline(package_path: str, image: str = DEFAULT_IMAGE, resources: ResourcesSpec | None = None, export: bool = False) -> None:
    """Writes the pipeline spec (KFP IR YAML) to ``package_path``, a local path or ``gs://`` URI."""
    write_package(build_pipeline(image, resources, export), package_path)


def write_package(pipeline: Callable[..., object], package_path: str) -> None:
    """Compiles ``pipeline`` into its spec (KFP IR YAML) at ``package_path``, a local path or ``gs://`` URI
    (compiled into a local file, then uploaded)."""
    target = storage.parse_uri(package_path)
    if isinstance(target, storage.LocalUri):
        os.makedirs(os.path.dirname(target.path) or ".", exist_ok=True)
        compiler.Compiler().compile(pipeline, target.path)
        return
    with tempfile.TemporaryDirectory() as folder:
        local = os.path.join(folder, "pipeline.yaml")
        compiler.Compiler().compile(pipeline, local)
        storage.upload_file(local, target)


def load_exports(uri: str) -> bool:
    """Whether a config file's ``output`` section asks for the export step (compile time, like resources)."""
    return _config_section(uri, "output", OutputSpec).exports


def load_resources(uri: str) -> ResourcesSpec:
    """The ``resources`` section of a config file (a whole config, or one holding only that section)."""
    return _config_section(uri, "resources", ResourcesSpec)


_Section = TypeVar("_Section", bound=BaseModel)


def _config_section(uri: str, name: str, model: type[_Section]) -> _Section:
    """One section of a config file, validated alone (compile time reads no other section); errors
    name each key under ``name``."""
    source = storage.parse_uri(uri)
    try:
        raw = yaml.safe_load(storage.read_text(source))
    except yaml.YAMLError as exc:
        raise GnnflowError(f"config {source} is not valid YAML: {exc}") from exc
    if raw is None:
        raw = {}
    if not isinstance(raw, dict):
        raise GnnflowError(f"config {source} must be a YAML mapping, got {type(raw).__name__}")
    try:
        return model.model_validate(raw.get(name) or {})
    except ValidationError as exc:
        lines = [f"invalid config {source}:"]
        for error in exc.errors():
            key = ".".join(str(part) for part in (name, *error["loc"]))
            lines.append(f"  key '{key}': {'unknown key' if error['type'] == 'extra_forbidden' else error['msg']}")
        raise GnnflowError("\n".join(lines)) from None
