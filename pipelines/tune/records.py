"""What a study's trials came to, wherever they ran (Optuna here, a Vertex AI hyperparameter-tuning
job there), and the choice of the best one: the records :mod:`pipelines.tune.results` publishes."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from components import storage
from components.config import GnnflowConfig, apply_overrides
from components.errors import GnnflowError
from pipelines.tune.space import SearchSpace


@dataclass(frozen=True)
class TrialRecord:
    """One trial as the study saw it: validation figures only."""

    number: int
    params: dict[str, Any]
    metric: float | None  # the objective (None unless state is COMPLETE)
    epochs_run: int | None
    seconds: float
    state: str  # COMPLETE or FAIL
    error: str = ""
    seed_metrics: tuple[float, ...] = ()  # each repeat's metric, in seed order (their mean is metric)


@dataclass(frozen=True)
class TuneResult:
    output: storage.Uri
    metric: str  # e.g. val_accuracy
    space: SearchSpace
    trials: list[TrialRecord]
    best: TrialRecord
    best_config: GnnflowConfig
    data_ran: list[str]
    data_skipped: list[str]


def best_trial(base: GnnflowConfig, records: list[TrialRecord]) -> tuple[TrialRecord, GnnflowConfig]:
    """The complete trial of the highest metric (ties: the earlier one) and ``base`` with its parameters."""
    complete = [r for r in records if r.state == "COMPLETE" and r.metric is not None]
    if not complete:
        first = f"; trial {records[0].number}: {records[0].error}" if records else ""
        raise GnnflowError(f"every one of the {len(records)} trial(s) failed{first}")
    best = max(complete, key=lambda r: (r.metric, -r.number))
    return best, apply_overrides(base, best.params, f"the best trial ({best.number})")
