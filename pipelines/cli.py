"""The ``gnnflow`` command: ``init-config``, ``step NAME ...``, ``run``, ``compile``, ``submit``, ``schedule``,
``local-job``, ``tune``, ``vector-index``, ``models``, ``serve``, ``deploy`` and ``plan``."""

from __future__ import annotations

import argparse
from collections.abc import Sequence

from components.errors import GnnflowError
from components.infer.output import MODES
from components.runtime.entrypoint import run_cli
from pipelines import compile as compile_command
from pipelines import deploy as deploy_command
from pipelines import init_config, models_command, plan_command, serve_command
from pipelines import schedule as schedule_command
from pipelines import submit as submit_command
from pipelines import vector_index as vector_index_command
from pipelines.arguments import parse_set
from pipelines.local_job import command as local_job_command
from pipelines.tune import command as tune_command

STEPS = ("preprocess", "serialize", "partition", "train", "register", "infer", "report", "export")


def _step(args: argparse.Namespace) -> None:
    import importlib

    module = importlib.import_module(f"components.{args.name}.__main__")
    module.main(args.step_args)


def _run(args: argparse.Namespace) -> None:
    overrides = parse_set(args.set)
    if args.image and args.via != "kfp-docker":
        raise GnnflowError("--image applies to --via kfp-docker only (the other ways run in this environment)")
    if args.via in ("kfp-local", "kfp-docker"):
        from pipelines import kfp_local

        if args.force:
            raise GnnflowError(
                f"--force has no effect with --via {args.via}: kfp.local runs every task on every run "
                "(only the plain local run skips steps whose output is up to date)"
            )
        if args.via == "kfp-docker" and not args.image:
            raise GnnflowError("--via kfp-docker runs every task in the step image: give --image IMAGE (and DOCKER_HOST for podman)")
        print(kfp_local.summary(kfp_local.run_from_cli(args.config, args.output, overrides, args.infer_mode, args.image, args.from_model)))
        return
    from pipelines.local_run import run, summary

    print(summary(run(args.config, args.output, overrides, args.infer_mode, args.force, args.from_model)))


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="gnnflow", description="Train graph neural networks on Kubeflow / Vertex AI Pipelines, or locally."
    )
    commands = parser.add_subparsers(dest="command", required=True)

    init_config.add_parser(commands)

    step = commands.add_parser("step", help="run one step: gnnflow step NAME --help")
    step.add_argument("name", choices=STEPS)
    step.add_argument("step_args", nargs=argparse.REMAINDER, help="the step's own arguments")
    step.set_defaults(handler=_step)

    run = commands.add_parser("run", help="run the pipeline locally (default: the bundled demo)")
    run.add_argument("--config", help="config YAML; without it, the bundled demo graph")
    run.add_argument("--output", help="run root, local or gs:// (default: runs/<timestamp>, or <output.root>/<timestamp>)")
    run.add_argument(
        "--set", action="append", default=[], metavar="KEY=VALUE", help="override a config field, e.g. --set training.epochs=5 (repeatable)"
    )
    run.add_argument(
        "--infer-mode",
        choices=MODES,
        default="auto",
        help="inference mode of the infer step (auto: exact when training.mode is full_graph, else sampled)",
    )
    run.add_argument(
        "--via",
        choices=["direct", "kfp-local", "kfp-docker"],
        default="direct",
        help="direct: call the steps in order, skipping up-to-date ones; kfp-local: run the compiled DAG through kfp.local; "
        "kfp-docker: the same with each task in a container of the step image given with --image (kfp.local's DockerRunner, "
        "through the Docker API at $DOCKER_HOST)",
    )
    run.add_argument("--force", action="store_true", help="run every step even if its output is up to date")
    run.add_argument(
        "--from-model",
        metavar="MODEL",
        help="inference-only: embed the configured tables with this trained model (a published model URI, or "
        "REGISTRY@blessed / REGISTRY@vN); runs preprocess (with the model's fitted transforms), serialize, "
        "partition, infer and report, no training",
    )
    run.add_argument("--image", help="--via kfp-docker: the step image every task runs in")
    run.set_defaults(handler=_run)
    compile_command.register(commands)
    submit_command.register(commands)
    schedule_command.register(commands)
    local_job_command.register(commands)
    tune_command.register(commands)
    vector_index_command.register(commands)
    models_command.add_models_parser(commands)
    serve_command.add_parser(commands)
    deploy_command.add_parser(commands)
    plan_command.add_parser(commands)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return run_cli(lambda _: args.handler(args))


if __name__ == "__main__":
    raise SystemExit(main())
