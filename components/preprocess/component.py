"""The KFP component of step preprocess: raw tables (named by the config) in, a Dataset out."""

from kfp import dsl
from kfp.dsl import Dataset, Input, Model, Output
from kfp.dsl.python_component import PythonComponent


def preprocess(config: str, overrides: str, data_version: str, image: str, preprocessed: Output[Dataset]) -> None:
    """Validates, enumerates and transforms the node and edge tables into ``preprocessed``.

    ``data_version`` is not read: it is in the task's inputs so that KFP's cache key changes
    when the tables do, since the config only names them. With ``preprocess.engine: beam`` and
    runner dataflow, this task launches a Dataflow job whose workers run ``image``, waits for it,
    and cancels it when the task is stopped.
    """
    from components.preprocess.step import preprocess as run_step
    from components.runtime import pipeline_task

    with pipeline_task.running("preprocess", config, overrides) as resolved:
        pipeline_task.log.info("preprocess: input tables at data version %s", data_version or "(not given)")
        published = run_step(resolved, pipeline_task.artifact_uri(preprocessed), image=image)
        pipeline_task.describe(preprocessed, published)


def preprocess_with_model(
    config: str, overrides: str, data_version: str, image: str, model: Input[Model], preprocessed: Output[Dataset]
) -> None:
    """As ``preprocess``, with the transforms ``model`` was trained with (its transform_state.json)
    instead of fitting new ones: an inference-only run encodes fresh tables exactly as training did."""
    from components.preprocess.output import load_fitted_state
    from components.preprocess.step import preprocess as run_step
    from components.runtime import pipeline_task

    with pipeline_task.running("preprocess", config, overrides) as resolved:
        pipeline_task.log.info("preprocess: input tables at data version %s, transforms of %s", data_version or "(not given)", model.uri)
        state = load_fitted_state(pipeline_task.artifact_uri(model))
        published = run_step(resolved, pipeline_task.artifact_uri(preprocessed), state, image=image)
        pipeline_task.describe(preprocessed, published)
        for key, count in published.manifest.metadata.get("unseen_categories", {}).items():
            preprocessed.metadata[f"unseen_{key}"] = count


def build_with_model_component(image: str) -> PythonComponent:
    """``preprocess_with_model`` in ``image``."""
    return dsl.component(preprocess_with_model, base_image=image, install_kfp_package=False)


def build_component(image: str) -> PythonComponent:
    """The component running in ``image``, which already holds gnnflow and kfp (nothing is installed at run time)."""
    return dsl.component(preprocess, base_image=image, install_kfp_package=False)
