"""``python -m components.serialize --input URI [--output URI] [--config FILE|--config-yaml TEXT]``."""

from __future__ import annotations

import argparse
from collections.abc import Sequence

from components import storage
from components.config.arguments import add_config_arguments, config_from_arguments
from components.runtime.entrypoint import run_cli
from components.serialize.step import serialize


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m components.serialize", description=__doc__)
    parser.add_argument("--input", help="published preprocess output (default: <output.root>/preprocessed)")
    parser.add_argument("--output", help="output URI (default: <output.root>/tfrecords)")
    parser.add_argument("--image", help="step image that Dataflow workers run (default: preprocess.beam.dataflow.sdk_container_image)")
    add_config_arguments(parser, required=False, help="serialize section and output root; defaults otherwise")
    args = parser.parse_args(argv)
    if args.config is None and args.config_yaml is None and not (args.input and args.output):
        parser.error("give --input and --output, or --config to derive them from output.root")
    return args


def main(argv: Sequence[str] | None = None) -> storage.PublishedOutput:
    args = parse_args(argv)
    config = config_from_arguments(args)
    root = storage.parse_uri(config.output.root) if config else None
    source = args.input or root.join("preprocessed")  # type: ignore[union-attr]
    output = args.output or root.join("tfrecords")  # type: ignore[union-attr]
    return serialize(config, source, output, image=args.image)


if __name__ == "__main__":
    raise SystemExit(run_cli(main))
