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
    """``--set training.epochs=5`` pairs; values are YAML (numbers, booleans, lists).

    Raises:
        GnnflowError: a value is not valid YAML (e.g. an unclosed list), naming its key.
    """
    return {key: _yaml_value(key, value) for key, value in key_value_pairs(items, "--set").items()}


def _yaml_value(key: str, value: str) -> object:
    try:
        return yaml.safe_load(value)
    except yaml.YAMLError as error:
        # The parser's own text spans several lines and points into a one-line string; its
        # problem is what a user needs. An unclosed list is most often one the shell split at a space.
        problem = getattr(error, "problem", None) or str(error).splitlines()[0]
        raise GnnflowError(
            f"--set {key}={value}: not a valid YAML value ({problem}); quote a value with spaces for the shell, e.g. --set '{key}=[10, 5]'"
        ) from None
