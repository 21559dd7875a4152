"""``python -m components.export --config FILE|--config-yaml TEXT [--embeddings URI] [--output URI] [--run-id ID]``.

Reads a published infer output and writes it to BigQuery (``output.bigquery``) and as Vertex AI
Vector Search input files (``output.vector_search``).
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence

from components import storage
from components.config.arguments import add_config_arguments, required_config
from components.export.step import export
from components.runtime.entrypoint import run_cli


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m components.export", description=__doc__)
    add_config_arguments(parser, required=True, help="output.bigquery, output.bigquery_write, output.vector_search, output root")
    parser.add_argument("--embeddings", help="published infer output (default: <output.root>/embeddings)")
    parser.add_argument("--output", help="output URI (default: <output.root>/export)")
    parser.add_argument("--run-id", help="the run_id column's value (default: the infer output's generation)")
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> storage.PublishedOutput:
    args = parse_args(argv)
    config = required_config(args)
    root = storage.parse_uri(config.output.root)
    return export(config, args.embeddings or root.join("embeddings"), args.output or root.join("export"), run_id=args.run_id)


if __name__ == "__main__":
    raise SystemExit(run_cli(main))
