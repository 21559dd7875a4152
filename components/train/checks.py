"""What ``train`` refuses before a run's first step (see :mod:`components.config.preflight`)."""

from __future__ import annotations

from components.config.preflight import PlannedRun


def before_run(run: PlannedRun) -> None:
    """On a local run, ``training.device`` against this machine's GPUs (the step checks again
    when it starts, where its workers run; a submitted run's workers run elsewhere)."""
    if run.local:
        from components.gnn.device import check_device  # torch: only where a run is local, not for every `gnnflow submit`

        check_device(run.config.training, local_run=True)
