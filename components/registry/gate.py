"""The evaluation gate: whether a newly trained version may take the ``blessed`` alias.

Rule: every gate metric is higher-is-better (``GATE_METRICS``: accuracy, macro-F1, ROC AUC). A
candidate passes when nothing is blessed yet, or when its figure is at least the blessed
version's minus ``max_drop`` (``registry.max_drop``, absolute, in the metric's units; 0 by default:
never worse). A candidate whose figure is not a number (NaN) never passes; neither does one
compared with a blessed version that records no figure for the metric (promote it by hand).
"""

from __future__ import annotations

import math
from typing import Any

from components.errors import GnnflowError
from components.registry.base import GateDecision, ModelVersion

# Figures are compared with this much slack, so that 0.5 - 0.2 >= 0.3 holds in floating point.
_SLACK = 1e-12


def _figure(value: float) -> str:
    return f"{value:.6g}"


def _number(metrics: dict[str, Any], metric: str, whose: str) -> float | None:
    """The metric's value as a float; None when absent; an error when it is not a number."""
    if metric not in metrics:
        return None
    value = metrics[metric]
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise GnnflowError(f"{whose}: metric {metric!r} is {value!r}, not a number")
    return float(value)


def evaluate_gate(
    candidate_metrics: dict[str, Any],
    blessed: ModelVersion | None,
    metric: str,
    max_drop: float,
    *,
    candidate_version: int | None = None,
) -> GateDecision:
    """The gate's decision for a candidate with ``candidate_metrics`` (train's metrics.json)
    against the ``blessed`` version (None: nothing blessed yet); ``candidate_version`` only names
    the candidate in the reason. An error when the candidate lacks ``metric``."""
    name = "the candidate" if candidate_version is None else f"v{candidate_version}"
    candidate = _number(candidate_metrics, metric, name)
    if candidate is None:
        have = ", ".join(sorted(k for k in candidate_metrics if k.startswith("val_"))) or "none"
        raise GnnflowError(f"{name} has no {metric!r} in its metrics (validation metrics there: {have})")

    def decision(passed: bool, reference: float | None, reason: str) -> GateDecision:
        version = None if blessed is None else blessed.version
        return GateDecision(passed, metric, candidate, reference, version, max_drop, reason)

    if math.isnan(candidate):
        return decision(False, None, f"{name} fails the gate: its {metric} is NaN")
    if blessed is None:
        return decision(True, None, f"{name} passes the gate: nothing is blessed yet ({metric} {_figure(candidate)})")
    reference = _number(blessed.metrics, metric, f"blessed {blessed.name}")
    if reference is None or math.isnan(reference):
        return decision(
            False,
            None,
            f"{name} fails the gate: the blessed {blessed.name} records no {metric} to compare with "
            f"(candidate {_figure(candidate)}); promote by hand with gnnflow models promote",
        )
    floor = reference - max_drop
    passed = candidate - floor >= -_SLACK
    verdict = "passes" if passed else "fails"
    relation = ">=" if passed else "<"
    allowance = f" - max_drop {_figure(max_drop)} = {_figure(floor)}" if max_drop else ""
    reason = f"{name} {verdict} the gate: {metric} {_figure(candidate)} {relation} blessed {blessed.name}'s {_figure(reference)}{allowance}"
    return decision(passed, reference, reason)
