"""The tuning pipeline: preprocess → serialize → partition once, then a Vertex AI hyperparameter-tuning
job, then the study published as ``gnnflow tune`` publishes it.

``gnnflow compile --tuning --config C [--space S] --trials N [--parallel K] -o tuning.yaml`` writes it.
The data steps are the tasks of :mod:`pipelines.dag` (same components, requests, retries and,
with ``resources.runner: vertex``, the same partition CustomJob). Then task ``trial-specs``
builds the trials' worker pools for the run's resolved config and the partitions' URI
(:func:`pipelines.tune.vertex.trial_specs`), and task ``tuning-job``
(:mod:`pipelines.tune.tuning_job`) runs the study over the step image: parameters from the search
space (validated against the config at compile time and widened to hold its values, like
``gnnflow tune``'s), the objective the validation metric that train selects its best epoch by,
maximised; each trial a CustomJob scheduled as train's is in the main pipeline
(``resources.strategy``, ``custom_job.restart_job_on_worker_restart``, ``timeout_s``,
``max_wait_s``, ``tensorboard``, service account, network). A trial that fails does not
fail the job unless every trial does (``max_failed_trial_count`` = the trial count). Last, task
``best-config`` reads the job's trials and publishes the study into its ``study`` artifact
(``trials.csv``, ``best_config.yaml``, ``trials.png``, ``tuning.html``, ``study.json``) and the
best trial's config alone as its ``best_config`` artifact (a YAML file ``gnnflow run --config``
takes), with :mod:`pipelines.tune.vertex_study`.

The pipeline takes gnnflow's four run parameters, so ``gnnflow submit --package tuning.yaml``
and ``gnnflow schedule`` send it like the main pipeline; ``infer_mode`` is not used by it.
"""

import argparse
import json
import logging
from collections.abc import Callable
from dataclasses import dataclass

from kfp import dsl
from kfp.dsl import Artifact, Dataset, Input, Output

from components.config import GnnflowConfig, StepName
from components.config.resources import MULTI_WORKER_STEPS
from components.errors import GnnflowError
from components.partition.component import build_component as partition_component
from components.preprocess.component import build_component as preprocess_component
from components.serialize.component import build_component as serialize_component
from pipelines.dag import write_package
from pipelines.dag_steps import DEFAULT_IMAGE, RETRIED_STEPS, RETRY, apply_requests
from pipelines.tune import vertex
from pipelines.tune.space import SearchSpace
from pipelines.tune.study import objective_metric, prepare
from pipelines.tune.tuning_job import hyperparameter_tuning_job, trial_scheduling
from pipelines.tune.vertex_study import space_json
from pipelines.vertex_job import custom_job_component

log = logging.getLogger("gnnflow.compile")

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


def best_config(
    config: str, overrides: str, gcp_resources: str, space: str, metric: str, study: Output[Artifact], best_config: Output[Artifact]
) -> None:
    """Publishes the finished study into ``study`` (as ``gnnflow tune`` does) and the best trial's
    config into ``best_config`` (a YAML file)."""
    from components import storage
    from components.runtime import pipeline_task
    from pipelines.tune.results import BEST_CONFIG
    from pipelines.tune.vertex_study import fetch_trials, publish_study, space_from_json

    with pipeline_task.running("best-config", config, overrides) as resolved:
        name, trials = fetch_trials(gcp_resources)
        output = pipeline_task.artifact_uri(study)
        result = publish_study(resolved, trials, space_from_json(space), metric, output)
        storage.write_bytes(pipeline_task.artifact_uri(best_config), storage.read_bytes(output.join(BEST_CONFIG)))
        study.metadata |= {"job": name, "best_trial": result.best.number, metric: result.best.metric}
        best_config.metadata |= {"best_trial": result.best.number, metric: result.best.metric}


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
    scheduling = trial_scheduling(resources)
    on_vertex = resources.runner == "vertex"
    replicas = resources.replica_count if on_vertex else 0
    preprocess_op, serialize_op, partition_op = preprocess_component(image), serialize_component(image), partition_component(image)
    if on_vertex:
        partition_op = custom_job_component(partition_op, "partition", resources)
    specs_op = dsl.component(trial_specs, base_image=image, install_kfp_package=False)
    best_op = dsl.component(best_config, base_image=image, install_kfp_package=False)

    def configure(task: dsl.PipelineTask, step: StepName) -> dsl.PipelineTask:
        if not (on_vertex and step in MULTI_WORKER_STEPS):
            apply_requests(task, resources.requests_for(step))
        if step in RETRIED_STEPS:
            task.set_retry(**RETRY)
        return task

    @dsl.pipeline(name=PIPELINE_NAME, description="gnnflow: the data steps once, then a Vertex AI hyperparameter-tuning job of train.")
    def gnnflow_tuning(config: str, overrides: str = "{}", data_version: str = "", infer_mode: str = "auto") -> None:
        settings = {"config": config, "overrides": overrides}
        pre = configure(preprocess_op(**settings, data_version=data_version, image=image), "preprocess")
        ser = configure(serialize_op(**settings, image=image, preprocessed=pre.outputs["preprocessed"]), "serialize")
        part = configure(partition_op(**settings, replicas=replicas, tfrecords=ser.outputs["tfrecords"]), "partition")
        specs = specs_op(**settings, partitions=part.outputs["partitions"], template=template, metric=metric).set_display_name(
            "trial-specs"
        )
        job = hyperparameter_tuning_job(
            display_name="gnnflow-tuning",
            base_output_directory=TUNING_OUTPUT,
            worker_pool_specs=specs.output,
            study_spec_metrics=metrics,
            study_spec_parameters=parameters,
            max_trial_count=options.trials,
            parallel_trial_count=options.parallel,
            max_failed_trial_count=options.trials,
            scheduling=scheduling,
            tensorboard=resources.custom_job.tensorboard or "",
            service_account=resources.custom_job.service_account or "",
            network=resources.custom_job.network or "",
            location="{{$.pipeline_google_cloud_location}}",
        ).set_display_name("tuning-job")
        best = best_op(**settings, gcp_resources=job.outputs["gcp_resources"], space=space_json(space), metric=metric)
        best.set_display_name("best-config").set_retry(**RETRY)  # reads the job and writes storage: transient failures pass

    return gnnflow_tuning


def compile_tuning_pipeline(
    package_path: str, config: GnnflowConfig, space: SearchSpace, options: TuningOptions, image: str = DEFAULT_IMAGE
) -> None:
    """Writes the tuning pipeline's spec (KFP IR YAML) to ``package_path``, a local path or ``gs://`` URI."""
    write_package(build_tuning_pipeline(config, space, options, image), package_path)


def compile_tuning(args: argparse.Namespace) -> None:
    """``gnnflow compile --tuning``: writes the tuning pipeline's spec; the space is checked against the whole config first."""
    if not args.config or args.trials is None:
        raise GnnflowError("compile --tuning needs --config (its task, space and resources) and --trials")
    config, space = prepare(args.config, {}, args.space)
    image = args.image or DEFAULT_IMAGE
    compile_tuning_pipeline(args.output, config, space, TuningOptions(args.trials, args.parallel), image)
    log.info(
        "wrote the tuning pipeline spec to %s (image %s; %d trial(s), %d at a time, maximising %s over %s)",
        args.output,
        image,
        args.trials,
        args.parallel,
        objective_metric(config),
        space.source,
    )
