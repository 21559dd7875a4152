"""Before a run's first step: each step is asked, in DAG order, what it would refuse
(:mod:`components.config.preflight`), so that ``gnnflow run``, ``--via kfp-local`` and
``gnnflow submit`` fail before anything is published or sent."""

from __future__ import annotations

from collections.abc import Callable

from components.config.preflight import PlannedRun
from components.export import checks as export_checks
from components.infer import checks as infer_checks
from components.preprocess import checks as preprocess_checks
from components.register import checks as register_checks
from components.train import checks as train_checks

STEP_CHECKS: dict[str, Callable[[PlannedRun], None]] = {
    "preprocess": preprocess_checks.before_run,
    "train": train_checks.before_run,
    "register": register_checks.before_run,  # a no-op unless registry.uri is set
    "infer": infer_checks.before_run,
    "export": export_checks.before_run,  # a no-op unless output.bigquery is set
}


def check_before_run(run: PlannedRun) -> None:
    """Raises the first step's refusal (a GnnflowError naming the key, table or dataset); then
    logs what each multi-worker step needs and refuses a machine type that cannot hold it."""
    for before_run in STEP_CHECKS.values():
        before_run(run)
    from pipelines.sizing_report import check_run_machines  # torch: the sizing model reuses the workers' shm arithmetic

    check_run_machines(run)
