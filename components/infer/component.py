"""The KFP component of step infer: partitions and model in, embeddings (a Dataset) and test metrics out."""

from kfp import dsl
from kfp.dsl.python_component import PythonComponent
from kfp.dsl import Dataset, Input, Metrics, Model, Output


def infer(
    config: str, overrides: str, image: str, mode: str,
    partitions: Input[Dataset], model: Input[Model], embeddings: Output[Dataset], metrics: Output[Metrics],
) -> None:
    """Embeds (and classifies) every node into ``embeddings``; logs the test metrics recomputed from them.

    ``mode``: sampled (neighbour sampling) or exact (full neighbourhoods, layer by layer). The
    workers run inside this task, or as a Vertex AI CustomJob of ``image`` when
    ``resources.runner`` is vertex.
    """
    from components import pipeline_task
    from components.infer.step import infer as run_step

    with pipeline_task.running("infer", config, overrides) as resolved:
        parts, trained = pipeline_task.artifact_uri(partitions), pipeline_task.artifact_uri(model)
        output = pipeline_task.artifact_uri(embeddings)
        arguments = ["--partitions", str(parts), "--model", str(trained), "--output", str(output), "--mode", mode]
        published = pipeline_task.run_multi_worker(
            resolved, "infer", image, arguments, output, lambda: run_step(resolved, parts, trained, output, mode=mode),
        )
        pipeline_task.describe(embeddings, published)
        pipeline_task.log_metrics(metrics, published.read_json("metrics.json"))


def build_component(image: str) -> PythonComponent:
    """The component running in ``image``, which already holds gnnflow and kfp (nothing is installed at run time)."""
    return dsl.component(infer, base_image=image, install_kfp_package=False)
