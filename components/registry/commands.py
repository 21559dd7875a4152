"""What ``gnnflow models list|promote|rollback`` do, as functions returning the text they print.

- ``list``: every version with its creation time, gate metrics, aliases and model URI (a table,
  or a JSON list of objects).
- ``promote``: points an alias (``blessed`` by default) at a version, with a reason.
- ``rollback``: points it back at the version it held before the current one (or ``--to vN``).
  The history is read as a stack: each move to a version the alias has not held since pushes it,
  a move back to one it held pops down to it; so rolling back twice goes back two versions, and a
  version rolled away from is never returned to by a later rollback.

Every move needs a reason; it is recorded with the move in the registry's history.
"""

from __future__ import annotations

import json
from typing import Any

from components.config.registry import BLESSED
from components.errors import GnnflowError
from components.registry.base import AliasChange, ModelVersion, Registry, parse_version
from components.registry.open import open_registry
from components.train.output import GATE_METRICS


def _gate_columns(versions: list[ModelVersion]) -> list[str]:
    """The gate metrics any version records, in GATE_METRICS order."""
    names = list(dict.fromkeys(m for metrics in GATE_METRICS.values() for m in metrics))
    return [m for m in names if any(m in v.metrics for v in versions)]


def _cell(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.4f}"
    return "-" if value is None else str(value)


def version_object(version: ModelVersion) -> dict[str, Any]:
    """One version as ``list --json`` prints it (without its config YAML, which can be long)."""
    return {
        "version": version.name,
        "created": version.created,
        "metrics": version.metrics,
        "aliases": list(version.aliases),
        "model_uri": version.model_uri,
        "source_model_uri": version.source_model_uri,
        "data_version": version.data_version,
        "lineage": version.lineage,
    }


def list_versions(uri: str, *, as_json: bool = False) -> str:
    """The registry's versions, oldest first: an aligned table, or a JSON list of objects."""
    versions = open_registry(uri, create=False).versions()
    if as_json:
        return json.dumps([version_object(v) for v in versions], indent=2)
    if not versions:
        return f"{uri} holds no versions yet"
    metrics = _gate_columns(versions)
    rows = [["version", "created", *metrics, "aliases", "model_uri"]]
    for v in versions:
        created = v.created[:19].replace("T", " ")
        rows.append([v.name, created, *(_cell(v.metrics.get(m)) for m in metrics), ",".join(v.aliases) or "-", v.model_uri])
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]) - 1)]
    return "\n".join("  ".join([*(cell.ljust(w) for cell, w in zip(row, widths)), row[-1]]) for row in rows)


def _reason(reason: str | None) -> str:
    if reason is None or not reason.strip():
        raise GnnflowError("give --reason TEXT: why the alias moves (it is recorded in the registry's history)")
    return reason.strip()


def _version_number(selector: str, registry: Registry) -> int:
    number = parse_version(selector, registry.uri)
    if number is None:
        raise GnnflowError(f"{selector!r} is not a version: give vN (e.g. v3); `gnnflow models list --registry {registry.uri}` lists them")
    return registry.resolve(selector).version  # an error naming the versions there are, when it does not exist


def _current(registry: Registry, alias: str) -> int | None:
    for version in registry.versions():
        if alias in version.aliases:
            return version.version
    return None


def _moved(registry: Registry, change: AliasChange) -> str:
    was = "unset" if change.previous is None else f"v{change.previous}"
    return f"{registry.uri}: {change.alias} moved from {was} to v{change.version} ({change.reason})"


def promote(uri: str, version: str, reason: str | None, *, alias: str = BLESSED) -> str:
    """Points ``alias`` at ``version`` (``vN``); says what moved."""
    why = _reason(reason)
    registry = open_registry(uri, create=False)
    number = _version_number(version, registry)
    if _current(registry, alias) == number:
        return f"{registry.uri}: {alias} already points at v{number}; nothing moved"
    return _moved(registry, registry.set_alias(alias, number, why))


def rollback_target(history: list[AliasChange], alias: str, current: int) -> int | None:
    """The version ``alias`` held before ``current`` (see the module docstring); None if none."""
    held: list[int] = []
    for change in history:
        if change.alias != alias:
            continue
        if not held and change.previous is not None:  # a history that starts after the alias was first set
            held.append(change.previous)
        if change.version in held:
            del held[held.index(change.version) + 1 :]
        else:
            held.append(change.version)
    if held and held[-1] == current:
        return held[-2] if len(held) > 1 else None
    # The history does not end where the alias is (moved by other means): its last move to here.
    moves_here = [c for c in history if c.alias == alias and c.version == current]
    return moves_here[-1].previous if moves_here else None


def rollback(uri: str, to: str | None, reason: str | None, *, alias: str = BLESSED) -> str:
    """Points ``alias`` back at the version it held before (or at ``to``); says what moved."""
    why = _reason(reason)
    registry = open_registry(uri, create=False)
    current = _current(registry, alias)
    if current is None:
        raise GnnflowError(f"{registry.uri}: no version is {alias}, so there is nothing to roll back")
    if to is not None:
        target = _version_number(to, registry)
    else:
        found = rollback_target(registry.history(), alias, current)
        if found is None:
            raise GnnflowError(f"{registry.uri}: no version was {alias} before v{current}; give --to vN to choose one")
        target = found
    if target == current:
        return f"{registry.uri}: {alias} already points at v{target}; nothing moved"
    return _moved(registry, registry.set_alias(alias, target, why))
