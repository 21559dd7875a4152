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
from kfp import compiler, dsl
from pydantic import BaseModel, ValidationError

from components import storage
from components.config import OutputSpec, RegistrySpec, ResourcesSpec
from components.errors import GnnflowError
from components.register.component import build_component as register_component
from components.registry.vertex import IMAGE_VARIABLE as SERVING_IMAGE_VARIABLE
from pipelines.dag_inference import build_inference_pipeline
from pipelines.dag_steps import (
    DEFAULT_IMAGE,
    PIPELINE_NAME,
    RETRY,
    GatedPipelineOutputs,
    InferenceOutputs,
    PipelineOutputs,
    StepTasks,
)

__all__ = ["DEFAULT_IMAGE", "GatedPipelineOutputs", "InferenceOutputs", "PipelineOutputs", "build_pipeline", "compile_pipeline"]


def build_pipeline(
    image: str = DEFAULT_IMAGE,
    resources: ResourcesSpec | None = None,
    export: bool = False,
    registry: RegistrySpec | None = None,
    from_model: bool = False,
) -> Callable[..., NamedTuple]:
    """The pipeline with every task in ``image`` and the task requests of ``resources`` (default: none).

    ``export``: with the export task after infer (its output is the task's, not the pipeline's);
    ``registry`` (a config's section, with ``uri`` set): a register task after train, and, with
    ``downstream: blessed``, infer, report and export inside ``dsl.If`` on its ``blessed`` output;
    ``from_model``: the inference-only pipeline (see :func:`pipelines.dag_inference.build_inference_pipeline`)."""
    steps = StepTasks(image, resources or ResourcesSpec())
    if from_model:
        return build_inference_pipeline(steps, export)
    registering = registry is not None and registry.uri is not None
    gated = registering and registry is not None and registry.downstream == "blessed"
    register_op = register_component(image) if registering else None
    decorate = dsl.pipeline(
        name=PIPELINE_NAME,
        description="gnnflow: preprocess, serialize, partition, distributed GraphSAGE training (GLT), inference and report.",
    )

    def trained_tasks(config: str, overrides: str, data_version: str) -> dict[str, dsl.PipelineTask]:
        settings = {"config": config, "overrides": overrides}
        pre = steps.configure(steps.preprocess(**settings, data_version=data_version, image=image), "preprocess")
        ser, part = steps.data_steps(settings, pre)
        trained = steps.configure(
            steps.train(**settings, replicas=steps.replicas, partitions=part.outputs["partitions"], **steps.job_inputs["train"]), "train"
        )
        tasks = {"preprocess": pre, "serialize": ser, "partition": part, "train": trained}
        if register_op is not None:
            tasks["register"] = register_op(**settings, data_version=data_version, model=trained.outputs["model"])
            tasks["register"].set_retry(**RETRY)  # storage-bound, and idempotent: a retried registration finds its version
            tasks["register"].set_env_variable(SERVING_IMAGE_VARIABLE, image)  # a Vertex AI Model Registry version's serving container
        return tasks

    if gated:

        @decorate
        def gnnflow_gated(config: str, overrides: str = "{}", data_version: str = "", infer_mode: str = "auto") -> GatedPipelineOutputs:
            """As the ungated pipeline; infer, report and export run only when train's model is blessed."""
            tasks = trained_tasks(config, overrides, data_version)
            settings = {"config": config, "overrides": overrides}
            model, partitions = tasks["train"].outputs["model"], tasks["partition"].outputs["partitions"]
            with dsl.If(tasks["register"].outputs["Output"] == True, name="blessed"):  # noqa: E712 - a KFP condition
                steps.downstream(settings, infer_mode, partitions, model, export)
            return GatedPipelineOutputs(
                preprocessed=tasks["preprocess"].outputs["preprocessed"],
                tfrecords=tasks["serialize"].outputs["tfrecords"],
                partitions=partitions,
                model=model,
                train_metrics=tasks["train"].outputs["metrics"],
                registration=tasks["register"].outputs["registration"],
            )

        return gnnflow_gated

    @decorate
    def gnnflow(config: str, overrides: str = "{}", data_version: str = "", infer_mode: str = "auto") -> PipelineOutputs:
        """``config``: YAML text or a URI of a YAML file; ``overrides``: a JSON object of dotted keys;
        ``data_version``: a fingerprint of the input tables (part of preprocess's cache key);
        ``infer_mode``: sampled, exact, or auto (exact when training.mode is full_graph, else sampled)."""
        tasks = trained_tasks(config, overrides, data_version)
        settings = {"config": config, "overrides": overrides}
        model, partitions = tasks["train"].outputs["model"], tasks["partition"].outputs["partitions"]
        inferred, reported = steps.downstream(settings, infer_mode, partitions, model, export)
        return PipelineOutputs(
            preprocessed=tasks["preprocess"].outputs["preprocessed"],
            tfrecords=tasks["serialize"].outputs["tfrecords"],
            partitions=partitions,
            model=model,
            train_metrics=tasks["train"].outputs["metrics"],
            embeddings=inferred.outputs["embeddings"],
            infer_metrics=inferred.outputs["metrics"],
            report=reported.outputs["report"],
            metrics=reported.outputs["metrics"],
            report_html=reported.outputs["html"],
        )

    return gnnflow


def compile_pipeline(
    package_path: str,
    image: str = DEFAULT_IMAGE,
    resources: ResourcesSpec | None = None,
    export: bool = False,
    registry: RegistrySpec | None = None,
    from_model: bool = False,
) -> None:
    """Writes the pipeline spec (KFP IR YAML) to ``package_path``, a local path or ``gs://`` URI."""
    write_package(build_pipeline(image, resources, export, registry, from_model), package_path)


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


def load_registry(uri: str) -> RegistrySpec:
    """The ``registry`` section of a config file: whether the compiled DAG registers and gates."""
    return _config_section(uri, "registry", RegistrySpec)


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
