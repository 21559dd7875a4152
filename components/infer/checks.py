"""What ``infer`` refuses before a run's first step (see :mod:`components.config.preflight`)."""

from __future__ import annotations

from components.config.preflight import PlannedRun


def before_run(run: PlannedRun) -> None:
    """Exact inference needs a homogeneous graph with features and a GraphSAGE or GCN model.
    ``training.device`` is train's check: infer computes where train did."""
    if run.infer_mode == "exact":
        from components.infer.layerwise import check_exact_config  # torch and PyG: only when exact is asked for

        check_exact_config(run.config)
