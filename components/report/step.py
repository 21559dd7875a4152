"""Step ``report``: the run's final metrics, its training curves and a 2-D projection of its
embeddings, as PNGs and one self-contained HTML page.

Inputs: a published train output (``metrics.jsonl``, ``metrics.json``, ``model_spec.json``) and
a published infer output (``metrics.json``, ``embeddings/<type>/part-*.parquet``).

Output (published atomically)::

    metrics.json          final metrics, flat, all floats: best_epoch, epochs_run and val_* from
                          train, test_* recomputed by infer from its published output
    report.html           one page, PNGs embedded as data URIs, no external references
    loss.png  validation.png  embeddings.png
    config.resolved.yaml

Once published, ``metrics.json`` is also copied beside ``manifest.json`` at the output root,
so that ``<output>/metrics.json`` holds the latest final metrics (the manifest's copy is the
one to trust).
"""

from __future__ import annotations

import json
import logging
import time

import numpy as np

from components import storage
from components.config import GnnflowConfig
from components.report.inputs import METRICS_FILE, InferenceRecord, TrainingRecord, check_lineage, read_inference, read_training
from components.report.page import Plot, ReportPage, render
from components.report.plots import loss_plot, projection_plot, validation_plot
from components.report.projection import pca_2d
from components.report.sample import EmbeddingSample, sample_embeddings
from components.report.summary import config_summary, final_metrics, format_value

log = logging.getLogger("gnnflow.report")

STEP = "report"
PAGE_FILE = "report.html"
PROJECTION_LIMIT = 5_000  # nodes projected at most: enough for the picture, small enough for any graph
TASK_NAMES = {"node_classification": "Node classification", "link_prediction": "Link prediction"}


def _curves(training: TrainingRecord) -> list[Plot]:
    best, headline = training.best_epoch, training.validation_metric
    return [
        Plot(
            "loss.png",
            loss_plot(training.history, best),
            "training loss per epoch",
            f"Mean training loss per epoch; the dotted line marks the best epoch ({best}).",
        ),
        Plot(
            "validation.png",
            validation_plot(training.history, best, headline),
            "validation metrics per epoch",
            f"Validation metrics per epoch (solid) and the training value where recorded (dashed); "
            f"the best epoch ({best}) has the highest validation {headline}.",
        ),
    ]


def _colouring(sample: EmbeddingSample) -> tuple[np.ndarray | None, str, str]:
    """What the projection's colours mean: (groups, legend title, how the caption says it)."""
    if sample.classes is not None:
        # The infer output holds each node's predicted class; true labels live upstream, and
        # most nodes (every unlabelled or test node) have none to show anyway.
        return sample.classes, "predicted class", "coloured by the class the model predicts (not the true label)"
    types = np.unique(sample.node_types)
    if len(types) > 1:
        return sample.node_types, "node type", "coloured by node type (link prediction has no classes)"
    return None, "", "in one colour (link prediction has no classes, and there is one node type)"


def _projection(sample: EmbeddingSample, seed: int) -> Plot:
    projection = pca_2d(sample.embeddings)
    groups, legend_title, colour_text = _colouring(sample)
    types = ", ".join(repr(t) for t in np.unique(sample.node_types))
    share = "all" if len(sample) == sample.total else f"a uniform random sample (seed {seed}) of {len(sample):,} of the {sample.total:,}"
    title = f"{len(sample):,} of {sample.total:,} {types} nodes, " + (f"by {legend_title}" if legend_title else "one colour")
    caption = (
        f"The first two principal components (numpy SVD of the centred embeddings) of {share} {types} node embeddings, "
        f"{colour_text}. Together they hold {sum(projection.explained):.1%} of the sample's variance."
    )
    return Plot(
        "embeddings.png", projection_plot(projection, groups, legend_title, title), "2-D projection of the node embeddings", caption
    )


def _headline(training: TrainingRecord, inference: InferenceRecord, metrics: dict[str, float]) -> str:
    name = training.validation_metric
    val = training.final.get(f"val_{name}")
    epochs = training.final.get("epochs_run", len(training.history))
    tests = ", ".join(
        f"test {k[len('test_') :]} {format_value(k, v)}" for k, v in metrics.items() if k.startswith("test_") and not k.endswith("_count")
    )
    return (
        f"{TASK_NAMES[training.task_type]} on {training.target!r}: best epoch {training.best_epoch} of {epochs} run "
        f"(validation {name} {format_value(name, val)}); {tests} from the published {inference.mode} inference output."
    )


def _inputs(training: TrainingRecord, inference: InferenceRecord) -> list[tuple[str, str]]:
    def where(output: storage.PublishedOutput) -> str:
        return f"{output.root} (generation {output.manifest.generation}, published {output.manifest.created_at})"

    return [("model (train)", where(training.output)), (f"embeddings (infer, {inference.mode} mode)", where(inference.output))]


def report(
    config: GnnflowConfig, model: storage.Uri | str, embeddings: storage.Uri | str, output: storage.Uri | str
) -> storage.PublishedOutput:
    """Runs the step; returns the published report."""
    start = time.perf_counter()
    output = storage.parse_uri(output)
    # Everything a user can get wrong fails here, before anything is written.
    training = read_training(model)
    inference = read_inference(embeddings)
    notes = [note for note in [check_lineage(training, inference)] if note]
    metrics = final_metrics(training, inference)
    log.info("report: %s + %s → %s", training.output.root, inference.output.root, output)
    classification = training.task_type == "node_classification"
    node_types = [training.target] if classification else sorted(inference.shards)
    seed = config.training.seed
    sample = sample_embeddings(inference, node_types, PROJECTION_LIMIT, seed, with_classes=classification)
    curves = _curves(training)
    projection = _projection(sample, seed)
    train_source, infer_source = f"train ({METRICS_FILE})", f"infer, recomputed from its {inference.mode} output"
    page = ReportPage(
        title=f"gnnflow report: {TASK_NAMES[training.task_type].lower()} on {training.target!r}",
        headline=_headline(training, inference, metrics),
        metrics=[(k, v, infer_source if k.startswith("test_") else train_source) for k, v in metrics.items()],
        training_tests={k: v for k, v in training.final.items() if k.startswith("test_")},
        curves=curves,
        projection=projection,
        history=training.history,
        config_rows=config_summary(config, training.model),
        config_yaml=config.to_yaml(),
        inputs=_inputs(training, inference),
        notes=notes,
    )
    with storage.staged_output(output, STEP) as staging:
        staging.write_json(METRICS_FILE, metrics)
        for plot in [*curves, projection]:
            staging.write_bytes(plot.file_name, plot.png)
        staging.write_bytes(PAGE_FILE, render(page).encode("utf-8"))
        staging.write_bytes("config.resolved.yaml", config.to_yaml().encode())
        published = staging.publish(
            counts={"epochs": len(training.history), "nodes_embedded": sample.total, "nodes_projected": len(sample)},
            metadata={
                "model": str(training.output.root),
                "embeddings": str(inference.output.root),
                "infer_mode": inference.mode,
                "metrics": metrics,
            },
        )
    storage.write_text(output.join(METRICS_FILE), json.dumps(metrics, indent=2, sort_keys=True))
    log.info(
        "report: best epoch %d; %s; %d of %d nodes projected",
        training.best_epoch,
        ", ".join(f"{k}={format_value(k, v)}" for k, v in metrics.items() if k.startswith("test_")),
        len(sample),
        sample.total,
    )
    log.info("report: published %s in %.1fs; page %s", output, time.perf_counter() - start, published.uri(PAGE_FILE))
    return published
