"""The KFP component of step partition: TFRecords in, one graph partition per worker (a Dataset) out."""

from kfp import dsl
from kfp.dsl import Dataset, Input, Output
from kfp.dsl.python_component import PythonComponent


def partition(config: str, overrides: str, replicas: int, tfrecords: Input[Dataset], partitions: Output[Dataset]) -> None:
    """Loads ``tfrecords`` with ``resources.world_size`` workers and writes their partitions into ``partitions``.

    ``replicas``: 0 when the workers run inside this task; N when this function runs on each of
    the N replicas of a Vertex AI CustomJob (``resources.runner: vertex``, fixed at compile time).
    """
    from components.partition.step import partition as run_step
    from components.runtime import pipeline_task

    with pipeline_task.running("partition", config, overrides, replicas) as resolved:
        source, output = pipeline_task.artifact_uri(tfrecords), pipeline_task.artifact_uri(partitions)
        resources = resolved.resources
        result = run_step(
            source, output, resolved.partition, resources.world_size, resources.processes_per_replica, resources.worker_timeouts
        )
        published = pipeline_task.published_here("partition", result, replicas)
        if published is not None:
            pipeline_task.describe(partitions, published)


def build_component(image: str) -> PythonComponent:
    """The component running in ``image``, which already holds gnnflow and kfp (nothing is installed at run time)."""
    return dsl.component(partition, base_image=image, install_kfp_package=False)
