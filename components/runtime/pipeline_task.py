"""What the KFP component functions share when their task runs.

A component function (``components/<step>/component.py``) is thin: it resolves the config
parameter, turns its artifacts into storage URIs, runs the step and describes the published
output on its artifacts. This module holds those pieces, so the six functions read the same way
and stay short enough for KFP to ship as source.

The multi-worker steps (partition, train, infer) run the same function in two places: as a
pipeline task that starts ``world_size`` workers itself (``resources.runner: local``), or on
every replica of a Vertex AI CustomJob that the pipeline was compiled with
(``resources.runner: vertex``, see ``pipelines/vertex_job.py``), where the launcher reads
``CLUSTER_SPEC`` and only the chief publishes and describes the output.
"""

from __future__ import annotations

import contextlib
import logging
import numbers
from collections.abc import Iterator, Mapping
from typing import Any, Protocol

from components import storage
from components.config import GnnflowConfig, resolve_config
from components.errors import GnnflowError
from components.runtime.exit_status import exit_status
from components.runtime.runlog import configure

log = logging.getLogger("gnnflow.pipeline")


class ArtifactLike(Protocol):
    """The part of a KFP artifact (``dsl.Dataset``, ``dsl.Model``, ...) a step needs."""

    name: str
    uri: str
    metadata: dict[str, Any]


class MetricsLike(Protocol):
    def log_metric(self, metric: str, value: float) -> None: ...


@contextlib.contextmanager
def running(step: str, config: str, overrides: str, replicas: int | None = None) -> Iterator[GnnflowConfig]:
    """Resolves the config parameter (YAML text or URI, plus JSON overrides) for one task.

    ``replicas`` (multi-worker steps): how the pipeline was compiled, 0 for workers inside the
    task, N for a CustomJob of N replicas; a run whose config asks for another layout is refused,
    since the layout is fixed at compile time. A :class:`GnnflowError` inside the block ends the
    task with its one-line message and the status ``python -m components.<step>`` exits with
    (:func:`components.runtime.exit_status.exit_status`), instead of a traceback from deep inside
    the executor: 2 for a bad config key or a missing input, 75 for a train preempted by SIGTERM
    (Vertex AI's restart and any scheduler must tell that from a failure that would happen again).
    """
    if not logging.getLogger().handlers:  # KFP's executor has its own root handler; a second would print every line twice
        configure()
    try:
        resolved = resolve_config(config, overrides)
        if replicas is not None:  # a JSON number: 2.0 where a backend passes integers as doubles
            check_compiled_layout(step, resolved, int(replicas))
        log.info(
            "%s: config resolved (task %s, %d worker(s), runner %s)",
            step,
            resolved.task.type,
            resolved.resources.world_size,
            resolved.resources.runner,
        )
        yield resolved
    except GnnflowError as exc:
        status = exit_status(exc)
        log.error("%s failed (exit %d): %s", step, status, exc)
        raise SystemExit(status) from None


def check_compiled_layout(step: str, config: GnnflowConfig, replicas: int) -> None:
    """The run's ``resources`` must ask for what the pipeline was compiled with (``replicas``: 0 for runner local)."""
    resources = config.resources
    compiled = "runner local" if replicas == 0 else f"runner vertex with {replicas} replica(s)"
    wanted = "runner local" if resources.runner == "local" else f"runner vertex with {resources.replica_count} replica(s)"
    if compiled != wanted:
        raise GnnflowError(
            f"{step}: the pipeline was compiled for {compiled}, but the run's config asks for {wanted} "
            f"(resources.world_size {resources.world_size}, processes_per_replica {resources.processes_per_replica}): "
            "the layout is fixed at compile time; compile again with gnnflow compile --config (gnnflow submit without --package does)"
        )


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


def published_here(step: str, published: storage.PublishedOutput | None, replicas: int) -> storage.PublishedOutput | None:
    """The step's published output; None on the replicas of a CustomJob other than the chief.

    On those, the function returns without describing anything: the chief publishes the output
    and writes the task's artifacts (KFP's executor writes the executor output on pool 0 only).
    """
    if published is None and replicas == 0:  # only a cluster replica returns None; a plain task is never one
        raise GnnflowError(f"{step}: ran as a non-leading cluster replica inside a pipeline task; unset CLUSTER_SPEC / RANK")
    if published is None:
        log.info("%s: this replica's workers are done; the chief publishes the output", step)
    return published
