"""The KFP component that turns an inference-only pipeline's ``model`` parameter (a published
model URI, or ``REGISTRY@blessed`` / ``REGISTRY@vN``) into the Model artifact later tasks read.

It resolves at run time, not at compile time: a scheduled daily embedding run picks up whichever
version is blessed that day. The artifact's URI is set to the resolved model folder (no copy):
KFP records it as the task's output, and downstream tasks receive that URI."""

from kfp import dsl
from kfp.dsl import Model, Output
from kfp.dsl.python_component import PythonComponent


def resolve_model(config: str, overrides: str, model_reference: str, model: Output[Model]) -> None:
    """Points ``model`` at the published model ``model_reference`` names (checked: published by train)."""
    from components.registry.open import resolve_model_reference
    from components.runtime import pipeline_task
    from components.storage import open_published
    from components.train.output import STEP as TRAIN_STEP

    with pipeline_task.running("resolve-model", config, overrides):
        resolved = resolve_model_reference(model_reference)
        published = open_published(resolved, step=TRAIN_STEP)
        model.uri = str(published.root)
        pipeline_task.describe(model, published)
        model.metadata["reference"] = model_reference
        pipeline_task.log.info("resolve-model: %s is %s (generation %s)", model_reference, resolved, published.manifest.generation)


def build_component(image: str) -> PythonComponent:
    """The component running in ``image``, which already holds gnnflow and kfp (nothing is installed at run time)."""
    return dsl.component(resolve_model, base_image=image, install_kfp_package=False)
