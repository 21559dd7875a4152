"""``gnnflow models list|promote|rollback``: the versions of a model registry, and moving its aliases.

``gnnflow models list --registry URI [--json]`` prints every version with its gate metrics and
aliases; ``gnnflow models promote --registry URI --version vN --reason TEXT`` points ``blessed``
at a version; ``gnnflow models rollback --registry URI [--to vN] --reason TEXT`` points it back at
the version blessed before the current one. Each move is recorded with its reason.
"""

from __future__ import annotations

import argparse

from components.config.registry import BLESSED
from components.registry import commands


def add_models_parser(subparsers: argparse._SubParsersAction) -> None:
    """Adds ``models`` and its three subcommands to the ``gnnflow`` parser."""
    models = subparsers.add_parser("models", help="list a model registry's versions, promote or roll back", description=__doc__)
    actions = models.add_subparsers(dest="models_command", required=True)
    registry_help = "the registry: a local folder, gs://bucket/prefix or vertex://projects/P/locations/R/models/NAME"

    listing = actions.add_parser("list", help="every version with its metrics and aliases")
    listing.add_argument("--registry", required=True, help=registry_help)
    listing.add_argument("--json", action="store_true", help="a JSON list of objects instead of a table")

    promote = actions.add_parser("promote", help="point an alias (blessed) at a version")
    promote.add_argument("--registry", required=True, help=registry_help)
    promote.add_argument("--version", required=True, metavar="vN", help="the version to promote, e.g. v3")
    promote.add_argument("--reason", help="why (required; recorded in the registry's history)")
    promote.add_argument("--alias", default=BLESSED, help=f"the alias to move (default: {BLESSED})")

    rollback = actions.add_parser("rollback", help="point an alias (blessed) back at the version it held before")
    rollback.add_argument("--registry", required=True, help=registry_help)
    rollback.add_argument("--to", metavar="vN", help="the version to roll back to (default: the one blessed before the current one)")
    rollback.add_argument("--reason", help="why (required; recorded in the registry's history)")
    rollback.add_argument("--alias", default=BLESSED, help=f"the alias to move (default: {BLESSED})")
    models.set_defaults(handler=run_models)


def run_models(args: argparse.Namespace) -> None:
    """Runs the subcommand and prints what it says."""
    if args.models_command == "list":
        print(commands.list_versions(args.registry, as_json=args.json))
    elif args.models_command == "promote":
        print(commands.promote(args.registry, args.version, args.reason, alias=args.alias))
    else:
        print(commands.rollback(args.registry, args.to, args.reason, alias=args.alias))
