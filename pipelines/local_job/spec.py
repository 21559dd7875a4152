"""A multi-replica task of a compiled pipeline, read the way Vertex AI reads it to start the job.

A task compiled with ``resources.runner: vertex`` is google-cloud-pipeline-components' CustomJob
wrapper: its container only launches the job, and the job's worker pool specs (machine, replica
count, the step image's command and args) are among the task's input parameters. Vertex AI
Pipelines resolves those parameters (constants, pipeline parameters, its own placeholders such
as ``{{$.pipeline_root}}``) and substitutes the task's executor input, JSON-escaped, for
``{{$.json_escape[1]}}`` in each pool's args. This module does the same from the YAML alone.
"""

from __future__ import annotations

import copy
import json
from dataclasses import dataclass
from typing import Any

from components.errors import GnnflowError

EXECUTOR_INPUT = "{{$.json_escape[1]}}"
_LAUNCHER = "google_cloud_pipeline_components.container.v1.custom_job.launcher"


@dataclass(frozen=True)
class WorkerPool:
    """One worker pool of the job: ``replica_count`` machines running the same container."""

    name: str  # workerpool0, workerpool1, ... as CLUSTER_SPEC names them
    replica_count: int
    image_uri: str
    command: tuple[str, ...]
    args: tuple[str, ...]  # with EXECUTOR_INPUT where the executor input goes
    machine_spec: dict[str, Any]


@dataclass(frozen=True)
class InputArtifact:
    producer: str  # the upstream task
    output_key: str  # its output's name
    schema_title: str  # system.Dataset, system.Model, ...


@dataclass(frozen=True)
class JobTask:
    """A CustomJob task with every parameter resolved: what Vertex AI would start."""

    task: str
    display_name: str
    pools: tuple[WorkerPool, ...]
    parameters: dict[str, Any]  # the task's input parameters, as the executor input carries them
    inputs: dict[str, InputArtifact]  # input artifact name → where it comes from
    outputs: dict[str, str]  # output artifact name → schema title
    base_output_directory: str  # "" when the job has none
    timeout_s: float | None

    @property
    def world_size(self) -> int:
        return sum(pool.replica_count for pool in self.pools)

    def job_spec(self) -> dict[str, Any]:
        """The CustomJob spec, as CLUSTER_SPEC's ``job`` carries it."""
        pools = [
            {
                "replica_count": pool.replica_count,
                "machine_spec": pool.machine_spec,
                "container_spec": {"image_uri": pool.image_uri, "command": list(pool.command), "args": list(pool.args)},
            }
            for pool in self.pools
        ]
        spec: dict[str, Any] = {"worker_pool_specs": pools}
        if self.base_output_directory:
            spec["base_output_directory"] = {"output_uri_prefix": self.base_output_directory}
        return spec


def custom_job_tasks(pipeline: dict[str, Any]) -> list[str]:
    """The tasks of ``pipeline`` (compiled KFP IR) that run as Vertex AI CustomJobs, in DAG order."""
    tasks = pipeline.get("root", {}).get("dag", {}).get("tasks", {})
    return [name for name in _dag_order(tasks) if _is_custom_job(pipeline, tasks[name])]


def _dag_order(tasks: dict[str, Any]) -> list[str]:
    """Task names with every task after those it depends on (the compiled YAML sorts them by name)."""
    ordered: list[str] = []

    def visit(name: str) -> None:
        if name in ordered or name not in tasks:
            return
        for upstream in sorted(tasks[name].get("dependentTasks", [])):
            visit(upstream)
        ordered.append(name)

    for name in sorted(tasks):
        visit(name)
    return ordered


def read_job_task(pipeline: dict[str, Any], task: str, pipeline_parameters: dict[str, Any], placeholders: dict[str, str]) -> JobTask:
    """The CustomJob task ``task`` of ``pipeline`` with its parameters resolved.

    Args:
        pipeline_parameters: values of the pipeline's own parameters (``config``, ``overrides``,
            ...); those not given take the pipeline's defaults.
        placeholders: values of Vertex AI's placeholders (``{{$.pipeline_root}}``, ...).

    Raises:
        GnnflowError: when ``task`` is not in the pipeline, is not a CustomJob task, or a
            parameter it needs has no value.
    """
    tasks = pipeline.get("root", {}).get("dag", {}).get("tasks", {})
    if task not in tasks:
        raise GnnflowError(f"the pipeline has no task {task!r}; its tasks: {', '.join(tasks)}")
    if not _is_custom_job(pipeline, tasks[task]):
        multi = custom_job_tasks(pipeline)
        raise GnnflowError(
            f"task {task!r} is not a Vertex AI CustomJob in this pipeline (it runs in its own container): "
            + (f"its CustomJob tasks are {', '.join(multi)}" if multi else "compile with resources.runner: vertex to get some")
        )
    declared = _component(pipeline, tasks[task])["inputDefinitions"]
    parameters = {name: spec["defaultValue"] for name, spec in declared.get("parameters", {}).items() if "defaultValue" in spec}
    pipeline_defaults = {
        name: spec["defaultValue"]
        for name, spec in pipeline["root"].get("inputDefinitions", {}).get("parameters", {}).items()
        if "defaultValue" in spec
    }
    values = {**pipeline_defaults, **pipeline_parameters}
    for name, given in tasks[task].get("inputs", {}).get("parameters", {}).items():
        if "runtimeValue" in given:
            parameters[name] = given["runtimeValue"]["constant"]
        elif "componentInputParameter" in given:
            source = given["componentInputParameter"]
            if source not in values:
                raise GnnflowError(f"task {task!r} needs the pipeline parameter {source!r}: give it (--param {source}=VALUE)")
            parameters[name] = values[source]
        else:
            raise GnnflowError(f"task {task!r}: parameter {name!r} comes from another task's output, which a local job cannot supply")
    parameters = _substitute(parameters, placeholders)
    for name, spec in declared.get("parameters", {}).items():
        # The compiler writes every number as a double (2.0); the executor input carries integer
        # parameters as integers, as the KFP driver casts them by their declared type.
        if spec.get("parameterType") == "NUMBER_INTEGER" and isinstance(parameters.get(name), float):
            parameters[name] = int(parameters[name])
    inputs = {
        name: InputArtifact(given["taskOutputArtifact"]["producerTask"], given["taskOutputArtifact"]["outputArtifactKey"], "")
        for name, given in tasks[task].get("inputs", {}).get("artifacts", {}).items()
    }
    titles = {name: spec["artifactType"]["schemaTitle"] for name, spec in declared.get("artifacts", {}).items()}
    inputs = {name: InputArtifact(ref.producer, ref.output_key, titles.get(name, "system.Artifact")) for name, ref in inputs.items()}
    produced = _component(pipeline, tasks[task]).get("outputDefinitions", {}).get("artifacts", {})
    outputs = {name: spec["artifactType"]["schemaTitle"] for name, spec in produced.items()}
    timeout = str(parameters.get("timeout") or "")
    return JobTask(
        task=task,
        display_name=str(parameters.get("display_name") or task),
        pools=_pools(task, parameters.get("worker_pool_specs")),
        parameters=parameters,
        inputs=inputs,
        outputs=outputs,
        base_output_directory=str(parameters.get("base_output_directory") or ""),
        timeout_s=float(timeout.removesuffix("s")) if timeout else None,
    )


def executor_input(job: JobTask, inputs: dict[str, str], outputs: dict[str, str], output_file: str) -> dict[str, Any]:
    """The executor input Vertex AI substitutes into each replica's args (artifacts at these URIs)."""

    def artifact(name: str, uri: str, title: str) -> dict[str, Any]:
        return {"artifacts": [{"name": name, "uri": uri, "type": {"schemaTitle": title}, "metadata": {}}]}

    return {
        "inputs": {
            "parameterValues": job.parameters,
            "artifacts": {name: artifact(name, inputs[name], ref.schema_title) for name, ref in job.inputs.items()},
        },
        "outputs": {
            "artifacts": {name: artifact(name, outputs[name], title) for name, title in job.outputs.items()},
            "outputFile": output_file,
        },
    }


def replica_argv(pool: WorkerPool, executor: dict[str, Any]) -> list[str]:
    """The pool's command and args with the executor input substituted, as the container receives them."""
    text = json.dumps(executor)
    return [*pool.command, *(text if arg == EXECUTOR_INPUT else arg for arg in pool.args)]


def _is_custom_job(pipeline: dict[str, Any], task: dict[str, Any]) -> bool:
    executor = _component(pipeline, task).get("executorLabel", "")
    container = pipeline.get("deploymentSpec", {}).get("executors", {}).get(executor, {}).get("container", {})
    return _LAUNCHER in " ".join(container.get("command", []))


def _component(pipeline: dict[str, Any], task: dict[str, Any]) -> dict[str, Any]:
    return pipeline.get("components", {}).get(task.get("componentRef", {}).get("name", ""), {})


def _pools(task: str, specs: Any) -> tuple[WorkerPool, ...]:
    if not isinstance(specs, list) or not specs:
        raise GnnflowError(f"task {task!r} has no worker_pool_specs: is this a pipeline gnnflow compiled?")
    pools = []
    for index, spec in enumerate(specs):
        container = spec.get("container_spec") or {}
        if not container.get("image_uri") or not container.get("command"):
            raise GnnflowError(f"task {task!r}: worker_pool_specs[{index}] has no container image or command")
        pools.append(
            WorkerPool(
                name=f"workerpool{index}",
                replica_count=int(spec.get("replica_count", 1)),
                image_uri=container["image_uri"],
                command=tuple(container["command"]),
                args=tuple(container.get("args", [])),
                machine_spec=dict(spec.get("machine_spec", {})),
            )
        )
    if pools[0].replica_count != 1:
        raise GnnflowError(f"task {task!r}: workerpool0 has {pools[0].replica_count} replicas; Vertex AI's chief pool holds exactly one")
    return tuple(pools)


def _substitute(value: Any, placeholders: dict[str, str]) -> Any:
    """``value`` with every placeholder replaced, in strings at any depth (the CustomJob's own JSON included)."""
    if isinstance(value, str):
        for placeholder, replacement in placeholders.items():
            value = value.replace(placeholder, replacement)
        return value
    if isinstance(value, list):
        return [_substitute(item, placeholders) for item in value]
    if isinstance(value, dict):
        return {key: _substitute(item, placeholders) for key, item in copy.copy(value).items()}
    return value
