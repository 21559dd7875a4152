"""The KFP component of step train: partitions in, the model and its final metrics out."""

from kfp import dsl
from kfp.dsl import Dataset, Input, Metrics, Model, Output
from kfp.dsl.python_component import PythonComponent


def train(config: str, overrides: str, replicas: int, partitions: Input[Dataset], model: Output[Model], metrics: Output[Metrics]) -> None:
    """Trains the GraphSAGE model on ``partitions`` into ``model``; logs train/val/test metrics on ``metrics``.

    ``replicas``: 0 when the trainers run inside this task; N when this function runs on each of
    the N replicas of a Vertex AI CustomJob (``resources.runner: vertex``, fixed at compile time).
    """
    from components.runtime import pipeline_task
    from components.train.step import train as run_step

    with pipeline_task.running("train", config, overrides, replicas) as resolved:
        source, output = pipeline_task.artifact_uri(partitions), pipeline_task.artifact_uri(model)
        published = pipeline_task.published_here("train", run_step(resolved, source, output), replicas)
        if published is None:
            return
        pipeline_task.describe(model, published)
        model.metadata["framework"] = "pytorch_geometric"
        # Vertex AI Experiments merges a run's Metrics artifacts into one row: train's own test
        # figures (sampled evaluation) get their own names, so test_* there are the final ones.
        final = published.read_json("metrics.json")
        pipeline_task.log_metrics(metrics, {f"sampled_{k}" if k.startswith("test_") else k: v for k, v in final.items()})


def build_component(image: str) -> PythonComponent:
    """The component running in ``image``, which already holds gnnflow and kfp (nothing is installed at run time)."""
    return dsl.component(train, base_image=image, install_kfp_package=False)
