"""``python -m components.partition --input URI --output URI [--world-size N] [--config FILE|--config-yaml TEXT]``.

Locally it spawns N workers on this machine; on a Vertex AI CustomJob replica it joins the
cluster described by CLUSTER_SPEC (or MASTER_ADDR / MASTER_PORT / WORLD_SIZE / RANK).
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence

from components import storage
from components.config import PartitionSpec
from components.config.arguments import add_config_arguments, config_from_arguments
from components.config.resources import ThreadsSpec, WorkerTimeouts
from components.partition.step import partition
from components.runtime.entrypoint import run_cli


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m components.partition", description=__doc__)
    parser.add_argument("--input", help="published serialize output (default: <output.root>/tfrecords)")
    parser.add_argument("--output", help="output URI (default: <output.root>/partitions)")
    add_config_arguments(parser, required=False, help="partition and resources sections, output root")
    parser.add_argument("--world-size", type=int, help="number of workers (default: resources.world_size)")
    parser.add_argument("--processes-per-replica", type=int, help="worker processes per cluster replica")
    args = parser.parse_args(argv)
    if args.config is None and args.config_yaml is None and not (args.input and args.output):
        parser.error("give --input and --output, or --config to derive them from output.root")
    if args.world_size is not None and args.world_size < 1:
        parser.error("--world-size must be at least 1")
    return args


def main(argv: Sequence[str] | None = None) -> storage.PublishedOutput | None:
    args = parse_args(argv)
    config = config_from_arguments(args)
    root = storage.parse_uri(config.output.root) if config else None
    return partition(
        args.input or root.join("tfrecords"),  # type: ignore[union-attr]
        args.output or root.join("partitions"),  # type: ignore[union-attr]
        config.partition if config else PartitionSpec(),
        args.world_size or (config.resources.world_size if config else 1),
        args.processes_per_replica or (config.resources.processes_per_replica if config else 1),
        config.resources.worker_timeouts if config else WorkerTimeouts(),
        config.resources.threads if config else ThreadsSpec(),
    )


if __name__ == "__main__":
    raise SystemExit(run_cli(main))
