"""What ``export`` refuses before a run's first step (see :mod:`components.config.preflight`)."""

from __future__ import annotations

from components.config.preflight import PlannedRun
from components.export.step import check_export_destination


def before_run(run: PlannedRun) -> None:
    """The configured BigQuery dataset exists (its tables are checked by the step)."""
    check_export_destination(run.config)
