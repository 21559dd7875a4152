"""What ``register`` refuses before a run's first step (see :mod:`components.config.preflight`)."""

from __future__ import annotations

from components.config.preflight import PlannedRun
from components.register.step import gate_metric
from components.registry.open import check_registry_location


def before_run(run: PlannedRun) -> None:
    """With ``registry.uri`` set: the gate metric is one the task produces, and the registry
    exists or can be created there (a gs:// bucket that does not exist is refused)."""
    uri = run.config.registry.uri
    if uri is None or run.model is not None:  # an inference-only run registers nothing
        return
    gate_metric(run.config)
    check_registry_location(uri)
