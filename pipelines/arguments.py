"""Command-line values the ``gnnflow`` commands share: ``NAME=VALUE`` pairs and ``--set`` overrides."""

from __future__ import annotations

from collections.abc import Sequence

import yaml

from components.errors import GnnflowError


def key_value_pairs(items: Sequence[str], flag: str) -> dict[str, str]:
    """``NAME=VALUE`` arguments of ``flag`` as a mapping (the value may hold ``=``)."""
    bad = [item for item in items if "=" not in item or not item.partition("=")[0].strip()]
    if bad:
        raise GnnflowError(f"{flag} {bad[0]!r}: expected KEY=VALUE, e.g. training.epochs=5")
    return {key.strip(): value for key, _, value in (item.partition("=") for item in items)}


def parse_set(items: Sequence[str]) -> dict[str, object]:
    """``--set training.epochs=5`` pairs; values are YAML (numbers, booleans, lists)."""
    return {key: yaml.safe_load(value) for key, value in key_value_pairs(items, "--set").items()}
