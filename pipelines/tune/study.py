"""``gnnflow tune``: an Optuna study (seeded TPE) whose trials train on one shared data output.

Preprocess, serialize and partition run once, under ``DIR/data``, through the local run's
up-to-date checks (:func:`pipelines.local_run.run_steps`: a second study over the same config
skips them). Each trial then runs only step train, into ``DIR/trials/NNN``, with its parameters
applied as overrides and ``training.evaluate_test: false``: a trial's model has validation
metrics only, and the study reads nothing else (its objective is the best epoch's validation
metric, the one train's early stopping follows). Trial 0 trains the config as given (the space
is widened to hold its values first, said in the log), so the study measures its gain over it. A trial that fails (a combination the config
refuses, a model that does not learn, a crash) is recorded with its error; the study fails only
when every trial did. The result is published under ``DIR`` (:mod:`pipelines.tune.results`).

``--repeats R`` trains each trial R times, with ``training.seed`` + 0 … R-1, and scores it by the
mean of their validation metrics: on a small validation split (CiteSeer's 500 nodes) one seed's
figure moves by a point or two from the seed alone, and the best of N single-seed trials is then
mostly the luckiest seed (the winner's curse), not the best parameters.

``--parallel K`` runs K trials at once, each with ``resources.world_size`` workers and 1/K of
the cores (``resources.threads.cores``), and is refused when K × world_size workers exceed the
cores: an oversubscribed machine slows every trial, and distorts what they measure.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass
from typing import Any

from components import storage
from components.config import GnnflowConfig, apply_overrides, load_config
from components.errors import GnnflowError
from components.runtime.runlog import progress
from components.runtime.threads import replica_cores
from components.tables.bigquery_tables import check_bigquery_inputs
from components.train.output import METRICS_FILE, VALIDATION_METRIC
from components.train.step import train
from pipelines.local_run import RunOutputs, run_steps
from pipelines.tune.records import TrialRecord, TuneResult, best_trial
from pipelines.tune.space import (
    Param,
    SearchSpace,
    config_values,
    default_space,
    encode,
    holding_config,
    load_space,
    searched_by_config,
)

log = logging.getLogger("gnnflow.tune")

DATA_STEPS = ("preprocess", "serialize", "partition")


@dataclass(frozen=True)
class TuneOptions:
    """What ``gnnflow tune`` was asked for (beside the config and output)."""

    trials: int
    parallel: int = 1
    seed: int = 0
    space: str | None = None  # a --space file; None: the default space of the task
    repeats: int = 1  # trainings per trial (training.seed + 0 … repeats-1), scored by their mean


@dataclass(frozen=True)
class _Study:
    """Everything a trial needs, fixed before the first one starts."""

    base: GnnflowConfig
    space: SearchSpace
    partitions: storage.Uri
    trials_root: storage.Uri
    metric: str
    options: TuneOptions
    fixed: dict[str, object]  # overrides every trial gets


def objective_metric(config: GnnflowConfig) -> str:
    """The validation metric a study maximises: the one train selects its best epoch by."""
    return f"val_{VALIDATION_METRIC[config.task.type]}"


def check_parallel(config: GnnflowConfig, options: TuneOptions, cores: int) -> None:
    """Refuses what cannot run well before any step: bad counts, or K trials that do not fit the cores."""
    if options.trials < 1:
        raise GnnflowError(f"--trials must be at least 1, got {options.trials}")
    if options.repeats < 1:
        raise GnnflowError(f"--repeats must be at least 1, got {options.repeats}")
    if options.parallel < 1:
        raise GnnflowError(f"--parallel must be at least 1, got {options.parallel}")
    if options.parallel > options.trials:
        raise GnnflowError(f"--parallel {options.parallel} exceeds --trials {options.trials}")
    workers = options.parallel * config.resources.world_size
    if workers > cores:
        raise GnnflowError(
            f"--parallel {options.parallel} trials of resources.world_size {config.resources.world_size} worker(s) need "
            f"{workers} cores, this machine has {cores}: lower --parallel (at most {max(1, cores // config.resources.world_size)})"
        )


def _fixed_overrides(config: GnnflowConfig, options: TuneOptions, cores: int) -> dict[str, object]:
    fixed: dict[str, object] = {"training.evaluate_test": False}
    if options.parallel > 1 and config.resources.threads.cores is None:
        fixed["resources.threads.cores"] = max(1, cores // options.parallel)  # each trial its share, not every core
    return fixed


def startup_trials(trials: int) -> int:
    """Random trials before TPE models the results: Optuna's default is 10, which would make a
    12-trial study nearly random search; a third of the study (3 to 10) leaves most trials guided."""
    return min(10, max(3, trials // 3))


def tpe_sampler(options: TuneOptions) -> Any:
    """Seeded TPE; multivariate, since learning rate and weight decay (or width and dropout) act
    together, which per-parameter TPE cannot model; grouped, so that conditional parameters are
    modelled jointly among the trials that searched them (the trials of one model type)."""
    import warnings

    import optuna

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)  # multivariate is marked experimental
        return optuna.samplers.TPESampler(seed=options.seed, n_startup_trials=startup_trials(options.trials), multivariate=True, group=True)


def _suggest(trial: Any, param: Param) -> Any:
    if param.type in ("float", "int"):
        low, high = param.bounds
        if param.type == "int":
            return trial.suggest_int(param.key, int(low), int(high), log=param.log)
        return trial.suggest_float(param.key, low, high, log=param.log)
    # Optuna stores categorical choices as plain values: lists (fan-outs) travel as their text.
    texts = [encode(c) for c in param.choices]
    return param.choices[texts.index(trial.suggest_categorical(param.key, texts))]


def sample(trial: Any, space: SearchSpace) -> dict[str, Any]:
    """A trial's parameters: each parameter in order, a conditional one only when its condition holds
    on the values drawn before it (the others keep the config's value, and are not the trial's)."""
    params: dict[str, Any] = {}
    for param in space.params:
        if param.when is None or param.when.holds(params):
            params[param.key] = _suggest(trial, param)
    return params


def params_of(trial: Any, space: SearchSpace) -> dict[str, Any]:
    """A finished trial's parameters as config values (categorical texts decoded)."""
    values: dict[str, Any] = {}
    for param in space.params:
        if param.key not in trial.params:
            continue
        value = trial.params[param.key]
        if param.type == "categorical":
            value = param.choices[[encode(c) for c in param.choices].index(value)]
        values[param.key] = value
    return values


def _shown(params: dict[str, Any]) -> str:
    return " ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={encode(v)}" for k, v in params.items())


class _Objective:
    """Trains one trial; Optuna calls it from K threads when ``--parallel K``."""

    def __init__(self, study: _Study) -> None:
        self.study = study
        self.lock = threading.Lock()
        self.best: tuple[float, int] | None = None
        self.bar = progress("trials", unit="trials", total=study.options.trials)

    def __call__(self, trial: Any) -> float:
        s = self.study
        params = sample(trial, s.space)
        label = f"trial {trial.number} ({trial.number + 1}/{s.options.trials})"
        log.info("%s: %s", label, _shown(params))
        start = time.perf_counter()
        output = s.trials_root.join(f"{trial.number:03d}")
        try:
            config = apply_overrides(s.base, {**params, **s.fixed}, f"trial {trial.number}")
            storage.delete_prefix(output)  # no checkpoint or failure record of an earlier study's trial
            runs = [self._train_once(config, output, repeat, label) for repeat in range(s.options.repeats)]
            value = sum(metric for metric, _ in runs) / len(runs)
            epochs = round(sum(epochs for _, epochs in runs) / len(runs))
        except Exception as exc:
            seconds = time.perf_counter() - start
            trial.set_user_attr("seconds", round(seconds, 2))
            trial.set_user_attr("error", " ".join(line.strip() for line in str(exc).splitlines()) or type(exc).__name__)
            log.warning("%s failed after %.1f s: %s", label, seconds, trial.user_attrs["error"])
            self._done()
            raise
        seconds = time.perf_counter() - start
        trial.set_user_attr("seconds", round(seconds, 2))
        trial.set_user_attr("epochs_run", epochs)
        trial.set_user_attr("seed_metrics", [metric for metric, _ in runs])
        with self.lock:
            if self.best is None or value > self.best[0]:
                self.best = (value, trial.number)
            best_value, best_number = self.best
        log.info(
            "%s: %s %.4f after %d epochs in %.1f s → %s; best so far %.4f (trial %d)",
            label,
            s.metric,
            value,
            epochs,
            seconds,
            output,
            best_value,
            best_number,
        )
        self._done()
        return value

    def _train_once(self, config: GnnflowConfig, output: storage.Uri, repeat: int, label: str) -> tuple[float, int]:
        """One training of a trial: its validation metric and epochs run. Repeat r trains with
        training.seed + r, under ``output`` (one repeat) or ``output/seed-<seed>``."""
        s = self.study
        if s.options.repeats > 1:
            seed = config.training.seed + repeat
            config = apply_overrides(config, {"training.seed": seed}, f"{label}, repeat {repeat}")
            output = output.join(f"seed-{seed}")
        published = train(config, s.partitions, output)
        if published is None:
            raise GnnflowError(f"{label}: train published nothing")
        metrics = published.read_json(METRICS_FILE)
        # Validation figures and the epoch count only: trials are trained with training.evaluate_test false,
        # and any other key a model's metrics hold is not read for selection.
        if s.metric not in metrics:
            raise GnnflowError(f"{label}: the model's metrics lack {s.metric}")
        if s.options.repeats > 1:
            log.info("%s, seed %d: %s %.4f", label, config.training.seed, s.metric, float(metrics[s.metric]))
        return float(metrics[s.metric]), int(metrics["epochs_run"])

    def _done(self) -> None:
        with self.lock:
            self.bar.update(1)


def _records(study: Any, space: SearchSpace) -> list[TrialRecord]:
    import optuna

    records = []
    for trial in study.trials:
        complete = trial.state == optuna.trial.TrialState.COMPLETE
        records.append(
            TrialRecord(
                number=trial.number,
                params=params_of(trial, space),
                metric=float(trial.value) if complete else None,
                epochs_run=trial.user_attrs.get("epochs_run"),
                seconds=float(trial.user_attrs.get("seconds", 0.0)),
                state="COMPLETE" if complete else "FAIL",
                error="" if complete else str(trial.user_attrs.get("error", "")),
                seed_metrics=tuple(trial.user_attrs.get("seed_metrics", ())),
            )
        )
    return records


def run_study(base: GnnflowConfig, output: storage.Uri, space: SearchSpace, options: TuneOptions) -> TuneResult:
    """Runs the data steps once (or skips them), then the trials; publishes nothing (see :func:`tune`)."""
    import optuna

    cores = replica_cores()
    check_parallel(base, options, cores)
    check_bigquery_inputs(base)  # bq:// tables' columns and types, before the data steps start
    data_root = output.join("data")
    ran, skipped, _ = run_steps(base, data_root, DATA_STEPS)
    partitions = RunOutputs.under(data_root).partitions
    metric = objective_metric(base)
    study_setup = _Study(base, space, partitions, output.join("trials"), metric, options, _fixed_overrides(base, options, cores))
    log.info(
        "tune: %d trial(s) of %d training(s), %d at a time, maximising %s over %s; data %s; trials → %s",
        options.trials,
        options.repeats,
        options.parallel,
        metric if options.repeats == 1 else f"the mean {metric}",
        space.source,
        partitions,
        study_setup.trials_root,
    )
    for param in space.params:
        log.info("  %s", param.describe())
    optuna.logging.set_verbosity(optuna.logging.ERROR)  # the study logs each trial itself, failures with their error
    study = optuna.create_study(direction="maximize", sampler=tpe_sampler(options))
    # Trial 0 is the config as given (prepare widened the space to hold it): the study then reports what tuning
    # gained over it on validation, and never recommends a config whose validation figure is below it.
    # A conditional key whose condition the config does not meet is not searched in trial 0 (nor set: the config's value stays).
    baseline = config_values(space, base)
    searched = searched_by_config(space, base)
    missing = [p.key for p in searched if p.key not in baseline]
    if missing:
        raise GnnflowError(f"search space {space.source}: key '{missing[0]}' does not hold the config's value (trial 0)")
    study.enqueue_trial({p.key: encode(baseline[p.key]) if p.type == "categorical" else baseline[p.key] for p in searched})
    log.info("trial 0: the config as given (%s)", _shown(baseline))
    objective = _Objective(study_setup)
    try:
        study.optimize(objective, n_trials=options.trials, n_jobs=options.parallel, catch=(Exception,))
    finally:
        objective.bar.close()
    records = _records(study, space)
    best, best_config = best_trial(base, records)
    return TuneResult(output, metric, space, records, best, best_config, ran, skipped)


def prepare(config_uri: str, overrides: dict[str, object], space_uri: str | None) -> tuple[GnnflowConfig, SearchSpace]:
    """The config (with ``--set``) and the search space, both checked before any step runs."""
    config = load_config(config_uri)
    if overrides:
        config = apply_overrides(config, overrides, "--set")
    space = load_space(space_uri, config) if space_uri else default_space(config)
    space, widened = holding_config(space, config)
    for note in widened:
        log.warning("search space widened to hold the config's own value (trial 0 trains the config as given): %s", note)
    return config, space
