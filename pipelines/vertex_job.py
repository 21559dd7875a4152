"""A multi-worker step (partition, train, infer) compiled as a Vertex AI CustomJob (``resources.runner: vertex``).

google-cloud-pipeline-components' ``create_custom_training_job_from_component`` turns the
step's component into a CustomJob component: Vertex AI Pipelines then launches the job, shows
it on the run's graph with a link, cancels it with the run, and records the step's artifacts
as for any task. Every replica runs the step's own component (its KFP executor, which calls
the step's function), so a replica resolves the run's config and overrides itself from the
task's inputs, learns its place from Vertex AI's ``CLUSTER_SPEC`` in
:mod:`components.runtime.launcher`, and only the chief (``workerpool0``) publishes the output and
writes the task's executor output (KFP's executor skips that write on the other pools).

Layout: ``create_custom_training_job_from_component(replica_count=N)`` gives pool 0 one
replica and pool 1 the other ``N - 1``, with the same machine, disk and container; with
``N = 1`` there is only pool 0. That is the chief + workers layout the launcher expects.

Everything here shapes the job, so it is fixed when the pipeline is compiled, from the
``resources`` section (``world_size``, ``processes_per_replica``, ``custom_job``); a run whose
config asks for another layout is refused by the step itself (``pipeline_task.running``).
"""

from __future__ import annotations

from typing import Any

from kfp import dsl

from components.config import ResourcesSpec, StepName
from components.errors import GnnflowError
from pipelines.vertex_machines import check_custom_job_machines

# KFP's command for a lightweight component: ``sh -ec`` writes the function's source to a file and
# runs the executor on it. Vertex AI sends SIGTERM (preemption, cancel) to PID 1 of each replica's
# container, and a shell that is PID 1 ignores it (a namespace's init gets no signal it has no
# handler for), so the executor would never see it and train never checkpoint before the kill:
# ``exec`` makes the executor (the step's launcher) PID 1.
_EXECUTOR_RUN = "_KFP_RUNTIME=true python3 -m kfp.dsl.executor_main"

TENSORBOARD_STEP: StepName = "train"  # the step whose job uploads curves to custom_job.tensorboard
# A per-run folder for train's job (Vertex AI derives AIP_TENSORBOARD_LOG_DIR from it): resolved by Vertex AI Pipelines.
TENSORBOARD_BASE_OUTPUT = f"{dsl.PIPELINE_ROOT_PLACEHOLDER}/{dsl.PIPELINE_JOB_ID_PLACEHOLDER}/{TENSORBOARD_STEP}-custom-job"


def custom_job_component(component: Any, step: StepName, resources: ResourcesSpec) -> Any:
    """``component`` (a step's lightweight component) as a CustomJob component of ``resources.replica_count`` replicas.

    Returns:
        A KFP component taking the step's inputs (plus the CustomJob's own, with these values as
        defaults) and producing the step's outputs plus ``gcp_resources`` (the job's name).
    """
    from google_cloud_pipeline_components.v1.custom_job import create_custom_training_job_from_component

    spec = resources.custom_job
    check_accelerator(spec.accelerator_type)
    boot_disk_type = check_custom_job_machines(resources)
    options: dict[str, Any] = {
        "display_name": f"gnnflow-{step}",
        "replica_count": resources.replica_count,
        "machine_type": spec.machine_type,
        "boot_disk_type": boot_disk_type,
        "boot_disk_size_gb": spec.boot_disk_gb,
        "restart_job_on_worker_restart": spec.restart_job_on_worker_restart,
        "strategy": resources.strategy.upper(),
        "service_account": spec.service_account or "",
        "network": spec.network or "",
        "labels": {"gnnflow-step": step},
    }
    if spec.accelerator_type:
        options |= {"accelerator_type": spec.accelerator_type, "accelerator_count": spec.accelerator_count}
    if spec.max_wait_s is not None:
        options["max_wait_duration"] = f"{spec.max_wait_s}s"
    if spec.timeout_s is not None:
        options["timeout"] = f"{spec.timeout_s}s"
    if spec.tensorboard and step == TENSORBOARD_STEP:
        options["tensorboard"] = spec.tensorboard
    return create_custom_training_job_from_component(executor_as_pid_1(component), **options)


def executor_as_pid_1(component: Any) -> Any:
    """``component`` (built for this compile, changed in place) with its command ending in
    ``exec`` of the KFP executor, so that the executor receives the SIGTERM sent to the container."""
    container = component.component_spec.implementation.container
    script = container.command[-2] if len(container.command) >= 2 else ""
    if _EXECUTOR_RUN not in script:
        raise GnnflowError(
            f"the KFP component command no longer runs {_EXECUTOR_RUN!r} (a kfp upgrade?): "
            "pipelines/vertex_job.py must make the executor PID 1 another way"
        )
    container.command[-2] = script.replace(_EXECUTOR_RUN, _EXECUTOR_RUN.replace(" python3", " exec python3"), 1)
    return component


def check_accelerator(accelerator_type: str | None) -> None:
    """Vertex AI would refuse an unknown accelerator only when the job starts, hours into a run: name the key now."""
    if accelerator_type is None:
        return
    from google.cloud.aiplatform_v1.types import AcceleratorType

    known = [name for name in AcceleratorType.__members__ if name != "ACCELERATOR_TYPE_UNSPECIFIED"]
    if accelerator_type not in known:
        raise GnnflowError(
            f"resources.custom_job.accelerator_type {accelerator_type!r} is not a Vertex AI accelerator; known: {', '.join(sorted(known))}"
        )
