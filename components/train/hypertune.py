"""The metric of a Vertex AI hyperparameter-tuning trial, in the file format ``cloudml-hypertune`` writes.

Vertex AI reads a trial's objective from ``$CLOUD_ML_HP_METRIC_FILE`` (default
``/tmp/hypertune/output.metrics``): JSON lines, one per report, each holding the metric tag with
the value as a string, ``global_step`` (a string), ``timestamp`` (seconds since the epoch),
``trial`` (``$CLOUD_ML_TRIAL_ID``, a string) and ``checkpoint_path``, keys sorted. The package
rewrites the whole file on every report; so does this module (one report per trial: the best
model's validation metric), which spares the image a package for ten lines.
"""

from __future__ import annotations

import json
import os
import pathlib
import time

METRIC_FILE_ENV = "CLOUD_ML_HP_METRIC_FILE"
TRIAL_ID_ENV = "CLOUD_ML_TRIAL_ID"
DEFAULT_METRIC_FILE = "/tmp/hypertune/output.metrics"  # noqa: S108 - the path Vertex AI and cloudml-hypertune agree on


def metric_file() -> pathlib.Path:
    """Where this trial's metric goes: ``$CLOUD_ML_HP_METRIC_FILE`` or the hypertune default."""
    return pathlib.Path(os.environ.get(METRIC_FILE_ENV) or DEFAULT_METRIC_FILE)


def report_metric(tag: str, value: float, global_step: int = 0, path: pathlib.Path | None = None) -> pathlib.Path:
    """Writes ``tag = value`` as cloudml-hypertune's ``report_hyperparameter_tuning_metric`` does; returns the file."""
    target = path or metric_file()
    target.parent.mkdir(parents=True, exist_ok=True)
    line = {
        "checkpoint_path": "",
        "global_step": str(int(global_step)),
        tag: str(float(value)),
        "timestamp": time.time(),
        "trial": str(os.environ.get(TRIAL_ID_ENV, 0)),
    }
    target.write_text(json.dumps(line, sort_keys=True) + "\n", encoding="utf-8")
    return target
