"""Step ``register``: registers a published train output as the next version of ``registry.uri``,
with its metrics, the run's config, data version and lineage (a fingerprint of each input table),
and moves ``blessed`` to it when it passes the evaluation gate (:mod:`components.registry.gate`).

Input: a published train output (``metrics.json`` and the model files, which the registry copies).
Output: see :mod:`components.register.output`.
"""

from __future__ import annotations

import logging
from dataclasses import asdict, dataclass

from components import storage
from components.config import BLESSED, GnnflowConfig
from components.config.sections import GraphSpec
from components.errors import GnnflowError
from components.register.output import DECISION_FILE, STEP
from components.registry.base import GateDecision, ModelVersion, Registry
from components.registry.gate import evaluate_gate
from components.registry.open import open_registry
from components.tables.reading import tables_fingerprint
from components.train.output import GATE_METRICS, METRICS_FILE, VALIDATION_METRIC
from components.train.output import STEP as TRAIN_STEP

log = logging.getLogger("gnnflow.register")


@dataclass(frozen=True)
class RegisterResult:
    """The registered version, whether it is now blessed, the gate's decision, and the step's output."""

    version: ModelVersion
    blessed: bool
    decision: GateDecision
    published: storage.PublishedOutput


def gate_metric(config: GnnflowConfig) -> str:
    """``registry.metric``, or the task's best-epoch metric; an error when the task does not produce it."""
    task = config.task.type
    metric = config.registry.metric or f"val_{VALIDATION_METRIC[task]}"
    if metric not in GATE_METRICS[task]:
        raise GnnflowError(
            f"registry.metric {metric!r} is not a validation metric that {task} produces: choose one of {', '.join(GATE_METRICS[task])}"
        )
    return metric


def table_lineage(graph: GraphSpec) -> dict[str, str]:
    """Each input table's URI → the fingerprint of its files (or BigQuery table) as they are now."""
    lineage = {}
    for table in graph.nodes:
        lineage[table.uri] = tables_fingerprint(graph.model_copy(update={"nodes": [table], "edges": []}))
    for edges in graph.edges:
        lineage[edges.uri] = tables_fingerprint(graph.model_copy(update={"nodes": [], "edges": [edges]}))
    return lineage


def _blessed(registry: Registry) -> ModelVersion | None:
    return next((v for v in registry.versions() if BLESSED in v.aliases), None)


def _promote(registry: Registry, version: ModelVersion, decision: GateDecision, metric: str, max_drop: float) -> GateDecision:
    """Moves ``blessed`` to ``version``. If another writer moved it after the gate read it, the
    candidate is judged again against the version it displaced, and the alias goes back there
    when that gate fails: the gate always holds against the version actually replaced."""
    change = registry.set_alias(BLESSED, version.version, decision.reason)
    if change.previous == decision.blessed_version or change.previous is None:
        return decision
    displaced = registry.resolve(f"v{change.previous}")
    again = evaluate_gate(version.metrics, displaced, metric, max_drop, candidate_version=version.version)
    log.warning("register: blessed moved to %s while the gate ran; judged again: %s", displaced.name, again.reason)
    if not again.passed:
        registry.set_alias(BLESSED, displaced.version, f"restored: {again.reason}")
    return again


def _promoted_before(version: ModelVersion, blessed: ModelVersion | None, metric: str, max_drop: float) -> GateDecision:
    """The decision for a version that was blessed once already (an earlier try of this task got
    that far): it stands as the registry has it now, with no second judgement that could take
    ``blessed`` back from a version promoted since."""
    now = "nothing" if blessed is None else blessed.name
    return GateDecision(
        passed=blessed is not None and blessed.version == version.version,
        metric=metric,
        candidate=float(version.metrics[metric]),
        blessed=None if blessed is None else blessed.metrics.get(metric),
        blessed_version=None if blessed is None else blessed.version,
        max_drop=max_drop,
        reason=f"{version.name} passed the gate before (this registration was retried); blessed is {now} now",
    )


def register(config: GnnflowConfig, model_uri: storage.Uri | str, output_uri: storage.Uri | str, data_version: str) -> RegisterResult:
    """Registers the published model at ``model_uri`` in ``registry.uri``, gates it, and publishes
    the decision to ``output_uri``."""
    spec = config.registry
    if spec.uri is None:
        raise GnnflowError("register: registry.uri is not set in the config, so there is no registry to register the model in")
    metric = gate_metric(config)
    model = storage.open_published(model_uri, step=TRAIN_STEP)
    metrics = model.read_json(METRICS_FILE)
    if metric not in metrics:  # before anything is written to the registry
        raise GnnflowError(f"{model.root}: {METRICS_FILE} has no {metric!r} (it has {', '.join(sorted(metrics))})")
    registry = open_registry(spec.uri, create=True)
    version = registry.register(
        str(model.root), metrics, data_version=data_version, lineage=table_lineage(config.graph), config_yaml=config.to_yaml()
    )
    blessed = _blessed(registry)
    if any(c.alias == BLESSED and c.version == version.version for c in registry.history()):
        decision = _promoted_before(version, blessed, metric, spec.max_drop)  # a retried task: never gate a version twice
    else:
        decision = evaluate_gate(metrics, blessed, metric, spec.max_drop, candidate_version=version.version)
        if decision.passed:
            decision = _promote(registry, version, decision, metric, spec.max_drop)
    log.info("register: %s of %s: %s%s", version.name, registry.uri, decision.reason, "; now blessed" if decision.passed else "")
    record = {
        "registry": registry.uri,
        "version": version.name,
        "model_uri": version.model_uri,
        "source_model_uri": version.source_model_uri,
        "blessed": decision.passed,
        "decision": asdict(decision),
    }
    with storage.staged_output(output_uri, STEP) as staging:
        staging.write_json(DECISION_FILE, record)
        staging.write_bytes("config.resolved.yaml", config.to_yaml().encode())
        published = staging.publish(
            counts={"version": version.version, "blessed": int(decision.passed)},
            metadata={"registry": registry.uri, "version": version.name, "blessed": decision.passed},
        )
    return RegisterResult(version, decision.passed, decision, published)
