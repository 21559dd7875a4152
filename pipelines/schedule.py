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
from dataclasses import replace
from typing import Any

from pipelines.backends import backend_for
from pipelines.run_request import RunRequest, Target, pipeline_package, prepare_run
from pipelines.schedule_spec import ScheduleInfo, ScheduleOptions, validate_cron
from pipelines.submit import add_run_arguments, add_target_arguments, run_request_from_args, target_from_args

__all__ = ["ScheduleInfo", "ScheduleOptions", "create_schedule", "delete_schedule", "list_schedules", "validate_cron"]

log = logging.getLogger("gnnflow.schedule")


# ---------------------------------------------------------------------------------- create
def create_schedule(request: RunRequest, target: Target, options: ScheduleOptions) -> ScheduleInfo:
    """Validates the config and its tables now, then creates the schedule."""
    backend = backend_for(target)
    backend.check_schedule(request, options)
    request = replace(request, enable_caching=bool(request.enable_caching))
    prepared = prepare_run(request)
    prepared = replace(
        prepared,
        parameters={**prepared.parameters, "data_version": ""},  # see the module docstring
        display_name=options.display_name or prepared.display_name.replace("gnnflow-", "gnnflow-schedule-", 1),
    )
    with pipeline_package(request, prepared.config) as package:
        info = backend.create_schedule(request, prepared, package, options)
    log.info("created schedule %s (%s, %s): config %s", info.name, info.cron, options.time_zone, prepared.parameters["config"][:120])
    return info


# ------------------------------------------------------------------- list, pause, resume, delete
def list_schedules(target: Target) -> list[ScheduleInfo]:
    return backend_for(target).list_schedules()


def pause_schedule(target: Target, name: str) -> None:
    """Vertex AI: pauses the schedule; KFP: disables the recurring run."""
    backend_for(target).pause(name)
    log.info("paused %s", name)


def resume_schedule(target: Target, name: str, catch_up: bool = False) -> None:
    """Vertex AI: resumes (``catch_up`` runs the missed ones); KFP: enables the recurring run."""
    backend_for(target).resume(name, catch_up)
    log.info("resumed %s", name)


def delete_schedule(target: Target, name: str) -> None:
    backend_for(target).delete(name)
    log.info("deleted %s", name)


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
