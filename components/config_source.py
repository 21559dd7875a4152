"""How a step's command line receives its config: a file (``--config``) or the YAML itself (``--config-yaml``).

``--config-yaml`` exists for the replicas of a Vertex AI CustomJob: the pipeline task that
submits the job has already resolved the config parameter and its overrides, and hands the
result to every replica inside the job's arguments, so a replica reads no file that could have
changed (or never existed where it runs) and the job's request shows exactly what it ran with.
"""

from __future__ import annotations

import argparse

from components.config import GnnflowConfig, load_config, parse_config


def add_config_arguments(parser: argparse.ArgumentParser, *, required: bool, help: str) -> None:
    """Adds ``--config FILE`` and ``--config-yaml TEXT``, of which at most one (exactly one if required) is given."""
    group = parser.add_mutually_exclusive_group(required=required)
    group.add_argument("--config", help=f"config YAML file, local or gs:// ({help})")
    group.add_argument("--config-yaml", metavar="TEXT", help="the config itself as YAML text (what a CustomJob replica receives)")


def config_from_arguments(args: argparse.Namespace) -> GnnflowConfig | None:
    """The config that ``--config`` or ``--config-yaml`` names; None when neither was given."""
    if args.config_yaml is not None:
        return parse_config(args.config_yaml, "--config-yaml")
    if args.config is not None:
        return load_config(args.config)
    return None
