"""The KFP component of step train: partitions in, the model and its final metrics out."""

from kfp import dsl
from kfp.dsl.python_component import PythonComponent
from kfp.dsl import Dataset, Input, Metrics, Model, Output


def train(config: str, overrides: str, image: str, partitions: Input[Dataset], model: Output[Model], metrics: Output[Metrics]) -> None:
    """Trains the GraphSAGE model on ``partitions`` into ``model``; logs train/val/test metrics on ``metrics``.

    The trainers run inside this task, or as a Vertex AI CustomJob of ``image`` when
    ``resources.runner`` is vertex.
    """
    from components import pipeline_task
    from components.train.step import train as run_step

    with pipeline_task.running("train", config, overrides) as resolved:
        source, output = pipeline_task.artifact_uri(partitions), pipeline_task.artifact_uri(model)
        published = pipeline_task.run_multi_worker(
            resolved, "train", image, ["--input", str(source), "--output", str(output)], output,
            lambda: run_step(resolved, source, output),
        )
        pipeline_task.describe(model, published)
        model.metadata["framework"] = "pytorch_geometric"
        pipeline_task.log_metrics(metrics, published.read_json("metrics.json"))


def build_component(image: str) -> PythonComponent:
    """The component running in ``image``, which already holds gnnflow and kfp (nothing is installed at run time)."""
    return dsl.component(train, base_image=image, install_kfp_package=False)
