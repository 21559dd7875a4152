"""What the report states in words and numbers: the final metrics and a summary of the config."""

from __future__ import annotations

import json
import math
from typing import Any

from components.config import GnnflowConfig
from components.errors import GnnflowError
from components.report.inputs import METRICS_FILE, InferenceRecord, TrainingRecord

INTEGER_KEYS = ("epoch", "best_epoch", "epochs_run")  # shown without decimals, as are *_count keys


def _is_number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def final_metrics(training: TrainingRecord, inference: InferenceRecord) -> dict[str, float]:
    """The run's final metrics, flat and all floats (what KFP's Metrics artifact takes).

    From train: ``best_epoch``, ``epochs_run`` and the best model's ``val_*``; from infer: the
    ``test_*`` metrics recomputed from the published predictions or embeddings. (Train's own
    ``test_*``, from its sampled evaluation, are shown on the page but not final.)
    """
    chosen: list[tuple[str, Any, str]] = []
    train_source, infer_source = str(training.output.uri(METRICS_FILE)), str(inference.output.uri(METRICS_FILE))
    for key in ("best_epoch", "epochs_run"):
        if key in training.final:
            chosen.append((key, training.final[key], train_source))
    chosen += [(k, v, train_source) for k, v in training.final.items() if k.startswith("val_")]
    tests = [(k, v, infer_source) for k, v in inference.metrics.items() if k.startswith("test_")]
    if not tests:
        raise GnnflowError(f"{infer_source} holds no test metrics (keys test_*)")
    metrics = {}
    for key, value, source in chosen + tests:
        if not _is_number(value):
            raise GnnflowError(f"{source}: {key!r} is {value!r}, not a number")
        metrics[key] = float(value)
    return metrics


def format_value(key: str, value: object) -> str:
    """A metric as a person reads it: counts and epochs whole, scores to 4 decimals, NaN as n/a."""
    if not _is_number(value):
        return str(value)
    number = float(value)  # type: ignore[arg-type]
    if math.isnan(number):
        return "n/a"
    if (key in INTEGER_KEYS or key.endswith("_count")) and number.is_integer():
        return f"{int(number):,}"
    return f"{number:.4f}"


def _pairs(section: dict[str, Any], prefix: str = "") -> list[str]:
    """``key=value`` items of a section, nested keys dotted; unset (null) fields left out."""
    items = []
    for key, value in section.items():
        if isinstance(value, dict):
            items += _pairs(value, f"{prefix}{key}.")
        elif value is not None:
            items.append(f"{prefix}{key}={json.dumps(value)}")
    return items


def config_summary(config: GnnflowConfig, trained_model: dict[str, Any]) -> list[tuple[str, str]]:
    """(what, value) rows: the task, the tables, then the sections a reader of results asks about.

    The model row shows the architecture training used (``model_spec.json``), which is what
    the weights fit even when the config's model section differs. The page also carries the
    whole config as YAML.
    """
    rows = [("task", f"{config.task.type} on {config.task_target!r}")]
    for node in config.graph.nodes:
        label = f", label column {node.label_column!r}" if node.label_column else ", unlabelled"
        rows.append((f"node type {node.type!r}", f"{node.uri}{label}"))
    for edge in config.graph.edges:
        rows.append((f"edge type {edge.name!r}", f"{edge.uri}, {'undirected' if edge.undirected else 'directed'}"))
    rows.append(("split", ", ".join(_pairs(config.task.split.model_dump(mode="json")))))
    model = trained_model or config.model.model_dump(mode="json")
    rows.append(("model (as trained)", ", ".join(_pairs(model))))
    rows.append(("training", ", ".join(_pairs(config.training.model_dump(mode="json")))))
    resources = config.resources.model_dump(mode="json")
    if resources.get("runner") != "vertex":
        resources.pop("custom_job", None)  # only read when steps run as Vertex AI CustomJobs
    rows.append(("resources", ", ".join(_pairs(resources))))
    rows.append(("partition", ", ".join(_pairs(config.partition.model_dump(mode="json")))))
    rows.append(("output root", config.output.root))
    return rows
