"""The parts of a search space: a parameter (one dotted config key and how it is searched), the
condition under which a conditional one is searched, and a parameter's values as trial text."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

import yaml

from components.errors import GnnflowError

ParamType = Literal["float", "int", "categorical"]


def encode(value: Any) -> str:
    """A choice as the text a trial parameter carries (YAML that reads back to the value): ``64``, ``[15,10]``."""
    return json.dumps(value, separators=(",", ":")) if not isinstance(value, str) else value


def decode(text: str) -> Any:
    return yaml.safe_load(text)


def same(choice: Any, value: Any) -> bool:
    """A choice equal to a value: by its text, or as numbers (1 and 1.0), never a bool as a number."""
    if encode(choice) == encode(value):
        return True
    numbers = all(isinstance(v, int | float) and not isinstance(v, bool) for v in (choice, value))
    return numbers and choice == value


@dataclass(frozen=True)
class Condition:
    """A parameter is searched only in trials whose ``key`` (a categorical parameter listed before
    it) took one of ``values``; other trials keep the config's value of it."""

    key: str
    values: tuple[Any, ...]

    def holds(self, values: Mapping[str, Any]) -> bool:
        """True when ``values`` (a trial's parameters so far) hold ``key`` at one of ``values``."""
        return self.key in values and any(same(v, values[self.key]) for v in self.values)

    def describe(self) -> str:
        return f"when {self.key} is {' or '.join(encode(v) for v in self.values)}"


@dataclass(frozen=True)
class Param:
    """How one dotted config key is searched. Categorical choices may be lists (fan-outs)."""

    key: str
    type: ParamType
    low: float | int | None = None
    high: float | int | None = None
    log: bool = False
    choices: tuple[Any, ...] = ()
    when: Condition | None = None  # None: searched in every trial

    @property
    def bounds(self) -> tuple[float, float]:
        """(low, high) of a float or int parameter."""
        if self.low is None or self.high is None:
            raise GnnflowError(f"{self.key}: a {self.type} parameter needs low and high")
        return float(self.low), float(self.high)

    def describe(self) -> str:
        condition = f" ({self.when.describe()})" if self.when else ""
        if self.type == "categorical":
            return f"{self.key}: one of {', '.join(encode(c) for c in self.choices)}{condition}"
        return f"{self.key}: {self.type} in [{self.low:g}, {self.high:g}]{' (log)' if self.log else ''}{condition}"


@dataclass(frozen=True)
class SearchSpace:
    params: tuple[Param, ...]  # a conditional parameter comes after the one its condition names
    source: str  # the file, or "the default space for <task>"

    @property
    def keys(self) -> list[str]:
        return [p.key for p in self.params]

    def param(self, key: str) -> Param:
        return next(p for p in self.params if p.key == key)


def active(space: SearchSpace, values: Mapping[str, Any]) -> list[Param]:
    """The parameters a trial whose categorical values are ``values`` searches: those without a
    condition, and those whose condition holds (its key active itself and at one of its values)."""
    taken: dict[str, Any] = {}
    searched = []
    for param in space.params:
        if param.when is None or param.when.holds(taken):
            searched.append(param)
            if param.key in values:
                taken[param.key] = values[param.key]
    return searched
