"""The tuning pipeline: preprocess → serialize → partition once, then a Vertex AI hyperparameter-tuning job.

``gnnflow compile --tuning --config C [--space S] --trials N [--parallel K] -o tuning.yaml`` writes it.
The data steps are the tasks of :mod:`pipelines.dag` (same components, requests, retries and,
with ``resources.runner: vertex``, the same partition CustomJob). Then task ``trial-specs``
builds the trials' worker pools for the run's resolved config and the partitions' URI
(:func:`pipelines.tune.vertex.trial_specs`), and google-cloud-pipeline-components'
``HyperparameterTuningJobRunOp`` runs the study over the step image: parameters from the search
space (validated against the config at compile time, like ``gnnflow tune``'s), the objective the
validation metric that train selects its best epoch by, maximised. A trial that fails does not
fail the job unless every trial does (``max_failed_trial_count`` = the trial count).

The pipeline takes gnnflow's four run parameters, so ``gnnflow submit --package tuning.yaml``
and ``gnnflow schedule`` send it like the main pipeline; ``infer_mode`` is not used by it.
"""

import json
from collections.abc import Callable
from dataclasses import dataclass

from kfp import dsl
from kfp.dsl import Dataset, Input

from components.config import GnnflowConfig, StepName
from components.config.resources import MULTI_WORKER_STEPS
from components.errors import GnnflowError
from components.partition.component import build_component as partition_component
from components.preprocess.component import build_component as preprocess_component
from components.serialize.component import build_component as serialize_component
from pipelines.dag import DEFAULT_IMAGE, RETRIED_STEPS, RETRY, apply_requests, write_package
from pipelines.tune import vertex
from pipelines.tune.space import SearchSpace
from pipelines.tune.study import objective_metric
from pipelines.vertex_job import custom_job_component

PIPELINE_NAME = "gnnflow-tuning"
TUNING_OUTPUT = f"{dsl.PIPELINE_ROOT_PLACEHOLDER}/{dsl.PIPELINE_JOB_ID_PLACEHOLDER}/tuning"  # trials' AIP_MODEL_DIR below it


@dataclass(frozen=True)
class TuningOptions:
    """The study, fixed at compile time."""

    trials: int
    parallel: int = 1


def trial_specs(config: str, overrides: str, partitions: Input[Dataset], template: str, metric: str) -> list:
    """The trials' worker pools: the run's resolved config, the partitions' URI and the compiled machines."""
    from components.runtime.pipeline_task import artifact_uri
    from pipelines.tune.vertex import trial_specs as build

    return build(config, overrides, str(artifact_uri(partitions)), template, metric)


def build_tuning_pipeline(
    config: GnnflowConfig, space: SearchSpace, options: TuningOptions, image: str = DEFAULT_IMAGE
) -> Callable[..., None]:
    """The tuning pipeline for ``config``'s task and resources, searching ``space``."""
    if options.trials < 1 or not 1 <= options.parallel <= options.trials:
        raise GnnflowError(f"--trials {options.trials} / --parallel {options.parallel}: need 1 <= parallel <= trials")
    resources = config.resources
    if "/" not in image:  # trials pull the image themselves: a placeholder would fail in every trial
        raise GnnflowError(
            f"the tuning pipeline's trials pull the image {image!r} on Vertex AI: compile with --image REGISTRY/PATH/gnnflow:TAG"
        )
    metric = objective_metric(config)
    template = json.dumps(vertex.pool_template(resources, image), sort_keys=True)
    parameters, metrics = vertex.parameter_specs(space), vertex.metric_specs(metric)
    on_vertex = resources.runner == "vertex"
    replicas = resources.replica_count if on_vertex else 0
    preprocess_op, serialize_op, partition_op = preprocess_component(image), serialize_component(image), partition_component(image)
    if on_vertex:
        partition_op = custom_job_component(partition_op, "partition", resources)
    specs_op = dsl.component(trial_specs, base_image=image, install_kfp_package=False)
    from google_cloud_pipeline_components.v1.hyperparameter_tuning_job import HyperparameterTuningJobRunOp

    def configure(task: dsl.PipelineTask, step: StepName) -> dsl.PipelineTask:
        if not (on_vertex and step in MULTI_WORKER_STEPS):
            apply_requests(task, resources.requests_for(step))
        if step in RETRIED_STEPS:
            task.set_retry(**RETRY)
        return task

    @dsl.pipeline(name=PIPELINE_NAME, description="gnnflow: the data steps once, then a Vertex AI hyperparameter-tuning job of train.")
    def gnnflow_tuning(config: str, overrides: str = "{}", data_version: str = "", infer_mode: str = "sampled") -> None:
        settings = {"config": config, "overrides": overrides}
        pre = configure(preprocess_op(**settings, data_version=data_version, image=image), "preprocess")
        ser = configure(serialize_op(**settings, image=image, preprocessed=pre.outputs["preprocessed"]), "serialize")
        part = configure(partition_op(**settings, replicas=replicas, tfrecords=ser.outputs["tfrecords"]), "partition")
        specs = specs_op(**settings, partitions=part.outputs["partitions"], template=template, metric=metric).set_display_name(
            "trial-specs"
        )
        HyperparameterTuningJobRunOp(
            display_name="gnnflow-tuning",
            base_output_directory=TUNING_OUTPUT,
            worker_pool_specs=specs.output,
            study_spec_metrics=metrics,
            study_spec_parameters=parameters,
            max_trial_count=options.trials,
            parallel_trial_count=options.parallel,
            max_failed_trial_count=options.trials,
            location="{{$.pipeline_google_cloud_location}}",
            service_account=resources.custom_job.service_account or "",
            network=resources.custom_job.network or "",
        ).set_display_name("tuning-job")

    return gnnflow_tuning


def compile_tuning_pipeline(
    package_path: str, config: GnnflowConfig, space: SearchSpace, options: TuningOptions, image: str = DEFAULT_IMAGE
) -> None:
    """Writes the tuning pipeline's spec (KFP IR YAML) to ``package_path``, a local path or ``gs://`` URI."""
    write_package(build_tuning_pipeline(config, space, options, image), package_path)
