"""What every registry backend offers, and the values it deals in."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, Protocol

from components.errors import GnnflowError

VERTEX_SCHEME = "vertex://"
_VERSION = re.compile(r"^v([1-9][0-9]*)$")


@dataclass(frozen=True)
class ModelVersion:
    """One registered model version.

    ``model_uri``: the published train output the version's files live in (for the folder and
    gs:// registries, the registry's own copy); ``metrics``: train's metrics.json;
    ``lineage``: input table URI → fingerprint; ``data_version``: the run's data version."""

    version: int
    model_uri: str
    metrics: dict[str, Any]
    created: str  # ISO 8601, UTC
    aliases: tuple[str, ...] = ()
    source_model_uri: str = ""  # where train published it
    data_version: str = ""
    lineage: dict[str, str] = field(default_factory=dict)
    config_yaml: str = ""

    @property
    def name(self) -> str:
        return f"v{self.version}"


@dataclass(frozen=True)
class AliasChange:
    """One move of an alias, with who asked and why (the registry's history)."""

    alias: str
    version: int
    previous: int | None
    reason: str
    at: str  # ISO 8601, UTC


@dataclass(frozen=True)
class GateDecision:
    """Whether a candidate passed the evaluation gate, and the sentence that says why."""

    passed: bool
    metric: str
    candidate: float
    blessed: float | None  # the blessed version's figure (None: nothing blessed yet)
    blessed_version: int | None
    max_drop: float
    reason: str


class Registry(Protocol):
    """A model registry (see the backends in :mod:`.store` and :mod:`.vertex`)."""

    @property
    def uri(self) -> str:
        """The registry's URI, as a user names it."""
        ...

    def register(
        self, model_uri: str, metrics: dict[str, Any], *, data_version: str, lineage: dict[str, str], config_yaml: str
    ) -> ModelVersion:
        """Adds the published model at ``model_uri`` as the next version (never overwriting another)."""
        ...

    def versions(self) -> list[ModelVersion]:
        """Every version, oldest first, with its aliases."""
        ...

    def resolve(self, selector: str) -> ModelVersion:
        """``blessed`` (any alias), ``latest`` or ``vN``; a GnnflowError naming the registry otherwise."""
        ...

    def set_alias(self, alias: str, version: int, reason: str) -> AliasChange:
        """Points ``alias`` at ``version``, recording the reason."""
        ...

    def history(self) -> list[AliasChange]:
        """Every alias move, oldest first."""
        ...


def parse_version(selector: str, registry: str) -> int | None:
    """``vN`` → N; None for an alias name; an error for a malformed version."""
    match = _VERSION.match(selector)
    if match:
        return int(match.group(1))
    if selector.startswith("v") and selector[1:].isdigit():
        raise GnnflowError(f"{registry}@{selector}: versions are numbered from v1")
    return None


def split_reference(text: str) -> tuple[str, str] | None:
    """``REGISTRY@SELECTOR`` → (registry, selector); None for a plain URI (no ``@`` after the last ``/``)."""
    head, sep, selector = text.rpartition("@")
    if not sep or "/" in selector or not head:
        return None
    if not selector:
        raise GnnflowError(f"{text!r}: give a version or alias after '@' (e.g. @blessed, @v3)")
    return head, selector
