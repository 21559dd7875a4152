"""``python -m components.preprocess --config FILE|--config-yaml TEXT [--output URI] [--fitted-state URI]``."""

from __future__ import annotations

import argparse
from collections.abc import Sequence

from components import storage
from components.config.arguments import add_config_arguments, required_config
from components.preprocess.step import load_fitted_state, preprocess
from components.runtime.entrypoint import run_cli


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m components.preprocess", description=__doc__)
    add_config_arguments(parser, required=True, help="graph, task, preprocess sections, output root")
    parser.add_argument("--output", help="output URI (default: <output.root>/preprocessed)")
    parser.add_argument("--fitted-state", help="reuse fitted statistics from this earlier preprocess output")
    parser.add_argument("--image", help="step image that Dataflow workers run (default: preprocess.beam.dataflow.sdk_container_image)")
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> storage.PublishedOutput:
    args = parse_args(argv)
    config = required_config(args)
    output = args.output or storage.parse_uri(config.output.root).join("preprocessed")
    state = load_fitted_state(args.fitted_state) if args.fitted_state else None
    return preprocess(config, output, state, image=args.image)


if __name__ == "__main__":
    raise SystemExit(run_cli(main))
