"""What a run asks each of its steps before the first one starts.

Each step whose refusal can be known up front (a missing BigQuery column, a GPU this machine
does not have, an inference mode the model cannot serve, a missing output dataset) answers in
its own ``checks`` module, ``before_run(run: PlannedRun)``; ``pipelines.preflight`` asks them in
DAG order, so a run is refused before any step has published, not by the step that would fail.
"""

from __future__ import annotations

from dataclasses import dataclass

from components.config.run import GnnflowConfig


@dataclass(frozen=True)
class PlannedRun:
    """A run about to start.

    config: the resolved config (overrides applied).
    infer_mode: ``sampled``, ``exact`` or ``auto`` (exact when the config trains full-graph).
    local: the multi-worker steps run on this machine (``gnnflow run``, ``--via kfp-local``), so
        what this machine offers (a GPU) can be checked here; False for a run submitted to Vertex
        AI or KFP, whose workers run on the cluster's machines.
    model: an inference-only run's published model URI (``--from-model``, resolved); None when
        the run trains.
    overridden: the dotted keys given on the command line (``--set``, a submit's overrides).
    """

    config: GnnflowConfig
    infer_mode: str = "auto"
    local: bool = True
    model: str | None = None
    overridden: tuple[str, ...] = ()
