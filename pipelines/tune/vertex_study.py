"""The last task of the tuning pipeline: the finished Vertex AI hyperparameter-tuning job's trials
as the local study's records, published as ``gnnflow tune`` publishes them.

The task reads the job that ``gcp_resources`` names (the tuning-job task's output) from Vertex
AI, turns each trial into a :class:`~pipelines.tune.records.TrialRecord` (parameters decoded
to config values, the objective from its final measurement, the epochs from its step count,
Vertex AI's trial id as its number: the trial's folder under the tuning output), picks the best
one and applies it to the run's config with :func:`pipelines.tune.records.best_trial`, and
publishes ``trials.csv``, ``best_config.yaml``, ``trials.png``, ``tuning.html`` and
``study.json`` with :func:`pipelines.tune.results.publish`, as the local study does.
"""

from __future__ import annotations

import dataclasses
import datetime
import json
import logging
from typing import Any
from urllib.parse import urlsplit

from components import storage
from components.config import GnnflowConfig
from components.errors import GnnflowError
from components.services import deadline
from components.services.endpoints import credentials_for
from pipelines.tune.records import TrialRecord, TuneResult, best_trial
from pipelines.tune.results import publish
from pipelines.tune.space import Condition, Param, SearchSpace, decode, encode

log = logging.getLogger("gnnflow.tune")

JOB_TYPE = "HyperparameterTuningJob"


def space_json(space: SearchSpace) -> str:
    """The space as the task's constant input (the one compiled into the study spec)."""
    return json.dumps({"source": space.source, "params": [dataclasses.asdict(p) for p in space.params]}, sort_keys=True)


def space_from_json(text: str) -> SearchSpace:
    raw = json.loads(text)

    def param(p: dict[str, Any]) -> Param:
        when = p.get("when")
        condition = Condition(when["key"], tuple(when["values"])) if when else None
        return Param(**{**p, "choices": tuple(p["choices"]), "when": condition})

    return SearchSpace(tuple(param(p) for p in raw["params"]), raw["source"])


def _job_name(gcp_resources: str) -> tuple[str, str]:
    """(endpoint, resource name) of the tuning job that ``gcp_resources`` (gcpc's JSON) names."""
    try:
        resources = json.loads(gcp_resources)["resources"]
        uri = next(r["resourceUri"] for r in resources if r.get("resourceType") == JOB_TYPE)
    except (ValueError, KeyError, TypeError, StopIteration):
        raise GnnflowError(f"gcp_resources names no {JOB_TYPE}: {gcp_resources[:200]!r}") from None
    parts = urlsplit(uri)
    name = parts.path.partition("/v1/")[2]
    if not parts.scheme or not parts.netloc or "/hyperparameterTuningJobs/" not in name:
        raise GnnflowError(f"gcp_resources: {uri!r} is not a Vertex AI {JOB_TYPE} URI")
    return f"{parts.scheme}://{parts.netloc}", name


def fetch_trials(gcp_resources: str) -> tuple[str, list[dict[str, Any]]]:
    """The job's name and its trials (field names as in the v1 API), read within the service deadline."""
    from google.cloud.aiplatform_v1 import HyperparameterTuningJob, JobServiceClient

    endpoint, name = _job_name(gcp_resources)
    client = JobServiceClient(credentials=credentials_for(endpoint), transport="rest", client_options={"api_endpoint": endpoint})
    service = deadline.Service("Vertex AI", endpoint)
    job = deadline.call(service, f"reading {name}", lambda: client.get_hyperparameter_tuning_job(name=name))
    as_dict = HyperparameterTuningJob.to_dict(job, use_integers_for_enums=False, preserving_proto_field_name=True)
    return name, list(as_dict.get("trials", []))


def _value(param: Param, value: Any) -> Any:
    """A trial's parameter value as the config value (Vertex AI sends numbers as doubles, choices as text)."""
    if param.type == "float":
        return float(value)
    if param.type == "int":
        return int(round(float(value)))
    texts = [encode(c) for c in param.choices]
    return param.choices[texts.index(value)] if value in texts else decode(str(value))


def _seconds(trial: dict[str, Any]) -> float:
    try:
        start, end = (datetime.datetime.fromisoformat(str(trial[k]).replace("Z", "+00:00")) for k in ("start_time", "end_time"))
    except (KeyError, ValueError):
        return 0.0
    return max(0.0, (end - start).total_seconds())


def trial_records(trials: list[dict[str, Any]], space: SearchSpace, metric: str) -> list[TrialRecord]:
    """Vertex AI's trials (``Trial`` as a dict, v1 field names) as the study's records, by trial id."""
    by_key = {p.key: p for p in space.params}
    records = []
    for trial in trials:
        params = {p["parameter_id"]: _value(by_key[p["parameter_id"]], p["value"]) for p in trial.get("parameters", [])}
        measurement = trial.get("final_measurement") or {}
        values = {m["metric_id"]: float(m["value"]) for m in measurement.get("metrics", [])}
        complete = trial.get("state") == "SUCCEEDED" and metric in values
        error = ""
        if not complete:
            reason = trial.get("infeasible_reason") or f"state {trial.get('state', 'unknown')}"
            error = reason if trial.get("state") != "SUCCEEDED" else f"reported no {metric}"
        steps = measurement.get("step_count")
        records.append(
            TrialRecord(
                number=int(trial["id"]),
                params={k: params[k] for k in space.keys if k in params},
                metric=values[metric] if complete else None,
                epochs_run=int(steps) if complete and steps is not None else None,
                seconds=_seconds(trial),
                state="COMPLETE" if complete else "FAIL",
                error=error,
                seed_metrics=(values[metric],) if complete else (),
            )
        )
    return sorted(records, key=lambda r: r.number)


def publish_study(config: GnnflowConfig, trials: list[dict[str, Any]], space: SearchSpace, metric: str, output: storage.Uri) -> TuneResult:
    """Publishes the study under ``output`` from the job's trials; the best trial's config as local tune writes it."""
    records = trial_records(trials, space, metric)
    best, best_config = best_trial(config, records)
    result = TuneResult(output, metric, space, records, best, best_config, data_ran=[], data_skipped=[])
    publish(result)
    log.info(
        "tune: %d trial(s), %d complete; best: trial %d, %s %.4f; best config: %s",
        len(records),
        sum(r.state == "COMPLETE" for r in records),
        best.number,
        metric,
        best.metric,
        output.join("best_config.yaml"),
    )
    return result
