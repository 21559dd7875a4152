"""What the KFP component functions share when their task runs.

A component function (``components/<step>/component.py``) is thin: it resolves the config
parameter, turns its artifacts into storage URIs, runs the step (here, or as a Vertex AI
CustomJob for the multi-worker steps when ``resources.runner`` is vertex) and describes the
published output on its artifacts. This module holds those pieces, so the six functions read
the same way and stay short enough for KFP to ship as source.
"""

from __future__ import annotations

import contextlib
import logging
import numbers
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any, Protocol

from components import storage
from components.config import GnnflowConfig, resolve_config
from components.errors import GnnflowError
from components.runlog import configure

log = logging.getLogger("gnnflow.pipeline")

EXIT_USER_ERROR = 2  # as components.entrypoint.run_cli: a GnnflowError is one line and exit 2


class ArtifactLike(Protocol):
    """The part of a KFP artifact (``dsl.Dataset``, ``dsl.Model``, ...) a step needs."""

    name: str
    uri: str
    metadata: dict[str, Any]


class MetricsLike(Protocol):
    def log_metric(self, metric: str, value: float) -> None: ...


@contextlib.contextmanager
def running(step: str, config: str, overrides: str) -> Iterator[GnnflowConfig]:
    """Resolves the config parameter (YAML text or URI, plus JSON overrides) for one task.

    A :class:`GnnflowError` inside the block (a bad config key, a missing input, a failed
    CustomJob) ends the task with its one-line message and exit code 2, as ``python -m
    components.<step>`` does, instead of a traceback from deep inside the executor.
    """
    if not logging.getLogger().handlers:  # KFP's executor has its own root handler; a second would print every line twice
        configure()
    try:
        resolved = resolve_config(config, overrides)
        log.info("%s: config resolved (task %s, %d worker(s), runner %s)", step, resolved.task.type,
                 resolved.resources.world_size, resolved.resources.runner)
        yield resolved
    except GnnflowError as exc:
        log.error("%s failed: %s", step, exc)
        raise SystemExit(EXIT_USER_ERROR) from None


def artifact_uri(artifact: ArtifactLike) -> storage.Uri:
    """The storage URI of an artifact: ``gs://`` on Vertex AI, a local path under ``kfp.local``."""
    try:
        return storage.parse_uri(artifact.uri)
    except GnnflowError as exc:
        raise GnnflowError(f"artifact {artifact.name!r} has a URI gnnflow cannot write ({artifact.uri!r}): {exc}") from None


def describe(artifact: ArtifactLike, published: storage.PublishedOutput) -> None:
    """Puts the published output's generation and counts on the artifact, where pipeline UIs show them."""
    artifact.metadata["generation"] = published.manifest.generation
    artifact.metadata["files"] = len(published.manifest.files)
    for key, value in published.manifest.counts.items():
        artifact.metadata[f"count_{key}"] = value


def log_metrics(metrics: MetricsLike, values: Mapping[str, object]) -> dict[str, float]:
    """Logs the numeric entries of ``values`` on a KFP Metrics artifact; returns what it logged."""
    logged = {k: float(v) for k, v in values.items() if isinstance(v, numbers.Real) and not isinstance(v, bool)}
    for key, value in sorted(logged.items()):
        metrics.log_metric(key, value)
    return logged


def run_multi_worker(
    config: GnnflowConfig,
    step: str,
    image: str,
    arguments: Sequence[str],
    output: storage.Uri,
    run_here: Callable[[], storage.PublishedOutput | None],
) -> storage.PublishedOutput:
    """Runs a multi-worker step where ``resources.runner`` says, and returns its published output.

    local: ``run_here()`` spawns ``world_size`` worker processes inside this task.
    vertex: one CustomJob runs ``python -m components.<step> --config-yaml <resolved config>
    <arguments>`` on every replica of ``image``; its chief publishes ``output``, read back here.
    """
    if config.resources.runner == "local":
        published = run_here()
        if published is None:  # only a replica of a cluster job returns None; a task is never one
            raise GnnflowError(f"{step}: ran as a non-leading cluster replica inside a pipeline task; unset CLUSTER_SPEC / RANK")
        return published
    from components.custom_job import StepJob, run_step_job

    if not isinstance(output, storage.GcsUri):
        raise GnnflowError(
            f"{step}: resources.runner is vertex, but the step's output {output} is not on gs://; "
            "a CustomJob's replicas can only reach gs:// (run the pipeline on Vertex AI, or set resources.runner: local)"
        )
    job = StepJob(step=step, image=image, arguments=tuple(arguments), output=output)
    run_step_job(job, config)
    return storage.open_published(output, step=step)
