"""``gnnflow compile -o pipeline.yaml [--image IMAGE] [--config FILE]``: the KFP pipeline spec (IR YAML).

The image and the config's ``resources`` section are fixed at compile time: the task requests,
and where the multi-worker steps run (``runner``: inside their task, or as Vertex AI CustomJobs
whose replicas, machine, accelerators, disk, service account, network and timeout are written
into the spec). The config itself, its overrides, the data version and the inference mode are
parameters of each run; a run whose config asks for another runner or replica count is refused.
"""

import argparse
import logging

from components.errors import GnnflowError

log = logging.getLogger("gnnflow.compile")


def _compile(args: argparse.Namespace) -> None:
    from components.config import ResourcesSpec
    from pipelines.dag import (
        DEFAULT_IMAGE,
        compile_pipeline,
        load_exports,
        load_registry,
        load_resources,
    )  # kfp loads only for this command

    if args.from_model and args.tuning:
        raise GnnflowError("--from-model compiles the inference-only pipeline, which trains nothing to tune: drop one of them")
    if args.tuning:
        from pipelines.tuning_pipeline import compile_tuning

        compile_tuning(args)
        return
    image = args.image or DEFAULT_IMAGE
    resources = load_resources(args.config) if args.config else None
    if args.config:
        from pipelines.sizing_report import check_compile_machines

        check_compile_machines(args.config)  # prints the sizing; refuses a machine type too small
    registry = load_registry(args.config) if args.config else None
    exports = load_exports(args.config) if args.config else False
    compile_pipeline(args.output, image, resources, export=exports, registry=registry, from_model=args.from_model)
    if args.from_model:
        log.info("inference-only pipeline: give each run the model parameter (a model URI or REGISTRY@blessed)")
    elif registry is not None and registry.uri is not None:
        log.info(
            "with a register task after train (registry %s, gate on %s)", registry.uri, registry.metric or "the task's validation metric"
        )
    if args.image is None:
        log.warning("no --image: the spec names the placeholder %r, which a cluster cannot pull", image)
    runner = resources.runner if resources else "local"
    shm_size = (resources or ResourcesSpec()).shm_size
    layout = (
        f"{resources.replica_count} replica(s) per CustomJob"
        if resources and runner == "vertex"
        else f"workers inside their tasks, with a {shm_size} in-memory /dev/shm (resources.shm_size)"
    )
    log.info(
        "wrote the pipeline spec to %s (image %s; multi-worker steps: runner %s, %s%s)",
        args.output,
        image,
        runner,
        layout,
        f"; resources from {args.config}" if args.config else "; no task requests",
    )


def register(commands: "argparse._SubParsersAction[argparse.ArgumentParser]") -> None:
    """Adds the ``compile`` subcommand to the ``gnnflow`` parser."""
    parser = commands.add_parser(
        "compile",
        help="write the KFP pipeline spec (YAML) for Vertex AI Pipelines or a KFP cluster",
        description=__doc__,
    )
    parser.add_argument("-o", "--output", required=True, help="where to write the spec: a local path or gs:// URI")
    parser.add_argument(
        "--image",
        help="the step image every task runs in, e.g. us-docker.pkg.dev/PROJECT/REPO/gnnflow:TAG "
        "(default: gnnflow:latest, a placeholder that only names the image)",
    )
    parser.add_argument(
        "--config",
        help="config YAML whose resources section sets each task's CPU / memory / accelerator "
        "(requests, step_requests) and, with runner vertex, the CustomJob of partition, train "
        "and infer (world_size, processes_per_replica, custom_job); the rest is not read",
    )
    parser.add_argument(
        "--from-model",
        action="store_true",
        help="compile the inference-only pipeline (resolve-model, preprocess with the model's transforms, serialize, partition, "
        "infer, report): each run names its model with the parameter model (a published model URI or REGISTRY@blessed)",
    )
    from pipelines.tune.command import add_tuning_arguments

    add_tuning_arguments(parser)
    parser.set_defaults(handler=_compile)
