"""What ``preprocess`` refuses before a run's first step (see :mod:`components.config.preflight`)."""

from __future__ import annotations

from components.config.preflight import PlannedRun
from components.tables.bigquery_tables import check_bigquery_inputs


def before_run(run: PlannedRun) -> None:
    """``bq://`` tables' columns, types and row filters (reads no row)."""
    check_bigquery_inputs(run.config)
