"""The sizing model asked for a whole run: each multi-worker step's prediction, a replica's need,
and the machine that holds it; and the check ``gnnflow run``, ``compile`` and ``submit`` make.

Each step predicts for itself (``components/<step>/sizing.py``); this module only asks them in
turn and compares a replica's need (``resources.processes_per_replica`` workers of the hungriest
step) with a machine of :mod:`pipelines.machine_sizes`.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass

from components import storage
from components.config import GnnflowConfig
from components.config.preflight import PlannedRun
from components.errors import GnnflowError
from components.graph_size import GraphSize, StepPrediction, graph_size_from_schema
from components.infer import sizing as infer_sizing
from components.partition import sizing as partition_sizing
from components.tables.row_counts import graph_size_from_tables, storage_by_type
from components.train import sizing as train_sizing
from pipelines import machine_sizes
from pipelines.machine_sizes import Machine

log = logging.getLogger("gnnflow.plan")
_KEY = "resources.custom_job.machine_type"
GiB = 2**30
# Before a run, a CSV file above this many bytes is counted from a sample (gnnflow plan counts every row).
PREFLIGHT_EXACT_UP_TO = 64 << 20
_SCHEMA_FILES = {"preprocess": "graph_schema.json", "serialize": "graph_metadata.json"}


@dataclass(frozen=True)
class ReplicaPlan:
    """Every multi-worker step at one world size, and what a replica of them needs.

    need_gib: a replica's workers together at the hungriest step's peak. machine: the machine
    checked (the one given, else None). recommended: the smallest that holds ``need_gib`` with
    :data:`~pipelines.machine_sizes.MARGIN` (None if none in the table does).
    """

    world_size: int
    processes_per_replica: int
    steps: dict[str, StepPrediction]
    need_gib: float
    machine: Machine | None
    recommended: Machine | None

    @property
    def hungriest(self) -> StepPrediction:
        return max(self.steps.values(), key=lambda p: p.peak_rss_mib_per_worker)

    def as_json(self) -> dict:
        return {
            "world_size": self.world_size,
            "steps": {name: p.as_json() for name, p in self.steps.items()},
            "machine_type": self.recommended.name if self.recommended else None,
        }


def read_graph_size(config: GnnflowConfig, preprocessed: str | None = None, exact_up_to: int | None = None) -> GraphSize:
    """The graph's size: from a published preprocess or serialize output when given, else
    counted from the configured tables."""
    if preprocessed is None:
        return graph_size_from_tables(config, exact_up_to)
    output = storage.open_published(preprocessed)
    schema_file = _SCHEMA_FILES.get(output.manifest.step)
    if schema_file is None:
        raise GnnflowError(
            f"--preprocessed {preprocessed} holds the output of step {output.manifest.step!r}: give a preprocess or serialize output"
        )
    from components.schema import GraphSchema

    schema = GraphSchema.from_json(output.read_bytes(schema_file).decode(), str(output.uri(schema_file)))
    return graph_size_from_schema(schema, storage_by_type(config))


def plan_replicas(graph: GraphSize, config: GnnflowConfig, world_size: int, machine_type: str | None = None) -> ReplicaPlan:
    """Each multi-worker step at ``world_size`` workers, ``resources.processes_per_replica`` to a
    machine; the epoch time with the vCPUs of ``machine_type`` shared by its workers (one core
    each when no machine is named)."""
    processes = min(config.resources.processes_per_replica, world_size)
    machine = machine_sizes.machine(machine_type) if machine_type else None
    cores = machine.vcpus / processes if machine else 1.0
    steps = {
        "partition": partition_sizing.predict(graph, world_size, config.partition),
        "train": train_sizing.predict(graph, world_size, config, cores),
        "infer": infer_sizing.predict(graph, world_size, config),
    }
    need = processes * max(p.peak_rss_mib_per_worker for p in steps.values()) / 1024
    series = machine.series if machine else (machine_type.rsplit("-", 1)[0] if machine_type else None)
    recommended = machine_sizes.smallest_fitting(need, processes, series)
    return ReplicaPlan(world_size, processes, steps, need, machine, recommended)


def summary_line(plan: ReplicaPlan) -> str:
    """One line: the peak per worker of each step, /dev/shm, and the train epoch."""
    peaks = ", ".join(f"{name} {p.peak_rss_mib_per_worker / 1024:.2f}" for name, p in plan.steps.items())
    shm = max(p.shm_mib_per_worker for p in plan.steps.values()) / 1024
    epoch = plan.steps["train"].epoch_s
    return f"sizing at {plan.world_size} worker(s): peak GiB per worker {peaks}; /dev/shm {shm:.2f} GiB per worker; epoch ~{epoch:.0f} s"


def refusal(plan: ReplicaPlan) -> str | None:
    """The one-line error when the replica's machine cannot hold its workers, else None."""
    machine = plan.machine
    if machine is None or machine.memory_gib >= plan.need_gib:
        return None
    step = plan.hungriest
    better = f"; {plan.recommended.name} holds it" if plan.recommended else ""
    return (
        f"{_KEY} {machine.name} ({machine.memory_gib:g} GiB) cannot hold a replica's {step.step} workers: predicted "
        f"{plan.need_gib:.1f} GiB ({plan.processes_per_replica} worker(s) x {step.peak_rss_mib_per_worker / 1024:.2f} GiB peak; "
        f"`gnnflow plan` shows the terms){better}"
    )


def check_run_machines(run: PlannedRun) -> ReplicaPlan | None:
    """Logs the prediction for the run's machines; refuses (GnnflowError) a CustomJob machine type
    that cannot hold a replica's workers; on a local run warns when this machine clearly cannot
    hold the workers (they all run here). Tables it cannot read are the steps' to report: the
    sizing is then skipped with a warning."""
    config = run.config
    try:
        graph = read_graph_size(config, exact_up_to=PREFLIGHT_EXACT_UP_TO)
    except GnnflowError as exc:
        log.warning("sizing skipped: %s", exc)
        return None
    resources = config.resources
    vertex = not run.local and resources.runner == "vertex"
    plan = plan_replicas(graph, config, resources.world_size, resources.custom_job.machine_type if vertex else None)
    log.info("%s", summary_line(plan))
    if vertex:
        if (message := refusal(plan)) is not None:
            raise GnnflowError(message)
        if plan.machine is not None and not machine_sizes.holds(plan.machine, plan.need_gib, plan.processes_per_replica):
            log.warning(
                "%s %s holds %.1f GiB per replica with less than the %.0f%% margin",
                _KEY,
                plan.machine.name,
                plan.need_gib,
                (machine_sizes.MARGIN - 1) * 100,
            )
    elif run.local:
        here = _machine_memory_gib()
        need = resources.world_size * plan.hungriest.peak_rss_mib_per_worker / 1024
        if here is not None and need > here:
            log.warning(
                "this machine has %.1f GiB, the %d workers of %s are predicted to need %.1f GiB together: expect to run out of memory",
                here,
                resources.world_size,
                plan.hungriest.step,
                need,
            )
    return plan


def _machine_memory_gib() -> float | None:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / GiB
    except (ValueError, OSError):
        return None


def check_compile_machines(config_uri: str) -> ReplicaPlan | None:
    """:func:`check_run_machines` for ``gnnflow compile --config``: a config that holds only the
    ``resources`` section (all that compile needs) has no graph to size, and is let through."""
    import yaml

    from components.config import load_config

    raw = yaml.safe_load(storage.read_text(config_uri))
    if not isinstance(raw, dict) or "graph" not in raw:
        log.info("sizing skipped: %s has no graph section", config_uri)
        return None
    try:
        config = load_config(config_uri)
    except GnnflowError as error:  # compile reads only resources, registry and export: the rest may be a sketch
        log.info("sizing skipped: %s is not a whole run config (%s)", config_uri, str(error).splitlines()[-1].strip())
        return None
    return check_run_machines(PlannedRun(config, local=False))
