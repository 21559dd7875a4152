"""The pieces both pipelines (training, :mod:`pipelines.dag`; inference-only,
:mod:`pipelines.dag_inference`) are built from: every step's component in one image, how each
task is set up, and what each pipeline returns."""

from typing import NamedTuple

from kfp import dsl, kubernetes
from kfp.dsl import HTML, Artifact, Dataset, Metrics, Model

from components.config import ResourcesSpec, StepName, TaskRequests
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


class GatedPipelineOutputs(NamedTuple):
    """A run whose infer, report and export wait for the gate (``registry.downstream: blessed``):
    outputs made inside the condition are not the pipeline's (KFP returns only what every run
    makes); they are the tasks' own, listed on the run."""

    preprocessed: Dataset
    tfrecords: Dataset
    partitions: Dataset
    model: Model
    train_metrics: Metrics
    registration: Artifact  # register's decision.json: the version, whether it passed the gate, and why


class InferenceOutputs(NamedTuple):
    """An inference-only run's outputs (``--from-model``): its model is the resolved one."""

    preprocessed: Dataset
    tfrecords: Dataset
    partitions: Dataset
    model: Model
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


class StepTasks:
    """Every step's component in one image, and how each task is set up (requests, /dev/shm,
    retries; partition, train and infer as CustomJobs with runner vertex)."""

    def __init__(self, image: str, resources: ResourcesSpec) -> None:
        if not image.strip():
            raise GnnflowError("the pipeline image must not be empty")
        self.image, self.resources = image, resources
        self.preprocess, self.serialize = preprocess_component(image), serialize_component(image)
        self.partition, self.train = partition_component(image), train_component(image)
        self.infer, self.report = infer_component(image), report_component(image)
        self.on_vertex = resources.runner == "vertex"
        self.replicas = resources.replica_count if self.on_vertex else 0  # each multi-worker task checks its run's config against it
        self.job_inputs: dict[str, dict[str, str]] = {"partition": {}, "train": {}, "infer": {}}
        if self.on_vertex:
            if "/" not in image:  # replicas pull the image themselves; a task of the placeholder would fail hours in
                raise GnnflowError(
                    f"resources.runner is vertex, but the image {image!r} names no registry that Vertex AI could "
                    "pull from: compile with --image REGISTRY/PATH/gnnflow:TAG"
                )
            self.partition = custom_job_component(self.partition, "partition", resources)
            self.train = custom_job_component(self.train, "train", resources)
            self.infer = custom_job_component(self.infer, "infer", resources)
            if resources.custom_job.tensorboard:
                self.job_inputs["train"]["base_output_directory"] = TENSORBOARD_BASE_OUTPUT

    def configure(self, task: dsl.PipelineTask, step: StepName) -> dsl.PipelineTask:
        if not (self.on_vertex and step in MULTI_WORKER_STEPS):  # there the replicas' machines come from custom_job
            apply_requests(task, self.resources.requests_for(step))
            if step in MULTI_WORKER_STEPS:  # its workers run in this task's pod, whose own /dev/shm is 64 MiB
                mount_shared_memory(task, self.resources.shm_size)
        if step in RETRIED_STEPS:
            task.set_retry(**RETRY)
        return task

    def data_steps(self, settings: dict[str, str], preprocessed: dsl.PipelineTask) -> tuple[dsl.PipelineTask, dsl.PipelineTask]:
        """serialize and partition after ``preprocessed``."""
        ser = self.configure(self.serialize(**settings, image=self.image, preprocessed=preprocessed.outputs["preprocessed"]), "serialize")
        part = self.partition(**settings, replicas=self.replicas, tfrecords=ser.outputs["tfrecords"], **self.job_inputs["partition"])
        return ser, self.configure(part, "partition")

    def downstream(
        self, settings: dict[str, str], infer_mode: str, partitions: object, model: object, export: bool
    ) -> tuple[dsl.PipelineTask, dsl.PipelineTask]:
        """infer, report (and export) of ``model`` over ``partitions``."""
        inferred = self.configure(
            self.infer(**settings, replicas=self.replicas, mode=infer_mode, partitions=partitions, model=model, **self.job_inputs["infer"]),
            "infer",
        )
        reported = self.configure(self.report(**settings, model=model, embeddings=inferred.outputs["embeddings"]), "report")
        if export:
            self.configure(export_component(self.image)(**settings, embeddings=inferred.outputs["embeddings"]), "export")
        return inferred, reported
