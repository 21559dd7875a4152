"""The inference-only pipeline (``gnnflow compile --from-model``): fresh tables embedded with a
trained model, no training. A scheduler runs it daily against ``REGISTRY@blessed`` while the
training pipeline runs weekly and moves the alias; see the README's "Day two".

resolve-model (the ``model`` parameter: a published model URI or ``REGISTRY@blessed`` / ``@vN``,
resolved when the run starts) → preprocess with the model's fitted transforms → serialize →
partition → infer → report (→ export). The tasks, images, requests and CustomJobs are the
training pipeline's (:class:`pipelines.dag_steps.StepTasks`)."""

from collections.abc import Callable
from typing import NamedTuple

from kfp import dsl

from components.preprocess.component import build_with_model_component
from components.registry.component import build_component as resolve_model_component
from pipelines.dag_steps import RETRY, InferenceOutputs, StepTasks

PIPELINE_NAME = "gnnflow-inference"


def build_inference_pipeline(steps: StepTasks, export: bool) -> Callable[..., NamedTuple]:
    """The inference-only pipeline of ``steps``' tasks (with export when ``export``)."""
    resolve_op = resolve_model_component(steps.image)
    preprocess_op = build_with_model_component(steps.image)

    @dsl.pipeline(name=PIPELINE_NAME, description="gnnflow inference-only: fresh tables embedded with a trained model, no training.")
    def gnnflow_inference(
        config: str, model: str, overrides: str = "{}", data_version: str = "", infer_mode: str = "auto"
    ) -> InferenceOutputs:
        """``model``: a published model URI or ``REGISTRY@blessed`` / ``REGISTRY@vN`` (resolved when
        the run starts); the other parameters as in the training pipeline."""
        settings = {"config": config, "overrides": overrides}
        resolved = resolve_op(**settings, model_reference=model)
        resolved.set_retry(**RETRY)
        resolved.set_caching_options(False)  # an alias moves between runs: resolve it every time
        trained = resolved.outputs["model"]
        pre = steps.configure(preprocess_op(**settings, data_version=data_version, image=steps.image, model=trained), "preprocess")
        ser, part = steps.data_steps(settings, pre)
        inferred, reported = steps.downstream(settings, infer_mode, part.outputs["partitions"], trained, export)
        return InferenceOutputs(
            preprocessed=pre.outputs["preprocessed"],
            tfrecords=ser.outputs["tfrecords"],
            partitions=part.outputs["partitions"],
            model=trained,
            embeddings=inferred.outputs["embeddings"],
            infer_metrics=inferred.outputs["metrics"],
            report=reported.outputs["report"],
            metrics=reported.outputs["metrics"],
            report_html=reported.outputs["html"],
        )

    return gnnflow_inference
