"""``python -m components.train --config FILE|--config-yaml TEXT [--input URI] [--output URI] [--world-size N]
[--set KEY=VALUE ...] [--hypertune-metric NAME]``.

Locally it spawns N trainers on this machine; on a Vertex AI CustomJob replica it joins the
cluster described by CLUSTER_SPEC (or MASTER_ADDR / MASTER_PORT / WORLD_SIZE / RANK).

As a Vertex AI hyperparameter-tuning trial, Vertex AI appends each trial parameter as
``--KEY=VALUE`` (a dotted config key, e.g. ``--training.learning_rate=0.01``): those are taken as
``--set`` overrides. The trial's objective goes to the hypertune metrics file
(:mod:`components.train.hypertune`) when ``--hypertune-metric`` names it or
``$CLOUD_ML_HP_METRIC_FILE`` is set; without ``--output`` the model goes to ``$AIP_MODEL_DIR``
(the trial's own folder) when Vertex AI sets it.
"""

from __future__ import annotations

import argparse
import logging
import os
from collections.abc import Sequence

import yaml

from components import storage
from components.config import apply_overrides
from components.config.arguments import add_config_arguments, required_config
from components.errors import GnnflowError
from components.runtime.entrypoint import run_cli
from components.train import hypertune
from components.train.output import METRICS_FILE, VALIDATION_METRIC
from components.train.step import train

log = logging.getLogger("gnnflow.train")
MODEL_DIR_ENV = "AIP_MODEL_DIR"  # set by Vertex AI on a job (or trial) with a base output directory


def parse_args(argv: Sequence[str] | None) -> tuple[argparse.Namespace, dict[str, object]]:
    """The step's arguments, and the overrides of ``--set`` and of trial parameters ``--KEY=VALUE``."""
    parser = argparse.ArgumentParser(prog="python -m components.train", description=__doc__)
    add_config_arguments(parser, required=True, help="model, training, resources sections")
    parser.add_argument("--input", help="published partition output (default: <output.root>/partitions)")
    parser.add_argument("--output", help=f"output URI (default: ${MODEL_DIR_ENV} when set, else <output.root>/model)")
    parser.add_argument("--world-size", type=int, help="number of trainers; must equal the number of partitions")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="override a config field (repeatable)")
    parser.add_argument(
        "--hypertune-metric",
        metavar="NAME",
        help="write this metric of the published model (e.g. val_accuracy) to the hypertune metrics file "
        f"(${hypertune.METRIC_FILE_ENV}, default {hypertune.DEFAULT_METRIC_FILE})",
    )
    args, rest = parser.parse_known_args(argv)
    items = list(args.set)
    for extra in rest:  # Vertex AI's trial parameters: only --dotted.key=value is taken, anything else is an error
        key, _, _ = extra.removeprefix("--").partition("=")
        if not extra.startswith("--") or "=" not in extra or "." not in key:
            parser.error(f"unrecognized argument: {extra} (trial parameters take the form --section.key=value)")
        items.append(extra.removeprefix("--"))
    overrides: dict[str, object] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise GnnflowError(f"--set {item!r}: expected KEY=VALUE, e.g. training.epochs=5")
        overrides[key.strip()] = yaml.safe_load(value)
    return args, overrides


def main(argv: Sequence[str] | None = None) -> storage.PublishedOutput | None:
    args, overrides = parse_args(argv)
    config = required_config(args)
    if overrides:
        config = apply_overrides(config, overrides, "--set / trial parameters")
    if args.world_size:
        config = config.model_copy(update={"resources": config.resources.model_copy(update={"world_size": args.world_size})})
    metric = args.hypertune_metric or (f"val_{VALIDATION_METRIC[config.task.type]}" if os.environ.get(hypertune.METRIC_FILE_ENV) else None)
    root = storage.parse_uri(config.output.root)
    output = args.output or os.environ.get(MODEL_DIR_ENV) or root.join("model")
    published = train(config, args.input or root.join("partitions"), output)
    if published is not None and metric is not None:  # the publishing replica reports the trial
        metrics = published.read_json(METRICS_FILE)
        if metric not in metrics:
            raise GnnflowError(f"--hypertune-metric {metric}: not among the model's metrics ({', '.join(sorted(metrics))})")
        path = hypertune.report_metric(metric, metrics[metric], global_step=int(metrics.get("epochs_run", 0)))
        log.info("train: %s %.4f reported to %s", metric, metrics[metric], path)
    return published


if __name__ == "__main__":
    raise SystemExit(run_cli(main))
