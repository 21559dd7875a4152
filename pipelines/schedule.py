"""``gnnflow schedule create|list|pause|resume|delete``: recurring runs of the pipeline.

On Vertex AI a schedule is a ``PipelineJobSchedule`` (cron with a time zone, start and end,
maximum concurrent runs and run count); on a KFP endpoint it is a recurring run (cron,
start and end, maximum concurrency).

What a scheduled run gets: every run of a schedule receives the same parameters, fixed when
the schedule is created. So by default

- ``config`` is the config's ``gs://`` URI, read when each run starts: editing that file changes
  the next runs without touching the schedule (``--embed-config`` freezes today's text instead);
- ``data_version`` is empty, since no fingerprint taken now describes tomorrow's data;
- step caching is off (``--cache`` turns it on), or every run after the first would replay the
  first run's cached outputs: the parameters it would key on never change.

For scheduled runs that do skip unchanged steps, let Cloud Scheduler publish to Pub/Sub and
deploy ``pipelines.trigger``: it validates the current config and fingerprints the current
data at every run.
"""

from __future__ import annotations

import argparse
import datetime
import logging
import re
import zoneinfo
from dataclasses import dataclass, replace
from typing import Any

from components.errors import GnnflowError
from pipelines.kfp_submit import kfp_client
from pipelines.run_request import (
    KfpTarget,
    PreparedRun,
    RunRequest,
    SubmissionError,
    Target,
    VertexTarget,
    api_message,
    check_pipeline_root,
    is_retryable,
    pipeline_package,
    prepare_run,
)
from pipelines.submit import add_run_arguments, add_target_arguments, run_request_from_args, target_from_args
from pipelines.vertex_submit import init_vertex, vertex_credentials, vertex_pipeline_job

log = logging.getLogger("gnnflow.schedule")

# (name, lowest, highest, names for values) of the five unix-cron fields
_CRON_FIELDS = (
    ("minute", 0, 59, ()),
    ("hour", 0, 23, ()),
    ("day of month", 1, 31, ()),
    ("month", 1, 12, ("JAN", "FEB", "MAR", "APR", "MAY", "JUN", "JUL", "AUG", "SEP", "OCT", "NOV", "DEC")),
    ("day of week", 0, 6, ("SUN", "MON", "TUE", "WED", "THU", "FRI", "SAT")),
)
_CRON_ITEM = re.compile(r"^(?:(?P<star>\*)|(?P<low>\w+)(?:-(?P<high>\w+))?)(?:/(?P<step>\d+))?$")


def validate_cron(cron: str) -> str:
    """A five-field unix cron expression (minute hour day-of-month month day-of-week), normalized."""
    fields = cron.split()
    if cron.strip().upper().startswith(("TZ=", "CRON_TZ=")):
        raise GnnflowError(f"cron {cron!r}: give the time zone with --time-zone, not in the expression")
    if len(fields) != 5:
        raise GnnflowError(f"cron {cron!r} has {len(fields)} fields; expected 5: minute hour day-of-month month day-of-week")
    for text, (name, low, high, names) in zip(fields, _CRON_FIELDS):
        for item in text.split(","):
            match = _CRON_ITEM.match(item.upper())
            if not match or (match["step"] is not None and int(match["step"]) == 0):
                raise GnnflowError(f"cron {cron!r}: {name} field {text!r} is not *, N, N-M, */S or N-M/S")
            if match["step"] and not match["star"] and not match["high"]:
                raise GnnflowError(f"cron {cron!r}: {name} field {text!r}: a step needs * or a range")
            bounds = [_cron_value(v, name, low, high, names, cron) for v in (match["low"], match["high"]) if v]
            if len(bounds) == 2 and bounds[0] > bounds[1]:
                raise GnnflowError(f"cron {cron!r}: {name} range {item!r} runs backwards")
    return " ".join(fields)


def _cron_value(text: str, name: str, low: int, high: int, names: tuple[str, ...], cron: str) -> int:
    value = names.index(text) + (low if name == "month" else 0) if text in names else int(text) if text.isdigit() else None
    if value is None or not low <= value <= high:
        raise GnnflowError(f"cron {cron!r}: {name} value {text!r} is outside {low}-{high}")
    return value


@dataclass(frozen=True)
class ScheduleOptions:
    """When scheduled runs start. Naive start and end times are taken in ``time_zone``."""

    cron: str
    time_zone: str = "UTC"
    display_name: str | None = None
    max_concurrent_runs: int = 1
    start_time: datetime.datetime | None = None
    end_time: datetime.datetime | None = None
    max_run_count: int | None = None
    allow_queueing: bool = False
    catch_up: bool = False

    def __post_init__(self) -> None:
        object.__setattr__(self, "cron", validate_cron(self.cron))
        try:
            zone = zoneinfo.ZoneInfo(self.time_zone)
        except (zoneinfo.ZoneInfoNotFoundError, ValueError) as exc:
            raise GnnflowError(f"--time-zone {self.time_zone!r} is not an IANA time zone (e.g. Europe/Berlin)") from exc
        if self.max_concurrent_runs < 1:
            raise GnnflowError(f"--max-concurrent-runs must be at least 1, got {self.max_concurrent_runs}")
        if self.max_run_count is not None and self.max_run_count < 1:
            raise GnnflowError(f"--max-run-count must be at least 1, got {self.max_run_count}")
        for name in ("start_time", "end_time"):
            value = getattr(self, name)
            if value is not None and value.tzinfo is None:
                object.__setattr__(self, name, value.replace(tzinfo=zone))
        if self.start_time and self.end_time and self.end_time <= self.start_time:
            raise GnnflowError(f"--end-time {self.end_time.isoformat()} is not after --start-time {self.start_time.isoformat()}")


@dataclass(frozen=True)
class ScheduleInfo:
    name: str  # Vertex AI: the schedule's resource name; KFP: the recurring run id
    display_name: str
    state: str
    cron: str


# ---------------------------------------------------------------------------------- create
def create_schedule(request: RunRequest, target: Target, options: ScheduleOptions) -> ScheduleInfo:
    """Validates the config and its tables now, then creates the schedule."""
    if isinstance(target, KfpTarget):
        unsupported = [
            flag
            for flag, used in (
                ("--time-zone", options.time_zone != "UTC"),
                ("--max-run-count", options.max_run_count),
                ("--allow-queueing", options.allow_queueing),
                ("--label", request.labels),
            )
            if used
        ]
        if unsupported:
            raise GnnflowError(f"KFP recurring runs do not support {', '.join(unsupported)} (Vertex AI schedules do; KFP crons run in UTC)")
    elif not target.pipeline_root:
        raise GnnflowError("Vertex AI needs --pipeline-root (a gs:// folder for the runs' artifacts)")
    elif target.experiment:
        raise GnnflowError("--experiment: a Vertex AI schedule cannot put its runs in an experiment (gnnflow submit can)")
    request = replace(request, enable_caching=bool(request.enable_caching))
    prepared = prepare_run(request)
    prepared = replace(
        prepared,
        parameters={**prepared.parameters, "data_version": ""},  # see the module docstring
        display_name=options.display_name or prepared.display_name.replace("gnnflow-", "gnnflow-schedule-", 1),
    )
    with pipeline_package(request, prepared.config) as package:
        if isinstance(target, VertexTarget):
            if target.check_pipeline_root:
                check_pipeline_root(target.pipeline_root or "")
            info = _create_vertex(target, request, prepared, package, options)
        else:
            info = _create_kfp(target, request, prepared, package, options)
    log.info("created schedule %s (%s, %s): config %s", info.name, info.cron, options.time_zone, prepared.parameters["config"][:120])
    return info


def _create_vertex(
    target: VertexTarget, request: RunRequest, prepared: PreparedRun, package: str, options: ScheduleOptions
) -> ScheduleInfo:
    from google.cloud import aiplatform

    init_vertex(target)
    job = vertex_pipeline_job(target, request, prepared, package)
    try:
        schedule = aiplatform.PipelineJobSchedule(
            pipeline_job=job,
            display_name=prepared.display_name,
            credentials=vertex_credentials(target),
            project=target.project,
            location=target.region,
        )
        schedule.create(
            cron=f"TZ={options.time_zone} {options.cron}",
            # (annotated as str; the proto field takes a datetime, which is what the API is sent)
            start_time=options.start_time,  # type: ignore[arg-type]
            end_time=options.end_time,  # type: ignore[arg-type]
            allow_queueing=options.allow_queueing,
            max_run_count=options.max_run_count,
            max_concurrent_run_count=options.max_concurrent_runs,
            service_account=target.service_account,
        )
    except ValueError as exc:
        raise GnnflowError(f"invalid Vertex AI schedule: {exc}") from exc
    except Exception as exc:  # noqa: BLE001
        raise SubmissionError(f"Vertex AI refused schedule {prepared.display_name!r}: {api_message(exc)}", is_retryable(exc)) from exc
    return _vertex_info(schedule)


def _create_kfp(target: KfpTarget, request: RunRequest, prepared: PreparedRun, package: str, options: ScheduleOptions) -> ScheduleInfo:
    client = kfp_client(target)
    try:
        experiment = client.create_experiment(target.experiment, namespace=target.namespace)
        created = client.create_recurring_run(
            experiment_id=experiment.experiment_id,
            job_name=prepared.display_name,
            description=f"gnnflow, config {request.config}",
            start_time=options.start_time,
            end_time=options.end_time,
            cron_expression=f"0 {options.cron}",  # KFP's cron has a leading seconds field
            max_concurrency=options.max_concurrent_runs,
            no_catchup=not options.catch_up,
            params=prepared.parameters,
            pipeline_package_path=package,
            pipeline_root=target.pipeline_root,
            enable_caching=request.enable_caching,
            service_account=target.service_account,
        )
    except Exception as exc:  # noqa: BLE001
        raise SubmissionError(
            f"KFP endpoint {target.host} refused recurring run {prepared.display_name!r}: {api_message(exc)}", is_retryable(exc)
        ) from exc
    return _kfp_info(created)


# ------------------------------------------------------------------- list, pause, resume, delete
def list_schedules(target: Target) -> list[ScheduleInfo]:
    if isinstance(target, VertexTarget):
        from google.cloud import aiplatform

        init_vertex(target)
        found = _vertex_call(
            target,
            "list schedules",
            lambda: aiplatform.PipelineJobSchedule.list(
                project=target.project, location=target.region, credentials=vertex_credentials(target)
            ),
        )
        return [_vertex_info(s) for s in found]
    client = kfp_client(target)
    infos: list[ScheduleInfo] = []
    token = ""
    while True:
        page = _kfp_call(
            target,
            "list recurring runs",
            lambda token=token: client.list_recurring_runs(page_token=token, page_size=100, namespace=target.namespace),
        )
        infos.extend(_kfp_info(r) for r in page.recurring_runs or [])
        token = page.next_page_token or ""
        if not token:
            return infos


def pause_schedule(target: Target, name: str) -> None:
    """Vertex AI: pauses the schedule; KFP: disables the recurring run."""
    if isinstance(target, VertexTarget):
        schedule = _vertex_schedule(target, name)
        _vertex_call(target, f"pause {schedule.resource_name}", schedule.pause)
    else:
        client = kfp_client(target)
        _kfp_call(target, f"disable recurring run {name}", lambda: client.disable_recurring_run(name))
    log.info("paused %s", name)


def resume_schedule(target: Target, name: str, catch_up: bool = False) -> None:
    """Vertex AI: resumes (``catch_up`` runs the missed ones); KFP: enables the recurring run."""
    if isinstance(target, VertexTarget):
        schedule = _vertex_schedule(target, name)
        _vertex_call(target, f"resume {schedule.resource_name}", lambda: schedule.resume(catch_up=catch_up))
    else:
        client = kfp_client(target)
        _kfp_call(target, f"enable recurring run {name}", lambda: client.enable_recurring_run(name))
    log.info("resumed %s", name)


def delete_schedule(target: Target, name: str) -> None:
    if isinstance(target, VertexTarget):
        schedule = _vertex_schedule(target, name)
        _vertex_call(target, f"delete {schedule.resource_name}", schedule.delete)
    else:
        client = kfp_client(target)
        _kfp_call(target, f"delete recurring run {name}", lambda: client.delete_recurring_run(name))
    log.info("deleted %s", name)


def _vertex_schedule(target: VertexTarget, name: str) -> Any:
    from google.cloud import aiplatform

    init_vertex(target)
    return _vertex_call(
        target,
        f"get schedule {name}",
        lambda: aiplatform.PipelineJobSchedule.get(
            name, project=target.project, location=target.region, credentials=vertex_credentials(target)
        ),
    )


def _vertex_call(target: VertexTarget, what: str, call: Any) -> Any:
    from google.api_core import exceptions as api_exceptions

    try:
        return call()
    except api_exceptions.NotFound as exc:
        raise GnnflowError(f"cannot {what}: not found in projects/{target.project}/locations/{target.region}") from exc
    except ValueError as exc:  # the SDK's check of a malformed resource name
        raise GnnflowError(f"cannot {what}: {exc}") from exc
    except Exception as exc:  # noqa: BLE001
        raise SubmissionError(f"Vertex AI failed to {what}: {api_message(exc)}", is_retryable(exc)) from exc


def _kfp_call(target: KfpTarget, what: str, call: Any) -> Any:
    try:
        return call()
    except Exception as exc:  # noqa: BLE001
        if getattr(exc, "status", None) == 404:
            raise GnnflowError(f"cannot {what}: not found on {target.host}") from exc
        raise SubmissionError(f"KFP endpoint {target.host} failed to {what}: {api_message(exc)}", is_retryable(exc)) from exc


def _vertex_info(schedule: Any) -> ScheduleInfo:
    resource = schedule.gca_resource
    return ScheduleInfo(resource.name, resource.display_name, resource.state.name, resource.cron)


def _kfp_info(recurring: Any) -> ScheduleInfo:
    cron = recurring.trigger.cron_schedule.cron if recurring.trigger and recurring.trigger.cron_schedule else ""
    return ScheduleInfo(recurring.recurring_run_id, recurring.display_name or "", str(recurring.status or recurring.mode), cron)


# -------------------------------------------------------------------------------- command line
def _time(text: str) -> datetime.datetime:
    try:
        return datetime.datetime.fromisoformat(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"{text!r} is not an ISO 8601 time such as 2025-01-31T02:00 or 2025-01-31T02:00:00Z") from exc


def _create(args: argparse.Namespace) -> None:
    options = ScheduleOptions(
        cron=args.cron,
        time_zone=args.time_zone,
        display_name=args.display_name,
        max_concurrent_runs=args.max_concurrent_runs,
        start_time=args.start_time,
        end_time=args.end_time,
        max_run_count=args.max_run_count,
        allow_queueing=args.allow_queueing,
        catch_up=args.catch_up,
    )
    request = run_request_from_args(args, config_as="text" if args.embed_config else "uri")
    print(create_schedule(request, target_from_args(args), options).name)


def _list(args: argparse.Namespace) -> None:
    for info in list_schedules(target_from_args(args)):
        print(f"{info.name}\t{info.display_name}\t{info.state}\t{info.cron}")


def _act(action: Any) -> Any:
    def handler(args: argparse.Namespace) -> None:
        action(target_from_args(args), args.schedule, **({"catch_up": args.catch_up} if action is resume_schedule else {}))

    return handler


def register(commands: argparse._SubParsersAction) -> None:
    """Adds ``gnnflow schedule create|list|pause|resume|delete``."""
    parser = commands.add_parser("schedule", help="recurring runs: Vertex AI schedules or KFP recurring runs")
    actions = parser.add_subparsers(dest="action", required=True)

    create = actions.add_parser("create", help="create a schedule (config read by URI at each run; see --embed-config)")
    add_run_arguments(create)
    add_target_arguments(create, run=True)
    create.add_argument("--cron", required=True, help='five-field cron: minute hour day-of-month month day-of-week, e.g. "0 3 * * 1-5"')
    create.add_argument("--time-zone", default="UTC", help="IANA time zone of the cron and of naive times (Vertex AI; default UTC)")
    create.add_argument("--max-concurrent-runs", type=int, default=1, help="runs at once (default 1)")
    create.add_argument("--start-time", type=_time, help="ISO 8601; no runs before it")
    create.add_argument("--end-time", type=_time, help="ISO 8601; no runs after it")
    create.add_argument("--max-run-count", type=int, help="stop after this many runs (Vertex AI)")
    create.add_argument(
        "--allow-queueing", action="store_true", help="queue runs beyond --max-concurrent-runs instead of skipping them (Vertex AI)"
    )
    create.add_argument("--catch-up", action="store_true", help="KFP: backfill intervals missed while disabled")
    create.add_argument("--embed-config", action="store_true", help="pass today's config text instead of its URI")
    create.set_defaults(handler=_create)

    listing = actions.add_parser("list", help="list schedules")
    add_target_arguments(listing, run=False)
    listing.set_defaults(handler=_list)

    for name, action, text in (
        ("pause", pause_schedule, "pause a schedule (KFP: disable)"),
        ("resume", resume_schedule, "resume a schedule (KFP: enable)"),
        ("delete", delete_schedule, "delete a schedule"),
    ):
        sub = actions.add_parser(name, help=text)
        sub.add_argument("schedule", help="Vertex AI: schedule id or resource name; KFP: recurring run id")
        add_target_arguments(sub, run=False)
        if action is resume_schedule:
            sub.add_argument("--catch-up", action="store_true", help="Vertex AI: start the runs missed while paused")
        sub.set_defaults(handler=_act(action))
