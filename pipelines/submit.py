"""``gnnflow submit``: one run of the compiled pipeline on Vertex AI Pipelines or a KFP endpoint.

What a run gets, and every check made before a request is sent, is in
:mod:`pipelines.run_request`; the services are in :mod:`pipelines.vertex_submit` (optionally
in a Vertex AI Experiment: ``--experiment``) and :mod:`pipelines.kfp_submit`. This module holds
the submission itself, ``--wait``, and the command-line arguments that ``pipelines.schedule``
shares.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import time
from typing import Any

from components.config import parse_overrides
from components.errors import GnnflowError
from components.services.deadline import ServiceUnreachable
from pipelines.arguments import key_value_pairs, parse_set
from pipelines.backends import backend_for
from pipelines.run_request import (
    KfpTarget,
    PreparedRun,
    RunRequest,
    SubmissionError,
    SubmittedRun,
    Target,
    VertexTarget,
    WaitOptions,
    api_message,
    is_retryable,
    pipeline_package,
    prepare_run,
)

__all__ = [
    "KfpTarget",
    "PreparedRun",
    "RunRequest",
    "SubmissionError",
    "SubmittedRun",
    "Target",
    "VertexTarget",
    "WaitOptions",
    "add_run_arguments",
    "add_target_arguments",
    "prepare_run",
    "run_request_from_args",
    "submit",
    "target_from_args",
    "wait_for",
]

log = logging.getLogger("gnnflow.submit")
_POLL_RETRIES = 5  # transient failures in a row that --wait rides out


def submit(request: RunRequest, target: Target, wait: WaitOptions | None = None) -> SubmittedRun:
    """Validates ``request``, submits one run to ``target`` and, with ``wait``, follows it to its end."""
    backend = backend_for(target)
    backend.check_run(request)
    prepared = prepare_run(request)
    with pipeline_package(request, prepared.config) as package:
        run = backend.submit(request, prepared, package)
    log.info("submitted %s; parameters data_version=%s overrides=%s", run.name, run.parameters["data_version"], run.parameters["overrides"])
    log.info("follow it at %s", run.url)
    return wait_for(run, target, wait) if wait else run


def wait_for(run: SubmittedRun, target: Target, options: WaitOptions) -> SubmittedRun:
    """Polls until ``run`` ends; an error naming the run unless it succeeded."""
    backend = backend_for(target)
    done, succeeded = backend.done_states, backend.succeeded

    def poll() -> tuple[str, str]:
        return backend.poll(run)

    start, last, failures = time.monotonic(), None, 0
    while True:
        try:
            state, error = poll()
            failures = 0
        except Exception as exc:  # noqa: BLE001
            failures += 1
            if isinstance(exc.__cause__, ServiceUnreachable):
                raise  # the poll already retried until the service deadline
            if not is_retryable(exc) or failures > _POLL_RETRIES:
                raise SubmissionError(f"cannot get the state of {run.name}: {api_message(exc)}", is_retryable(exc)) from exc
            log.warning("getting the state of %s failed (%s); trying again", run.name, api_message(exc))
            time.sleep(options.poll_seconds)
            continue
        if state != last:
            log.info("%s: %s", run.name, state)
            last = state
        if state in done:
            break
        if options.timeout_seconds is not None and time.monotonic() - start > options.timeout_seconds:
            raise GnnflowError(f"{run.name} still {state} after {options.timeout_seconds:g} s (it keeps running)")
        time.sleep(options.poll_seconds)
    if state != succeeded:
        raise GnnflowError(f"pipeline run {run.name} ended {state}" + (f": {error}" if error else ""))
    return SubmittedRun(run.target, run.name, run.display_name, run.parameters, run.url, state)


# -------------------------------------------------------------------------------- command line
def add_target_arguments(parser: argparse.ArgumentParser, *, run: bool) -> None:
    """Where runs go: Vertex AI (--project, --region, ...) or a KFP endpoint (--kfp-host)."""
    vertex = parser.add_argument_group("Vertex AI Pipelines")
    vertex.add_argument("--project", help="Google Cloud project")
    vertex.add_argument("--region", help="Vertex AI region, e.g. us-central1")
    vertex.add_argument("--api-endpoint", help="Vertex AI API endpoint (default: REGION-aiplatform.googleapis.com)")
    kfp = parser.add_argument_group("Kubeflow Pipelines")
    kfp.add_argument("--kfp-host", help="KFP API endpoint, e.g. http://localhost:8080 (token: $GNNFLOW_KFP_TOKEN)")
    kfp.add_argument("--kfp-namespace", help="namespace of a multi-user KFP deployment")
    parser.add_argument(
        "--experiment",
        help="Vertex AI: the Vertex AI Experiment the run joins (created if missing; gnnflow "
        "submit only), which records its parameters and final metrics; KFP: the "
        "experiment of the run (default: gnnflow)",
    )
    if run:
        vertex.add_argument("--pipeline-root", help="gs:// folder for the run's artifacts (KFP: optional)")
        vertex.add_argument("--service-account", help="service account the run uses (KFP: a Kubernetes one)")
        vertex.add_argument("--no-root-check", action="store_true", help="do not check that the pipeline root's bucket exists")


def target_from_args(args: argparse.Namespace) -> Target:
    root, account = getattr(args, "pipeline_root", None), getattr(args, "service_account", None)
    if args.kfp_host:
        return KfpTarget(
            args.kfp_host, args.experiment or "gnnflow", args.kfp_namespace, root, account, os.environ.get("GNNFLOW_KFP_TOKEN")
        )
    return VertexTarget(
        args.project or "", args.region or "", root, account, args.api_endpoint, not getattr(args, "no_root_check", False), args.experiment
    )


def add_run_arguments(parser: argparse.ArgumentParser) -> None:
    """What runs: the config, its overrides, naming and the pipeline package."""
    parser.add_argument("--config", required=True, help="config YAML, local or gs://")
    parser.add_argument(
        "--set", action="append", default=[], metavar="KEY=VALUE", help="override one config key (repeatable), e.g. training.epochs=5"
    )
    parser.add_argument("--overrides", help="overrides as a JSON object, e.g. '{\"training.epochs\": 5}'")
    parser.add_argument("--display-name", help="name shown in the console (default: gnnflow-<timestamp>)")
    parser.add_argument("--label", action="append", default=[], metavar="KEY=VALUE", help="Vertex AI label (repeatable)")
    parser.add_argument("--infer-mode", choices=["auto", "sampled", "exact"], default="auto")
    parser.add_argument(
        "--from-model",
        metavar="MODEL",
        help="inference-only run (the pipeline compiled with --from-model): embed the tables with this model, a published "
        "model URI or REGISTRY@blessed / REGISTRY@vN (resolved when the run starts: a schedule follows the alias)",
    )
    caching = parser.add_mutually_exclusive_group()
    caching.add_argument("--cache", dest="enable_caching", action="store_true", default=None, help="force step caching on")
    caching.add_argument("--no-cache", dest="enable_caching", action="store_false", help="rerun every step")
    package = parser.add_mutually_exclusive_group()
    package.add_argument("--package", help="a compiled pipeline YAML (default: compile now)")
    package.add_argument("--image", help="step image to compile the pipeline for")


def run_request_from_args(args: argparse.Namespace, **extra: Any) -> RunRequest:
    overrides: dict[str, Any] = parse_overrides(args.overrides, "--overrides")
    overrides.update(parse_set(args.set))  # as `gnnflow run --set`: 5 → int, true → bool
    return RunRequest(
        config=args.config,
        overrides=overrides,
        display_name=args.display_name,
        labels=key_value_pairs(args.label, "--label"),
        infer_mode=args.infer_mode,
        enable_caching=args.enable_caching,
        package=args.package,
        image=args.image,
        from_model=args.from_model,
        **extra,
    )


def _main(args: argparse.Namespace) -> None:
    wait = WaitOptions(args.poll_seconds, args.timeout) if args.wait else None
    run = submit(run_request_from_args(args, job_id=args.job_id), target_from_args(args), wait)
    print(run.name if run.state is None else f"{run.name} {run.state}", file=sys.stdout)


def register(commands: argparse._SubParsersAction) -> None:
    """Adds ``gnnflow submit``."""
    parser = commands.add_parser("submit", help="submit one run to Vertex AI Pipelines or a KFP endpoint")
    add_run_arguments(parser)
    add_target_arguments(parser, run=True)
    parser.add_argument("--job-id", help="Vertex AI job id (default: gnnflow-<timestamp>-<random>)")
    parser.add_argument("--wait", action="store_true", help="wait for the run to end; exit non-zero unless it succeeded")
    parser.add_argument("--poll-seconds", type=float, default=30.0, help="--wait: seconds between state checks (default 30)")
    parser.add_argument("--timeout", type=float, help="--wait: give up after this many seconds")
    parser.set_defaults(handler=_main)
