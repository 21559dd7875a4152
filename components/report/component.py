"""The KFP component of step report: model and embeddings in; the published report (an Artifact),
the final metrics (Metrics) and the page itself (HTML, which pipeline UIs render) out."""

from kfp import dsl
from kfp.dsl import HTML, Artifact, Dataset, Input, Metrics, Model, Output
from kfp.dsl.python_component import PythonComponent


def report(
    config: str,
    overrides: str,
    model: Input[Model],
    embeddings: Input[Dataset],
    report: Output[Artifact],
    metrics: Output[Metrics],
    html: Output[HTML],
) -> None:
    """Publishes the report into ``report``; logs its final metrics on ``metrics`` and copies
    report.html (self-contained: plots embedded) to ``html``."""
    from components import storage
    from components.report.step import PAGE_FILE
    from components.report.step import report as run_step
    from components.runtime import pipeline_task

    with pipeline_task.running("report", config, overrides) as resolved:
        published = run_step(
            resolved, pipeline_task.artifact_uri(model), pipeline_task.artifact_uri(embeddings), pipeline_task.artifact_uri(report)
        )
        pipeline_task.describe(report, published)
        pipeline_task.log_metrics(metrics, published.read_json("metrics.json"))
        storage.write_bytes(pipeline_task.artifact_uri(html), published.read_bytes(PAGE_FILE))


def build_component(image: str) -> PythonComponent:
    """The component running in ``image``, which already holds gnnflow and kfp (nothing is installed at run time)."""
    return dsl.component(report, base_image=image, install_kfp_package=False)
