"""``python -m components.report --config FILE|--config-yaml TEXT [--model URI] [--embeddings URI] [--output URI]``.

Reads a published train output and a published infer output and publishes the final metrics
(``metrics.json``), ``report.html`` and its PNG plots.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence

from components import storage
from components.config.arguments import add_config_arguments, required_config
from components.report.step import report
from components.runtime.entrypoint import run_cli


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m components.report", description=__doc__)
    add_config_arguments(parser, required=True, help="training.seed seeds the projection's sample; output root")
    parser.add_argument("--model", help="published train output (default: <output.root>/model)")
    parser.add_argument("--embeddings", help="published infer output (default: <output.root>/embeddings)")
    parser.add_argument("--output", help="output URI (default: <output.root>/report)")
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> storage.PublishedOutput:
    args = parse_args(argv)
    config = required_config(args)
    assert config is not None  # the argument group is required
    root = storage.parse_uri(config.output.root)
    return report(config, args.model or root.join("model"), args.embeddings or root.join("embeddings"), args.output or root.join("report"))


if __name__ == "__main__":
    raise SystemExit(run_cli(main))
