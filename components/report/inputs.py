"""What the report reads: a published train output and a published infer output, checked.

Train publishes ``metrics.jsonl`` (one object per epoch), ``metrics.json`` (best epoch,
validation and test metrics of the best model) and ``model_spec.json``; infer publishes
``metrics.json`` (test metrics recomputed from its shards) and
``embeddings/<node type>/part-*.parquet``. Anything missing or malformed is a
:class:`GnnflowError` naming the output and the file.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from typing import Any

from components import storage
from components.errors import GnnflowError
from components.infer.output import EMBEDDINGS_FOLDER
from components.infer.output import STEP as INFER_STEP
from components.train.output import HISTORY_FILE, METRICS_FILE, SPEC_FILE, VALIDATION_METRIC
from components.train.output import STEP as TRAIN_STEP

log = logging.getLogger("gnnflow.report")


@dataclass(frozen=True)
class TrainingRecord:
    """A published train output, read."""

    output: storage.PublishedOutput
    history: list[dict[str, Any]]  # metrics.jsonl: one object per epoch, in the order they ran
    final: dict[str, Any]  # metrics.json: best_epoch, epochs_run, val_*, test_* of the best model
    task_type: str  # node_classification or link_prediction
    target: str  # the node type (classification) or edge type (link prediction) trained for
    model: dict[str, Any]  # the model section training used

    @property
    def validation_metric(self) -> str:
        """The metric that chose the best epoch (without its ``val_`` prefix)."""
        return VALIDATION_METRIC[self.task_type]

    @property
    def best_epoch(self) -> int:
        return int(self.final["best_epoch"])


@dataclass(frozen=True)
class InferenceRecord:
    """A published infer output, read (its shards are listed, not loaded)."""

    output: storage.PublishedOutput
    metrics: dict[str, Any]  # metrics.json: mode, test_*
    shards: dict[str, list[str]]  # node type → relative paths of its Parquet shards, sorted

    @property
    def mode(self) -> str:
        return str(self.metrics.get("mode") or self.output.manifest.metadata.get("mode") or "unknown")


def _open(uri: storage.Uri | str, step: str, what: str) -> storage.PublishedOutput:
    try:
        return storage.open_published(uri, step=step)
    except GnnflowError as exc:
        raise GnnflowError(f"{what}: {exc}") from None


def _json_object(published: storage.PublishedOutput, path: str) -> dict[str, Any]:
    try:
        value = published.read_json(path)
    except ValueError as exc:
        raise GnnflowError(f"{published.uri(path)} is not valid JSON: {exc}") from None
    if not isinstance(value, dict):
        raise GnnflowError(f"{published.uri(path)} must hold a JSON object, got {type(value).__name__}")
    return value


def _history(published: storage.PublishedOutput) -> list[dict[str, Any]]:
    where = published.uri(HISTORY_FILE)
    try:
        text = published.read_bytes(HISTORY_FILE).decode("utf-8")
    except UnicodeDecodeError as exc:
        raise GnnflowError(f"{where} is not UTF-8 text: {exc}") from None
    history = []
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            epoch = json.loads(line)
        except ValueError as exc:
            raise GnnflowError(f"{where} line {number} is not valid JSON: {exc}") from None
        if not isinstance(epoch, dict) or not isinstance(epoch.get("epoch"), int) or not _is_number(epoch.get("loss")):
            raise GnnflowError(
                f"{where} line {number}: expected an object with an integer 'epoch' and a numeric 'loss', got {line[:120]!r}"
            )
        history.append(epoch)
    return history


def _is_number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def read_training(uri: storage.Uri | str) -> TrainingRecord:
    """The published train output at ``uri``; an error naming it when it is missing or malformed."""
    published = _open(uri, TRAIN_STEP, "the model")
    final = _json_object(published, METRICS_FILE)
    if not isinstance(final.get("best_epoch"), int):
        raise GnnflowError(f"{published.uri(METRICS_FILE)} has no integer key 'best_epoch'")
    spec = _json_object(published, SPEC_FILE)
    task_type, target = spec.get("task_type"), spec.get("target")
    if not isinstance(task_type, str) or task_type not in VALIDATION_METRIC or not isinstance(target, str):
        raise GnnflowError(
            f"{published.uri(SPEC_FILE)} needs 'task_type' (one of {', '.join(VALIDATION_METRIC)}) "
            f"and 'target', got {task_type!r} and {target!r}"
        )
    model = spec["model"] if isinstance(spec.get("model"), dict) else {}
    return TrainingRecord(published, _history(published), final, task_type, target, model)


def read_inference(uri: storage.Uri | str) -> InferenceRecord:
    """The published infer output at ``uri``; an error naming it when it is missing or holds no shards."""
    published = _open(uri, INFER_STEP, "the embeddings")
    metrics = _json_object(published, METRICS_FILE)
    shards: dict[str, list[str]] = {}
    for path in published.files_under(EMBEDDINGS_FOLDER):
        parts = path.split("/")
        if len(parts) == 3 and parts[2].endswith(".parquet"):
            shards.setdefault(parts[1], []).append(path)
    if not shards:
        raise GnnflowError(f"{published.root} lists no embedding shards ({EMBEDDINGS_FOLDER}/<node type>/part-*.parquet) in its manifest")
    return InferenceRecord(published, metrics, shards)


def check_lineage(training: TrainingRecord, inference: InferenceRecord) -> str | None:
    """A note when the embeddings were not computed from this model (None when they were, or
    when infer did not record its model), and an error when they cannot belong together."""
    if training.task_type == "node_classification" and training.target not in inference.shards:
        raise GnnflowError(
            f"{inference.output.root} holds no embeddings of node type {training.target!r}, "
            f"the classification target of {training.output.root} (it has {', '.join(sorted(inference.shards))})"
        )
    recorded = inference.output.manifest.metadata.get("model")
    if recorded and storage.parse_uri(recorded) != training.output.root:
        note = f"the embeddings were computed from the model at {recorded}, not from {training.output.root} (a copy?)"
        log.warning("report: %s", note)
        return note
    return None
