"""The KFP component of step export: embeddings in; the published export (a Dataset holding the
Vector Search folder) out, after which the BigQuery tables are written."""

from kfp import dsl
from kfp.dsl import Dataset, Input, Output
from kfp.dsl.python_component import PythonComponent


def export(config: str, overrides: str, embeddings: Input[Dataset], exported: Output[Dataset]) -> None:
    """Publishes the export into ``exported``, then writes output.bigquery's tables (run id: the
    embeddings' generation, so a retried task never duplicates rows)."""
    from components.export.step import export as run_step
    from components.runtime import pipeline_task

    with pipeline_task.running("export", config, overrides) as resolved:
        published = run_step(resolved, pipeline_task.artifact_uri(embeddings), pipeline_task.artifact_uri(exported))
        pipeline_task.describe(exported, published)


def build_component(image: str) -> PythonComponent:
    """The component running in ``image``, which already holds gnnflow and kfp (nothing is installed at run time)."""
    return dsl.component(export, base_image=image, install_kfp_package=False)
