"""``python -m components.register --config FILE|--config-yaml TEXT [--model URI] [--output URI] [--data-version V]``.

Registers a published train output as the next version of ``registry.uri``, evaluates the gate
against the blessed version (promoting the new one when it passes) and publishes the decision.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence

from components import storage
from components.config.arguments import add_config_arguments, required_config
from components.register.step import RegisterResult, register
from components.runtime.entrypoint import run_cli
from components.tables.reading import tables_fingerprint


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m components.register", description=__doc__)
    add_config_arguments(parser, required=True, help="the registry section; graph tables for lineage; output root")
    parser.add_argument("--model", help="published train output (default: <output.root>/model)")
    parser.add_argument("--output", help="output URI (default: <output.root>/register)")
    parser.add_argument("--data-version", help="the input tables' data version to record (default: sha256: and a fingerprint of them now)")
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> RegisterResult:
    args = parse_args(argv)
    config = required_config(args)
    root = storage.parse_uri(config.output.root)
    data_version = args.data_version if args.data_version is not None else "sha256:" + tables_fingerprint(config.graph)
    result = register(config, args.model or root.join("model"), args.output or root.join("register"), data_version)
    print(f"{result.version.name} {'blessed' if result.blessed else 'not blessed'}: {result.decision.reason}")
    return result


if __name__ == "__main__":
    raise SystemExit(run_cli(main))
