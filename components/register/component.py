"""The KFP component of step register: the trained model in; the decision (the ``registration``
Artifact, whose metadata names the version) out, and whether the model is blessed as the output
parameter ``Output``, so the DAG runs the downstream steps only for a blessed model
(``dsl.If(register_task.outputs["Output"] == True)``).

Why that name: kfp.local (2.17) resolves a condition on a task output only when its channel reads
``<task>-Output`` (``pipelinechannel--register-blessed`` is taken for a pipeline parameter, and
the branch silently never runs), and the pipeline must behave the same there and on Vertex AI."""

from typing import NamedTuple

from kfp import dsl
from kfp.dsl import Artifact, Input, Model, Output
from kfp.dsl.python_component import PythonComponent


def register(
    config: str,
    overrides: str,
    data_version: str,
    model: Input[Model],
    registration: Output[Artifact],
) -> NamedTuple("RegisterOutputs", [("Output", bool)]):  # type: ignore[valid-type]  # KFP reads the output from it
    """Registers ``model`` in ``registry.uri`` and gates it; publishes the decision into ``registration``.

    ``data_version``: the pipeline's fingerprint of the input tables, recorded with the version."""
    from collections import namedtuple

    from components.register.step import register as run_step
    from components.runtime import pipeline_task

    with pipeline_task.running("register", config, overrides) as resolved:
        result = run_step(resolved, pipeline_task.artifact_uri(model), pipeline_task.artifact_uri(registration), data_version)
        pipeline_task.describe(registration, result.published)
        registration.metadata["version"] = result.version.name
        registration.metadata["model_uri"] = result.version.model_uri
        registration.metadata["blessed"] = result.blessed
        registration.metadata["reason"] = result.decision.reason
    RegisterOutputs = namedtuple("RegisterOutputs", ["Output"])  # noqa: N806 - KFP reads the field names
    return RegisterOutputs(Output=result.blessed)


def build_component(image: str) -> PythonComponent:
    """The component running in ``image``, which already holds gnnflow and kfp (nothing is installed at run time)."""
    return dsl.component(register, base_image=image, install_kfp_package=False)
