"""What ``infer`` refuses before a run's first step (see :mod:`components.config.preflight`)."""

from __future__ import annotations

from components.config.preflight import PlannedRun


def before_run(run: PlannedRun) -> None:
    """Exact inference needs a homogeneous graph with features and a GraphSAGE or GCN model.
    ``training.device`` is train's check: infer computes where train did."""
    from components.infer.output import resolved_mode

    if resolved_mode(run.infer_mode, run.config.training.mode) == "exact":
        from components.infer.layerwise import check_exact_config  # torch and PyG: only when exact is asked for

        check_exact_config(run.config)
