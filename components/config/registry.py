"""The ``registry`` section: where trained models are registered, and the evaluation gate that
decides which version is ``blessed`` (the one inference-only runs and downstream consumers use)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from components.config.sections import _Section

BLESSED = "blessed"  # the alias the gate moves


class RegistrySpec(_Section):
    """Model registry and evaluation gate (no ``uri``: models are not registered, nothing is gated)."""

    uri: str | None = Field(
        None,
        description="Registry: a local folder, a gs:// prefix, or a Vertex AI Model Registry model "
        "(vertex://projects/P/locations/R/models/NAME). Each successful train registers a new version here.",
    )
    metric: str | None = Field(
        None,
        description="Validation metric of train's metrics.json that the gate compares (e.g. val_accuracy, val_macro_f1, "
        "val_roc_auc); default: the one that selects the best epoch (val_accuracy, or val_roc_auc for link prediction).",
    )
    max_drop: float = Field(
        0.0,
        ge=0.0,
        description="Largest drop of the gate metric against the blessed version that still passes the gate "
        "(absolute, in the metric's units); the first version registered is always blessed.",
    )
    downstream: Literal["blessed", "always"] = Field(
        "blessed",
        description="blessed: infer, report and export run only when the new version passes the gate; "
        "always: they run for every trained model, blessed or not.",
    )
