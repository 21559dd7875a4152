"""``python -m components.infer --config FILE|--config-yaml TEXT [--partitions URI] [--model URI] [--output URI]
[--world-size N] [--mode sampled|exact]``.

Locally it spawns N workers on this machine (one per partition); on a Vertex AI CustomJob
replica it joins the cluster described by CLUSTER_SPEC (or MASTER_ADDR / MASTER_PORT /
WORLD_SIZE / RANK).
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence

from components import storage
from components.config.arguments import add_config_arguments, required_config
from components.infer.output import MODES
from components.infer.step import infer
from components.runtime.entrypoint import run_cli


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m components.infer", description=__doc__)
    add_config_arguments(parser, required=True, help="training, resources sections, output root")
    parser.add_argument("--partitions", help="published partition output (default: <output.root>/partitions)")
    parser.add_argument("--model", help="published train output (default: <output.root>/model)")
    parser.add_argument("--output", help="output URI (default: <output.root>/embeddings)")
    parser.add_argument("--world-size", type=int, help="number of workers; must equal the number of partitions")
    parser.add_argument(
        "--mode",
        choices=MODES,
        default="auto",
        help="sampled: neighbour sampling with training.fan_outs; exact: full neighbourhoods, layer by layer (homogeneous graphs); "
        "auto (default): exact when training.mode is full_graph, else sampled",
    )
    args = parser.parse_args(argv)
    if args.world_size is not None and args.world_size < 1:
        parser.error("--world-size must be at least 1")
    return args


def main(argv: Sequence[str] | None = None) -> storage.PublishedOutput | None:
    args = parse_args(argv)
    config = required_config(args)
    if args.world_size:
        config = config.model_copy(update={"resources": config.resources.model_copy(update={"world_size": args.world_size})})
    root = storage.parse_uri(config.output.root)
    return infer(
        config,
        args.partitions or root.join("partitions"),
        args.model or root.join("model"),
        args.output or root.join("embeddings"),
        mode=args.mode,
    )


if __name__ == "__main__":
    raise SystemExit(run_cli(main))
