"""What ``preprocess`` refuses before a run's first step (see :mod:`components.config.preflight`)."""

from __future__ import annotations

from components.config.preflight import PlannedRun
from components.errors import GnnflowError
from components.preprocess.output import load_fitted_state
from components.preprocess.step import check_fitted_state
from components.tables.bigquery_tables import check_bigquery_inputs


def before_run(run: PlannedRun) -> None:
    """``bq://`` tables' columns, types and row filters (reads no row); for an inference-only
    run, that the model's fitted transforms can encode the configured feature columns."""
    check_bigquery_inputs(run.config)
    if run.model is not None:
        try:
            state = load_fitted_state(run.model)
        except GnnflowError as exc:
            raise GnnflowError(f"the model to infer with: {exc}") from None
        check_fitted_state(run.config, state)
