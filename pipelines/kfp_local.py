"""``gnnflow run --via kfp-local`` / ``--via kfp-docker``: the compiled DAG, run on this machine by ``kfp.local``.

This runs exactly what Vertex AI would, the same pipeline function, components and typed
artifacts. With ``kfp-local``, ``kfp.local``'s SubprocessRunner executes each task in this
Python environment (nothing installed, no container); with ``kfp-docker``, its DockerRunner runs
each task in a container of the step image (``--image``), as the image's own user, through
a Docker API (``DOCKER_HOST``: Docker, or podman's ``podman system service``), with the run root
bind-mounted at the same path. Each artifact lands where ``kfp.local`` puts it:
``<root>/gnnflow-<timestamp>/<task>/<output>``; the URIs come back from the pipeline's outputs
rather than from that layout. Multi-worker steps spawn their workers inside their task, as
with ``resources.runner: local`` on a cluster.
"""

from __future__ import annotations

import json
import logging
import pathlib
import warnings
from dataclasses import dataclass
from typing import Any

from components import storage
from components.config import GnnflowConfig, load_config, resolve_config
from components.config.preflight import PlannedRun
from components.errors import GnnflowError
from components.infer.output import MODES
from components.registry.open import resolve_model_reference
from components.tables.reading import tables_fingerprint
from pipelines.local_run import metric_lines
from pipelines.preflight import check_before_run

log = logging.getLogger("gnnflow.kfp_local")

# kfp.local warns when an image name lacks "python"; the SubprocessRunner never uses the image.
_IMAGE_WARNING = "You may be attemping to run a task that uses custom or non-Python base image"
# DockerRunner: multi-worker steps share tensors through /dev/shm (64 MB by default in a container).
_DOCKER_RUN_ARGS: dict[str, Any] = {"shm_size": "2g"}


@dataclass(frozen=True)
class KfpLocalRun:
    """Where a ``kfp.local`` run put each pipeline output, and the final metrics."""

    root: storage.LocalUri
    outputs: dict[str, str]  # pipeline output name (preprocessed, ..., report_html) → artifact URI
    metrics: dict[str, Any]  # the report's metrics.json
    metadata: dict[str, dict[str, Any]]  # pipeline output name → the artifact's metadata (logged metrics, counts)
    held_back: bool = False  # the gate did not bless the model: infer, report and export did not run

    @property
    def report_html(self) -> str:
        return self.outputs.get("report_html", "(none)")


def check_runnable(config: GnnflowConfig, infer_mode: str, model: str | None = None, overridden: tuple[str, ...] = ()) -> None:
    """What would fail inside a task but can be known before any task starts."""
    if infer_mode not in MODES:
        raise GnnflowError(f"unknown inference mode {infer_mode!r}: choose one of {', '.join(MODES)}")
    check_before_run(PlannedRun(config, infer_mode, local=True, model=model, overridden=overridden))  # every task runs on this machine
    if config.resources.runner != "local":
        raise GnnflowError(
            f"resources.runner is {config.resources.runner!r}, but kfp.local keeps every artifact on this machine, "
            "where a Vertex AI CustomJob cannot reach it: set resources.runner: local for --via kfp-local"
        )


def run_via_kfp_local(
    config_text: str,
    overrides: dict[str, object],
    root: storage.LocalUri,
    infer_mode: str = "auto",
    image: str | None = None,
    from_model: str | None = None,
) -> KfpLocalRun:
    """Runs the pipeline through ``kfp.local`` with its artifacts under ``root``: each task in
    this environment, or, with ``image``, in a container of that image (DockerRunner).

    ``config_text`` is the pipeline's ``config`` parameter: YAML text (relative table paths
    resolve against the working directory, so pass ``GnnflowConfig.to_yaml()`` of a loaded
    config) or a URI. The config and overrides are validated here first, so a bad key is an
    error naming it before any task or worker starts.
    """
    import kfp.local

    from pipelines.dag import DEFAULT_IMAGE, build_pipeline

    if not isinstance(root, storage.LocalUri):
        raise GnnflowError(f"kfp.local writes its artifacts on this machine: the run root must be a local folder, not {root}")
    config = resolve_config(config_text, overrides)
    model = resolve_model_reference(from_model) if from_model else None
    check_runnable(config, infer_mode, model, tuple(overrides))
    data_version = tables_fingerprint(config.graph)
    storage.write_text(root.join("config.resolved.yaml"), config.to_yaml())
    log.info(
        "kfp.local: running pipeline gnnflow under %s (data version %s, %d worker(s))", root, data_version, config.resources.world_size
    )

    if image:
        # The tasks write into the bind-mounted root as the image's own user (uid 1000, group 0),
        # as on Vertex AI, whoever owns the root on this machine.
        pathlib.Path(root.path).chmod(0o777)
        runner: Any = kfp.local.DockerRunner(**_DOCKER_RUN_ARGS)
    else:
        runner = kfp.local.SubprocessRunner(use_venv=False)
    kfp.local.init(runner=runner, pipeline_root=root.path, raise_on_error=True)
    pipeline = build_pipeline(image or DEFAULT_IMAGE, export=config.output.exports, registry=config.registry, from_model=bool(from_model))
    parameters = {"config": config_text, "overrides": json.dumps(overrides), "data_version": data_version, "infer_mode": infer_mode}
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=_IMAGE_WARNING)
        try:
            task: Any = pipeline(**parameters, **({"model": from_model} if from_model else {}))
        except RuntimeError as exc:  # kfp.local: "Pipeline gnnflow finished with status FAILURE. Inner task failed: ..."
            raise GnnflowError(f"kfp.local: {exc} The task's log is above.") from None
    outputs = {name: artifact.uri for name, artifact in task.outputs.items()}  # in DAG order
    metadata = {name: dict(artifact.metadata) for name, artifact in task.outputs.items()}
    if "report" not in outputs:  # the gated pipeline: report ran inside the condition, or not at all
        report = storage.parse_uri(outputs["model"]).parent.parent.join("report", "report")  # type: ignore[attr-defined]
        if not storage.exists(report.join(storage.MANIFEST_NAME)):
            metrics = json.loads(storage.read_text(storage.parse_uri(outputs["model"]).join("metrics.json")))
            return KfpLocalRun(root, outputs, metrics, metadata, held_back=True)
        outputs["report"] = str(report)
    metrics = json.loads(storage.read_text(storage.parse_uri(outputs["report"]).join("metrics.json")))
    return KfpLocalRun(root, outputs, metrics, metadata)


def summary(run: KfpLocalRun) -> str:
    """What a user reads at the end: where each output went and the final metrics."""
    lines = [f"run root: {run.root} (kfp.local)"]
    lines += [f"  {name:<14} {uri}" for name, uri in run.outputs.items()]
    if run.held_back:
        lines.append(f"held back: the model was not blessed (see {run.outputs['registration']}); infer, report and export did not run")
        return "\n".join(lines + metric_lines(run.metrics))
    lines.append(f"report: {run.report_html}")
    lines.append(f"metrics: {storage.parse_uri(run.outputs['report']).join('metrics.json')}")
    return "\n".join(lines + metric_lines(run.metrics))


def run_from_cli(
    config_uri: str | None,
    output: str | None,
    overrides: dict[str, object],
    infer_mode: str = "auto",
    image: str | None = None,
    from_model: str | None = None,
) -> KfpLocalRun:
    """``gnnflow run --via kfp-local`` (or ``kfp-docker``, with ``image``): the demo (no config) or a config file, into a local run root."""
    from pipelines.local_run import demo_config, new_run_root

    via = "kfp-docker" if image else "kfp-local"
    config = load_config(config_uri) if config_uri else None  # relative table paths resolve against the file's folder
    root = storage.parse_uri(output) if output else new_run_root(config.output.root if config else "runs")
    if not isinstance(root, storage.LocalUri):
        raise GnnflowError(f"--via {via} writes under a local folder, not {root}: drop --via {via} for gs:// runs")
    if image:
        # Containers see the root at the same absolute path (bind mount), and no other folder of
        # this machine: the demo's tables are written under it.
        root = storage.parse_uri(str(pathlib.Path(root.path).resolve()))
        assert isinstance(root, storage.LocalUri)
        pathlib.Path(root.path).mkdir(parents=True, exist_ok=True)
    config = config or demo_config(root)
    if image:
        check_visible_in_containers(config, root)
    return run_via_kfp_local(config.to_yaml(), overrides, root, infer_mode, image, from_model)


def check_visible_in_containers(config: GnnflowConfig, root: storage.LocalUri) -> None:
    """The task containers see this machine's files only under the run root (bind-mounted): refuse tables elsewhere."""
    inside = pathlib.Path(root.path).resolve()
    tables = [(t.type, t.uri) for t in config.graph.nodes] + [(t.type, t.uri) for t in config.graph.edges]
    for name, table_uri in tables:
        if table_uri.startswith("bq://"):  # read over the network, as on the cloud
            continue
        uri = storage.parse_uri(table_uri)
        if isinstance(uri, storage.LocalUri) and not pathlib.Path(uri.path).resolve().is_relative_to(inside):
            raise GnnflowError(
                f"--via kfp-docker: table {name!r} at {uri.path} is outside the run root {inside}, the only folder of "
                "this machine the task containers see: move it below the run root or to gs://"
            )
