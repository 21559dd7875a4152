"""How a step's command line receives its config: a file (``--config``) or the YAML itself (``--config-yaml``).

``--config-yaml`` takes the resolved config as text, for a script or a cluster replica started
by hand: it reads no file that could have changed (or never existed where it runs), and its
command line shows exactly what it ran with. (The replicas of the pipeline's Vertex AI
CustomJobs get the config from their task's inputs instead; see ``pipelines/vertex_job.py``.)
"""

from __future__ import annotations

import argparse

from components.config import GnnflowConfig, load_config, parse_config
from components.errors import GnnflowError


def add_config_arguments(parser: argparse.ArgumentParser, *, required: bool, help: str) -> None:
    """Adds ``--config FILE`` and ``--config-yaml TEXT``, of which at most one (exactly one if required) is given."""
    group = parser.add_mutually_exclusive_group(required=required)
    group.add_argument("--config", help=f"config YAML file, local or gs:// ({help})")
    group.add_argument("--config-yaml", metavar="TEXT", help="the config itself as YAML text (no file needed where the step runs)")


def config_from_arguments(args: argparse.Namespace) -> GnnflowConfig | None:
    """The config that ``--config`` or ``--config-yaml`` names; None when neither was given."""
    if args.config_yaml is not None:
        return parse_config(args.config_yaml, "--config-yaml")
    if args.config is not None:
        return load_config(args.config)
    return None


def required_config(args: argparse.Namespace) -> GnnflowConfig:
    """The config of a step whose parser made ``--config``/``--config-yaml`` required."""
    config = config_from_arguments(args)
    if config is None:
        raise GnnflowError("give --config FILE or --config-yaml TEXT")
    return config
