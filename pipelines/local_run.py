"""``gnnflow run``: the DAG's six steps in order on this machine, each output under one run root
(and a seventh, export, when ``output.bigquery`` or ``output.vector_search`` is set).

With ``registry.uri`` set, a ``register`` step follows train: it registers the model and moves
``blessed`` when the evaluation gate passes; infer, report and export then run only for a
blessed model (unless ``registry.downstream: always``). With ``--from-model MODEL`` (a published
model or ``REGISTRY@blessed``) the run is inference-only: preprocess (with the model's fitted
transforms), serialize, partition, infer, report (and export); no training.

The same step functions the KFP components call run here directly (``--via kfp-local`` runs
them through ``kfp.local`` instead, see :mod:`pipelines.kfp_local`). A step whose published
output still matches its inputs and the parts of the config it reads is skipped: every run
records, in ``<root>/run_state.json``, each step's fingerprint (a hash of those config
sections, the versions of its inputs and its options) next to the generation it published.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import logging
import pathlib
from collections.abc import Callable, Collection
from dataclasses import dataclass, field

from components import storage
from components.config import GnnflowConfig, apply_overrides, load_config
from components.config.preflight import PlannedRun
from components.demo.graph import generate_demo_graph, write_demo_graph
from components.errors import GnnflowError
from components.export.step import export
from components.infer.output import resolved_mode
from components.infer.step import infer
from components.partition.step import partition
from components.preprocess.output import load_fitted_state
from components.preprocess.step import preprocess
from components.register.output import DECISION_FILE
from components.register.output import STEP as REGISTER_STEP
from components.register.step import register
from components.registry.open import resolve_model_reference
from components.report.step import report
from components.serialize.step import serialize
from components.tables.proposal import propose_config, render
from components.tables.reading import tables_fingerprint
from components.train.step import train
from pipelines.preflight import check_before_run

log = logging.getLogger("gnnflow.run")

DEMO_NODES = 10_000
# Two workers, so the demo exercises distributed partitioning, training and inference like a real run.
DEMO_OVERRIDES: dict[str, object] = {"resources.world_size": 2}
# Sampled training learns the demo graph within few epochs (many batches each); full-graph training
# keeps the proposal's epochs, one optimizer step each.
DEMO_SAMPLED_OVERRIDES: dict[str, object] = {"training.epochs": 15, "training.early_stopping_patience": 5}
STATE_FILE = "run_state.json"


@dataclass(frozen=True)
class RunOutputs:
    """Where each step of a local run publishes its output."""

    root: storage.Uri
    preprocessed: storage.Uri
    tfrecords: storage.Uri
    partitions: storage.Uri
    model: storage.Uri
    embeddings: storage.Uri
    report: storage.Uri
    export: storage.Uri  # only written when the config exports (output.bigquery, output.vector_search)
    register: storage.Uri  # only written when the config registers models (registry.uri)
    trained: bool = True  # False: an inference-only run, whose model is another run's

    @staticmethod
    def under(root: storage.Uri, model: storage.Uri | None = None) -> RunOutputs:
        """The outputs under ``root``; with ``model``, an inference-only run's (the model is read, not written)."""
        j = root.join
        return RunOutputs(
            root, j("preprocessed"), j("tfrecords"), j("partitions"), model or j("model"), j("embeddings"), j("report"), j("export"),
            j("register"), trained=model is None,
        )  # fmt: skip


@dataclass(frozen=True)
class RunResult:
    outputs: RunOutputs
    metrics: dict[str, object]  # the report's final metrics (train's, when the gate held infer back)
    ran: list[str] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)
    held_back: str | None = None  # why infer, report and export did not run (a model the gate refused)

    @property
    def report_html(self) -> storage.Uri | None:
        if self.held_back is not None:
            return None
        published = storage.open_published(self.outputs.report)
        return published.uri("report.html")


@dataclass(frozen=True)
class _PlannedStep:
    name: str
    output: storage.Uri
    inputs: tuple[storage.Uri, ...]  # published outputs of upstream steps
    reads: dict[str, object]  # the config (and options) this step's output depends on
    run: Callable[[], object]


def new_run_root(base: str = "runs") -> storage.Uri:
    return storage.parse_uri(base).join(dt.datetime.now().strftime("%Y%m%d-%H%M%S"))


def demo_config(root: storage.Uri, num_nodes: int = DEMO_NODES) -> GnnflowConfig:
    """Writes the bundled demo graph under ``root/demo_data`` and a starter config for it."""
    data = root.join("demo_data")
    if not isinstance(data, storage.LocalUri):
        raise GnnflowError("the demo data is generated on this machine: give a local --output, or a --config for gs:// runs")
    nodes_path, edges_path = write_demo_graph(generate_demo_graph(num_nodes), pathlib.Path(data.path))
    config = propose_config(
        str(nodes_path),
        str(edges_path),
        id_column="node_id",
        src_column="src",
        dst_column="dst",
        label_column="label",
        node_type="paper",
        relation="cites",
        output_root=str(root),
    )
    demo = DEMO_OVERRIDES | (DEMO_SAMPLED_OVERRIDES if config.training.mode == "sampled" else {})
    config = apply_overrides(config, demo, "the demo settings")
    storage.write_text(root.join("config.yaml"), render(config, "the bundled demo graph"))
    log.info("demo graph: %d nodes → %s; config → %s", num_nodes, data, root.join("config.yaml"))
    return config


def plan(config: GnnflowConfig, outputs: RunOutputs, infer_mode: str = "auto") -> list[_PlannedStep]:
    """The steps in DAG order, with what each one's output depends on: the six (with register after
    train when ``registry.uri`` is set, export when configured); an inference-only run's
    (``outputs.trained`` False) have no train or register, and preprocess reuses the model's
    fitted transforms."""
    c, o = config, outputs
    infer_mode = resolved_mode(infer_mode, c.training.mode)  # auto and the mode it means are one output
    sections = lambda *names: {n: getattr(c, n).model_dump(mode="json") for n in names}  # noqa: E731
    world = {"world_size": c.resources.world_size}
    tables = {"tables": tables_fingerprint(c.graph)}
    fitted_by = (o.model,) if not o.trained else ()  # its generation keys preprocess: a new model re-encodes the tables
    exported = [_PlannedStep("export", o.export, (o.embeddings,), sections("output"), lambda: export(c, o.embeddings, o.export))]
    trained = [
        _PlannedStep(
            "train", o.model, (o.partitions,), {**sections("task", "model", "training"), **world}, lambda: train(c, o.partitions, o.model)
        ),
    ]
    if c.registry.uri is not None:
        trained.append(
            _PlannedStep(
                "register",
                o.register,
                (o.model,),
                {**sections("registry"), **tables},
                lambda: register(c, o.model, o.register, data_version=str(tables["tables"])),
            )
        )
    return [
        _PlannedStep(
            "preprocess",
            o.preprocessed,
            fitted_by,
            {**sections("graph", "task", "preprocess"), **tables},
            lambda: preprocess(c, o.preprocessed, load_fitted_state(o.model) if fitted_by else None),
        ),
        _PlannedStep("serialize", o.tfrecords, (o.preprocessed,), sections("serialize"), lambda: serialize(c, o.preprocessed, o.tfrecords)),
        _PlannedStep(
            "partition",
            o.partitions,
            (o.tfrecords,),
            {**sections("partition"), **world},
            lambda: partition(
                o.tfrecords,
                o.partitions,
                c.partition,
                c.resources.world_size,
                c.resources.processes_per_replica,
                c.resources.worker_timeouts,
                c.resources.threads,
            ),
        ),
        *(trained if o.trained else []),
        _PlannedStep(
            "infer",
            o.embeddings,
            (o.partitions, o.model),
            {**sections("model", "training"), "mode": infer_mode},
            lambda: infer(c, o.partitions, o.model, o.embeddings, mode=infer_mode),
        ),
        _PlannedStep(
            "report",
            o.report,
            (o.model, o.embeddings),
            {"config": c.model_dump(mode="json")},
            lambda: report(c, o.model, o.embeddings, o.report),
        ),
        *(exported if c.output.exports else []),
    ]


def _fingerprint(step: _PlannedStep) -> str:
    upstream = [storage.open_published(uri).manifest.generation for uri in step.inputs]
    text = json.dumps({"step": step.name, "reads": step.reads, "inputs": upstream}, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


class _RunState:
    """``run_state.json``: per step, the fingerprint and the generation it published."""

    def __init__(self, root: storage.Uri) -> None:
        self.uri = root.join(STATE_FILE)
        self.steps: dict[str, dict[str, str]] = {}
        if storage.exists(self.uri):
            try:
                self.steps = json.loads(storage.read_text(self.uri))["steps"]
            except (ValueError, KeyError, TypeError):
                log.warning("%s is unreadable: every step runs again", self.uri)

    def up_to_date(self, step: _PlannedStep, fingerprint: str) -> bool:
        recorded = self.steps.get(step.name)
        if recorded is None or recorded.get("fingerprint") != fingerprint:
            return False
        try:  # the output must still be the one this run published, not replaced or removed since
            return storage.open_published(step.output, step=step.name).manifest.generation == recorded.get("generation")
        except GnnflowError:
            return False

    def record(self, step: _PlannedStep, fingerprint: str) -> None:
        generation = storage.open_published(step.output, step=step.name).manifest.generation
        self.steps[step.name] = {"fingerprint": fingerprint, "generation": generation}
        storage.write_text(self.uri, json.dumps({"steps": self.steps}, indent=2, sort_keys=True))


def run_pipeline(
    config: GnnflowConfig,
    root: storage.Uri,
    infer_mode: str = "auto",
    force: bool = False,
    model: storage.Uri | None = None,
    overridden: tuple[str, ...] = (),
) -> RunResult:
    """Runs (or skips, when up to date) each step under ``root``; returns where outputs went.
    ``model``: an inference-only run with this published model (resolved from ``--from-model``)."""
    # bq:// columns, a GPU this machine lacks, exact inference, the export dataset, the gate's
    # metric, a model whose transforms cannot encode the tables: before preprocess starts
    check_before_run(PlannedRun(config, infer_mode, local=True, model=str(model) if model else None, overridden=overridden))
    outputs = RunOutputs.under(root, model)
    storage.write_text(root.join("config.resolved.yaml"), config.to_yaml())
    ran, skipped, held_back = run_steps(config, root, STEP_NAMES, infer_mode, force, model)
    if held_back is not None:
        metrics = storage.open_published(outputs.model).read_json("metrics.json")
        return RunResult(outputs, metrics, ran, skipped, held_back)
    metrics = storage.open_published(outputs.report).read_json("metrics.json")
    return RunResult(outputs, metrics, ran, skipped)


STEP_NAMES = ("preprocess", "serialize", "partition", "train", "register", "infer", "report", "export")  # register, export: when configured
GATED_STEPS = ("infer", "report", "export")  # run only for a blessed model when the config gates (registry.downstream: blessed)


def run_steps(
    config: GnnflowConfig,
    root: storage.Uri,
    names: Collection[str],
    infer_mode: str = "auto",
    force: bool = False,
    model: storage.Uri | None = None,
) -> tuple[list[str], list[str], str | None]:
    """Runs (or skips, when up to date) the steps in ``names`` under ``root``, in DAG order; returns
    (ran, skipped, held back: why the gate stopped the run before infer, or None). ``gnnflow tune``
    runs the data steps this way, once for all its trials."""
    state = _RunState(root)
    ran: list[str] = []
    skipped: list[str] = []
    outputs = RunOutputs.under(root, model)
    for step in plan(config, outputs, infer_mode):
        if step.name not in names:
            continue
        if step.name in GATED_STEPS and config.registry.downstream == "blessed" and (refused := _gate_refused(config, outputs)):
            log.warning("%s; %s skipped (registry.downstream: blessed)", refused, ", ".join(n for n in GATED_STEPS if n in names))
            return ran, skipped, refused
        fingerprint = _fingerprint(step)
        if not force and state.up_to_date(step, fingerprint):
            log.info("%s: skipped, %s is up to date with its inputs and config", step.name, step.output)
            skipped.append(step.name)
            continue
        log.info("==> %s → %s", step.name, step.output)
        step.run()
        state.record(step, fingerprint)
        ran.append(step.name)
    return ran, skipped, None


def _gate_refused(config: GnnflowConfig, outputs: RunOutputs) -> str | None:
    """The gate's reason when this run registered a model that it did not bless; else None."""
    if not outputs.trained or config.registry.uri is None:
        return None
    decision = storage.open_published(outputs.register, step=REGISTER_STEP).read_json(DECISION_FILE)
    return None if decision["blessed"] else f"model {decision['version']} not blessed: {decision['decision']['reason']}"


def run(
    config_uri: str | None,
    output: str | None,
    overrides: dict[str, object] | None = None,
    infer_mode: str = "auto",
    force: bool = False,
    from_model: str | None = None,
) -> RunResult:
    """With no config, the demo into ``runs/<timestamp>``; else the config into ``output``.
    ``from_model``: a published model URI or ``REGISTRY@blessed`` / ``@vN``: an inference-only run."""
    model = storage.parse_uri(resolve_model_reference(from_model)) if from_model else None
    if config_uri is None:
        root = storage.parse_uri(output) if output else new_run_root()
        config = demo_config(root)
    else:
        config = load_config(config_uri)
        root = storage.parse_uri(output) if output else new_run_root(config.output.root)
    if overrides:
        config = apply_overrides(config, overrides, "--set")
    log.info("run root: %s%s", root, f" (inference-only, model {model})" if model else "")
    return run_pipeline(config, root, infer_mode, force, model, tuple(overrides or {}))


def summary(result: RunResult) -> str:
    """What a user reads at the end of a run: where each output went and the final metrics."""
    o = result.outputs
    lines = [f"run root: {o.root}" + ("" if o.trained else " (inference-only)")]
    made_by = {"register": "register", "embeddings": "infer", "report": "report", "export": "export"}  # output → its step
    for name in ("preprocessed", "tfrecords", "partitions", "model", "register", "embeddings", "report", "export"):
        if name not in made_by or made_by[name] in result.ran + result.skipped:
            lines.append(f"  {name:<12} {getattr(o, name)}")
    if result.skipped:
        lines.append(f"skipped (up to date): {', '.join(result.skipped)}")
    if result.held_back is not None:
        lines.append(f"held back: {result.held_back}; the model's metrics: {o.model.join('metrics.json')}")
        return "\n".join(lines + metric_lines(result.metrics))
    lines.append(f"report: {result.report_html}")
    lines.append(f"metrics: {o.report.join('metrics.json')}")
    return "\n".join(lines + metric_lines(result.metrics))


def metric_lines(metrics: dict[str, object]) -> list[str]:
    """One aligned line per metric; counts and epochs (whole numbers) without decimals."""

    def shown(value: object) -> str:
        if isinstance(value, float):
            return f"{value:.0f}" if value.is_integer() else f"{value:.4f}"
        return str(value)

    return [f"  {key:<24} {shown(value)}" for key, value in sorted(metrics.items())]
