"""Step ``preprocess``: raw node and edge tables → validated, enumerated, transformed tables
(layout: :mod:`.output`), with the local engine (:mod:`.local_engine`) or Beam (:mod:`.beam_engine`)."""

from __future__ import annotations

import logging

from components import storage
from components.config import GnnflowConfig
from components.errors import GnnflowError
from components.preprocess.local_engine import preprocess_here
from components.preprocess.output import STEP, load_fitted_state
from components.runtime.threads import use_worker_threads

__all__ = ["STEP", "check_fitted_state", "load_fitted_state", "preprocess"]

log = logging.getLogger("gnnflow.preprocess")


def check_fitted_state(config: GnnflowConfig, fitted_state: dict | None) -> None:
    """An error naming the first table whose features the earlier run's fitted state cannot
    encode: a type it has no statistics for, or feature groups (columns, transforms) other than
    those it was fitted on (the model's input layer takes exactly those)."""
    if fitted_state is None:
        return
    missing = [n.type for n in config.graph.nodes if n.type not in fitted_state.get("node_types", {})]
    missing += [e.name for e in config.graph.edges if e.name not in fitted_state.get("edge_types", {})]
    if missing:
        raise GnnflowError(f"the fitted state has no statistics for {missing}")
    tables = [("nodes", n.type, n.features) for n in config.graph.nodes] + [("edges", e.name, e.features) for e in config.graph.edges]
    for kind, name, specs in tables:
        fitted = fitted_state["node_types" if kind == "nodes" else "edge_types"][name].get("features", [])
        configured = [spec.model_dump(mode="json") for spec in specs]
        reused = [group.get("spec") for group in fitted]
        if configured != reused:
            raise GnnflowError(
                f"graph.{kind}[{name!r}].features: {_groups(configured)} differ from the features the fitted transforms "
                f"were made for, {_groups(reused)}: an inference-only run reads the columns the model was trained on"
            )


def _groups(specs: list) -> str:
    return "[" + "; ".join(f"{s.get('transform')} of {s.get('columns')}" if isinstance(s, dict) else repr(s) for s in specs) + "]"


def preprocess(
    config: GnnflowConfig, output: storage.Uri | str, fitted_state: dict | None = None, image: str | None = None
) -> storage.PublishedOutput:
    """Runs the step with the configured engine; returns the published output. Nothing is
    published if any check fails. ``image`` is the step image (Dataflow's worker image)."""
    output = storage.parse_uri(output)
    log.info(
        "preprocess: %d node table(s), %d edge table(s) → %s (engine %s)",
        len(config.graph.nodes),
        len(config.graph.edges),
        output,
        config.preprocess.engine,
    )
    check_fitted_state(config, fitted_state)
    use_worker_threads(config.resources.threads, 1, 0, "compute")  # the local engine's readers; Beam's workers are Beam's
    if config.preprocess.engine == "beam":
        from components.preprocess.beam_engine import preprocess_with_beam

        return preprocess_with_beam(config, output, fitted_state, image)
    return preprocess_here(config, output, fitted_state)
