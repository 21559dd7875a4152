"""``gnnflow tune --config C --output DIR --trials N [--space S] [--parallel K] [--repeats R] [--seed SEED] [--set KEY=VALUE ...]``."""

from __future__ import annotations

import argparse
import logging

from components import storage
from pipelines.arguments import parse_set

log = logging.getLogger("gnnflow.tune")


def _tune(args: argparse.Namespace) -> None:
    from pipelines.tune.results import BEST_CONFIG, PAGE, TRIALS_CSV, publish
    from pipelines.tune.study import TuneOptions, prepare, run_study

    options = TuneOptions(trials=args.trials, parallel=args.parallel, seed=args.seed, space=args.space, repeats=args.repeats)
    config, space = prepare(args.config, parse_set(args.set), args.space)  # every key checked before any step runs
    output = storage.parse_uri(args.output)
    result = run_study(config, output, space, options)
    publish(result)
    best = result.best
    lines = [
        f"tune: {len(result.trials)} trial(s), {sum(t.state == 'COMPLETE' for t in result.trials)} complete; "
        f"data steps ran: {', '.join(result.data_ran) or 'none'}; skipped (up to date): {', '.join(result.data_skipped) or 'none'}",
        f"best: trial {best.number}, {result.metric} {best.metric:.4f} ({best.epochs_run} epochs)",
        *(f"  {key} = {value}" for key, value in best.params.items()),
        f"trials:      {output.join(TRIALS_CSV)}",
        f"best config: {output.join(BEST_CONFIG)}  (gnnflow run --config {output.join(BEST_CONFIG)})",
        f"plot:        {output.join(PAGE)}",
    ]
    print("\n".join(lines))


def register(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Adds the ``tune`` subcommand to the ``gnnflow`` parser."""
    parser = commands.add_parser(
        "tune",
        help="search hyperparameters on validation data: data steps once, then train per trial (Optuna TPE)",
        description="Runs preprocess, serialize and partition once under DIR/data, then one train per trial with its "
        "parameters as overrides, selecting on the validation metric only (trials never evaluate the test split). "
        "Publishes DIR/trials.csv, DIR/best_config.yaml, DIR/trials.png and DIR/tuning.html.",
    )
    parser.add_argument("--config", required=True, help="config YAML, local or gs://")
    parser.add_argument("--output", required=True, help="study folder DIR, local or gs://")
    parser.add_argument("--trials", type=int, required=True, help="number of trials")
    parser.add_argument(
        "--space",
        help="search space YAML: dotted model.* / training.* keys to {type: float|int|categorical, low, high, log, choices, "
        "when: {KEY: [VALUES]}} (when: searched only in trials whose categorical KEY took one of VALUES); default: learning "
        "rate, hidden width, dropout, weight decay, fan-outs; node classification: also the model type with each type's own "
        "parameters and the training mode where the graph allows; link prediction: also negatives and decoder",
    )
    parser.add_argument("--parallel", type=int, default=1, help="trials at once, each with resources.world_size workers (default 1)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the TPE sampler (default 0)")
    parser.add_argument(
        "--repeats",
        type=int,
        default=1,
        help="trainings per trial, with training.seed + 0..R-1, scored by their mean validation metric: steadier "
        "selection on small validation splits, R times the cost (default 1)",
    )
    parser.add_argument(
        "--set", action="append", default=[], metavar="KEY=VALUE", help="override a config field for every trial (repeatable)"
    )
    parser.set_defaults(handler=_tune)


def add_tuning_arguments(parser: argparse.ArgumentParser) -> None:
    """``gnnflow compile --tuning``: the tuning pipeline instead of the main one."""
    group = parser.add_argument_group("tuning pipeline (--tuning)")
    group.add_argument(
        "--tuning",
        action="store_true",
        help="compile the tuning pipeline: the data steps once, then a Vertex AI hyperparameter-tuning job of train "
        "(needs --config, whose task and resources it is compiled for, and --trials)",
    )
    group.add_argument("--space", help="--tuning: search space YAML (default: the built-in space of the config's task)")
    group.add_argument("--trials", type=int, help="--tuning: number of trials")
    group.add_argument("--parallel", type=int, default=1, help="--tuning: trials at once (default 1)")
