"""``python -m components.train --config FILE|--config-yaml TEXT [--input URI] [--output URI] [--world-size N]``.

Locally it spawns N trainers on this machine; on a Vertex AI CustomJob replica it joins the
cluster described by CLUSTER_SPEC (or MASTER_ADDR / MASTER_PORT / WORLD_SIZE / RANK).
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence

from components import storage
from components.config.arguments import add_config_arguments, required_config
from components.runtime.entrypoint import run_cli
from components.train.step import train


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m components.train", description=__doc__)
    add_config_arguments(parser, required=True, help="model, training, resources sections")
    parser.add_argument("--input", help="published partition output (default: <output.root>/partitions)")
    parser.add_argument("--output", help="output URI (default: <output.root>/model)")
    parser.add_argument("--world-size", type=int, help="number of trainers; must equal the number of partitions")
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> storage.PublishedOutput | None:
    args = parse_args(argv)
    config = required_config(args)
    if args.world_size:
        config = config.model_copy(update={"resources": config.resources.model_copy(update={"world_size": args.world_size})})
    root = storage.parse_uri(config.output.root)
    return train(config, args.input or root.join("partitions"), args.output or root.join("model"))


if __name__ == "__main__":
    raise SystemExit(run_cli(main))
