"""The Vertex AI side of ``gnnflow tune``: a search space as a StudySpec, and the trials' worker pools.

A Vertex AI hyperparameter-tuning trial is a CustomJob of the step image running
``python3 -m components.train``; Vertex AI appends the trial's parameters as ``--KEY=VALUE``
(the parameter ids are the dotted config keys, so they arrive as train's overrides), sets
``$AIP_MODEL_DIR`` to the trial's own folder (train's default output there), and reads the
objective from the hypertune metrics file, which ``--hypertune-metric`` makes train write.
Trials train with ``training.evaluate_test=false``, as locally: no test figure exists before a
trial is selected.

Categorical choices travel as text that reads back, as YAML, to the value (``64``,
``[15,10]``, ``mlp``), which is how train's ``--set`` parses them.
"""

from __future__ import annotations

import json
from typing import Any

from components.config import GnnflowConfig, ResourcesSpec
from pipelines.tune.space import Param, SearchSpace, encode
from pipelines.vertex_job import check_accelerator
from pipelines.vertex_machines import check_custom_job_machines

TRAIN_COMMAND = ["python3", "-m", "components.train"]
FIXED_TRIAL_ARGS = ["--set", "training.evaluate_test=false"]


def parameter_specs(space: SearchSpace) -> list[dict[str, Any]]:
    """The space as Vertex AI ``StudySpec.parameters`` (through the SDK's specs and gcpc's serializer);
    a conditional parameter nests in its parent's ``conditional_parameter_specs`` with its
    ``parent_categorical_values``, as Vertex AI searches it only where the parent took them."""
    from google.cloud.aiplatform import hyperparameter_tuning as hpt
    from google_cloud_pipeline_components.v1.hyperparameter_tuning_job import serialize_parameters

    def spec(p: Param) -> Any:
        children = {c.key: spec(c) for c in space.params if c.when is not None and c.when.key == p.key}
        nested: dict[str, Any] = {"conditional_parameter_spec": children or None}
        if p.when is not None:
            nested["parent_values"] = [encode(v) for v in p.when.values]
        scale = "log" if p.log else "linear"
        if p.type == "float":
            return hpt.DoubleParameterSpec(min=p.bounds[0], max=p.bounds[1], scale=scale, **nested)
        if p.type == "int":
            return hpt.IntegerParameterSpec(min=int(p.bounds[0]), max=int(p.bounds[1]), scale=scale, **nested)
        return hpt.CategoricalParameterSpec(values=[encode(c) for c in p.choices], **nested)

    return serialize_parameters({p.key: spec(p) for p in space.params if p.when is None})


def metric_specs(metric: str) -> list[dict[str, Any]]:
    from google_cloud_pipeline_components.v1.hyperparameter_tuning_job import serialize_metrics

    return serialize_metrics({metric: "maximize"})


def pool_template(resources: ResourcesSpec, image: str) -> dict[str, Any]:
    """What every trial's worker pools share (machine, disk, image), fixed at compile time from ``resources``:
    the chief + workers layout of the pipeline's CustomJobs (pool 0: one replica, pool 1: the rest)."""
    spec = resources.custom_job
    check_accelerator(spec.accelerator_type)
    machine: dict[str, Any] = {"machine_type": spec.machine_type}
    if spec.accelerator_type:
        machine |= {"accelerator_type": spec.accelerator_type, "accelerator_count": spec.accelerator_count}
    return {
        "replica_count": resources.replica_count,
        "machine_spec": machine,
        "disk_spec": {"boot_disk_type": check_custom_job_machines(resources), "boot_disk_size_gb": spec.boot_disk_gb},
        "image_uri": image,
    }


def trial_args(config: GnnflowConfig, partitions_uri: str, metric: str) -> list[str]:
    """The train command line of every trial (Vertex AI appends the trial's ``--KEY=VALUE``)."""
    return ["--config-yaml", config.to_yaml(), "--input", partitions_uri, *FIXED_TRIAL_ARGS, "--hypertune-metric", metric]


def worker_pool_specs(template: dict[str, Any], args: list[str]) -> list[dict[str, Any]]:
    """The trial CustomJob's worker pools (REST field names, as ``HyperparameterTuningJobRunOp`` passes them on)."""
    container = {"image_uri": template["image_uri"], "command": TRAIN_COMMAND, "args": args}
    pool = {"machine_spec": template["machine_spec"], "disk_spec": template["disk_spec"], "container_spec": container}
    pools = [{**pool, "replica_count": 1}]
    if template["replica_count"] > 1:
        pools.append({**pool, "replica_count": template["replica_count"] - 1})
    return pools


def trial_specs(config_text: str, overrides: str, partitions_uri: str, template_json: str, metric: str) -> list[dict[str, Any]]:
    """Run time (the pipeline's task ``trial-specs``): the worker pools for the run's resolved config and partitions."""
    from components.config import resolve_config

    config = resolve_config(config_text, overrides)
    return worker_pool_specs(json.loads(template_json), trial_args(config, partitions_uri, metric))
