"""The tuning pipeline's Vertex AI hyperparameter-tuning job, with the trial CustomJobs set up as
the main pipeline sets up train's: scheduling (strategy, restarts, timeout, the wait of
flex_start), TensorBoard, service account and network.

google-cloud-pipeline-components' ``HyperparameterTuningJobRunOp`` fills a trial job spec with
worker pools, service account, network and output folder only, so a study ignored
``resources.strategy``, ``custom_job.restart_job_on_worker_restart``, ``timeout_s``,
``max_wait_s`` and ``tensorboard``. This component sends the same request through the same
launcher (the gcpc image's ``hyperparameter_tuning_job.launcher``, which creates the job, waits
for it, cancels it with the run and records it in ``gcp_resources``), with the whole
``trial_job_spec`` Vertex AI accepts (a ``CustomJobSpec``).

(No ``from __future__ import annotations``: KFP reads the component's annotations as types.)
"""

from typing import Any

from kfp import dsl
from kfp.dsl import ConcatPlaceholder, ContainerSpec, OutputPath

from components.config import ResourcesSpec


def _launcher_image() -> str:
    """The image gcpc's own tuning component runs its launcher in (kept in step with the pinned gcpc)."""
    from google_cloud_pipeline_components.v1.hyperparameter_tuning_job import HyperparameterTuningJobRunOp

    return str(HyperparameterTuningJobRunOp.component_spec.implementation.container.image)


LAUNCHER_MODULE = "google_cloud_pipeline_components.container.v1.hyperparameter_tuning_job.launcher"


def trial_scheduling(resources: ResourcesSpec) -> dict[str, Any]:
    """Each trial's ``CustomJobSpec.scheduling``, as train's CustomJob gets it (:mod:`pipelines.vertex_job`)."""
    spec = resources.custom_job
    scheduling: dict[str, Any] = {
        "strategy": resources.strategy.upper(),
        "restart_job_on_worker_restart": spec.restart_job_on_worker_restart,
    }
    if spec.timeout_s is not None:
        scheduling["timeout"] = f"{spec.timeout_s}s"
    if spec.max_wait_s is not None:
        scheduling["max_wait_duration"] = f"{spec.max_wait_s}s"
    return scheduling


@dsl.container_component
def hyperparameter_tuning_job(
    display_name: str,
    base_output_directory: str,
    worker_pool_specs: list,
    study_spec_metrics: list,
    study_spec_parameters: list,
    max_trial_count: int,
    parallel_trial_count: int,
    max_failed_trial_count: int,
    scheduling: dict,
    tensorboard: str,
    service_account: str,
    network: str,
    location: str,
    gcp_resources: OutputPath(str),  # type: ignore[valid-type]
    project: str = "{{$.pipeline_google_cloud_project_id}}",
) -> ContainerSpec:
    """Creates a Vertex AI HyperparameterTuningJob whose trials are CustomJobs of ``worker_pool_specs``
    with ``scheduling`` and ``tensorboard``, and waits for it; ``gcp_resources`` names the job."""
    payload = ConcatPlaceholder(
        [
            '{"display_name": "',
            display_name,
            '", "study_spec": {"metrics": ',
            study_spec_metrics,
            ', "parameters": ',
            study_spec_parameters,
            ', "algorithm": "ALGORITHM_UNSPECIFIED", "measurement_selection_type": "BEST_MEASUREMENT"}',
            ', "max_trial_count": ',
            max_trial_count,
            ', "parallel_trial_count": ',
            parallel_trial_count,
            ', "max_failed_trial_count": ',
            max_failed_trial_count,
            ', "trial_job_spec": {"worker_pool_specs": ',
            worker_pool_specs,
            ', "scheduling": ',
            scheduling,
            ', "tensorboard": "',
            tensorboard,
            '", "service_account": "',
            service_account,
            '", "network": "',
            network,
            '", "base_output_directory": {"output_uri_prefix": "',
            base_output_directory,
            '"}}}',
        ]
    )
    return ContainerSpec(
        image=_launcher_image(),
        command=["python3", "-u", "-m", LAUNCHER_MODULE],
        args=[
            "--type",
            "HyperparameterTuningJob",
            "--payload",
            payload,
            "--project",
            project,
            "--location",
            location,
            "--gcp_resources",
            gcp_resources,
        ],
    )
