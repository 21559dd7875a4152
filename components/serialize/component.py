"""The KFP component of step serialize: the preprocessed Dataset in, TFRecord shards (a Dataset) out."""

from kfp import dsl
from kfp.dsl import Dataset, Input, Output
from kfp.dsl.python_component import PythonComponent


def serialize(config: str, overrides: str, image: str, preprocessed: Input[Dataset], tfrecords: Output[Dataset]) -> None:
    """Writes ``preprocessed`` as TFRecord shards and graph_metadata.json into ``tfrecords``
    (on Beam workers running ``image`` with ``preprocess.engine: beam``)."""
    from components.runtime import pipeline_task
    from components.serialize.step import serialize as run_step

    with pipeline_task.running("serialize", config, overrides) as resolved:
        published = run_step(resolved, pipeline_task.artifact_uri(preprocessed), pipeline_task.artifact_uri(tfrecords), image=image)
        pipeline_task.describe(tfrecords, published)


def build_component(image: str) -> PythonComponent:
    """The component running in ``image``, which already holds gnnflow and kfp (nothing is installed at run time)."""
    return dsl.component(serialize, base_image=image, install_kfp_package=False)
