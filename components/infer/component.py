"""The KFP component of step infer: partitions and model in, embeddings (a Dataset) and test metrics out."""

from kfp import dsl
from kfp.dsl import Dataset, Input, Metrics, Model, Output
from kfp.dsl.python_component import PythonComponent


def infer(
    config: str,
    overrides: str,
    replicas: int,
    mode: str,
    partitions: Input[Dataset],
    model: Input[Model],
    embeddings: Output[Dataset],
    metrics: Output[Metrics],
) -> None:
    """Embeds (and classifies) every node into ``embeddings``; logs the test metrics recomputed from them.

    ``mode``: sampled (neighbour sampling), exact (full neighbourhoods, layer by layer) or auto
    (exact when the config trains full-graph, else sampled).
    ``replicas``: 0 when the workers run inside this task; N when this function runs on each of
    the N replicas of a Vertex AI CustomJob (``resources.runner: vertex``, fixed at compile time).
    """
    from components.infer.step import infer as run_step
    from components.runtime import pipeline_task

    with pipeline_task.running("infer", config, overrides, replicas) as resolved:
        parts, trained = pipeline_task.artifact_uri(partitions), pipeline_task.artifact_uri(model)
        output = pipeline_task.artifact_uri(embeddings)
        published = pipeline_task.published_here("infer", run_step(resolved, parts, trained, output, mode=mode), replicas)
        if published is None:
            return
        pipeline_task.describe(embeddings, published)
        pipeline_task.log_metrics(metrics, published.read_json("metrics.json"))


def build_component(image: str) -> PythonComponent:
    """The component running in ``image``, which already holds gnnflow and kfp (nothing is installed at run time)."""
    return dsl.component(infer, base_image=image, install_kfp_package=False)
