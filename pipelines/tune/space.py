"""The search space of ``gnnflow tune``: a YAML file of dotted config keys, or a built-in default per task.

A ``--space`` file maps each key to how it is searched::

    training.learning_rate: {type: float, low: 0.001, high: 0.05, log: true}
    model.hidden_channels: {type: categorical, choices: [64, 128, 256]}
    training.fan_outs: {type: categorical, choices: [[10, 10], [15, 10]]}

Every key and bound is checked against the config before any step runs: a key that names no
config field, a spec that is not a float / int / categorical one, ``low`` above ``high`` and a
value the field refuses are errors naming the file and the key. Only ``model.*`` and
``training.*`` keys are allowed: a study shares one preprocess / serialize / partition output,
which any other section would change.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any, Literal

import yaml

from components import storage
from components.config import GnnflowConfig, apply_overrides
from components.errors import GnnflowError

ParamType = Literal["float", "int", "categorical"]
TUNABLE_SECTIONS = ("model.", "training.")
# Fields a trial may not change: what selection must not see, or what the shared data fixes.
FIXED_KEYS = ("training.evaluate_test",)
_SPEC_FIELDS: dict[str, set[str]] = {"float": {"type", "low", "high", "log"}, "int": {"type", "low", "high", "log"}}
_SPEC_FIELDS["categorical"] = {"type", "choices"}


@dataclass(frozen=True)
class Param:
    """How one dotted config key is searched. Categorical choices may be lists (fan-outs)."""

    key: str
    type: ParamType
    low: float | int | None = None
    high: float | int | None = None
    log: bool = False
    choices: tuple[Any, ...] = ()

    @property
    def bounds(self) -> tuple[float, float]:
        """(low, high) of a float or int parameter."""
        if self.low is None or self.high is None:
            raise GnnflowError(f"{self.key}: a {self.type} parameter needs low and high")
        return float(self.low), float(self.high)

    def describe(self) -> str:
        if self.type == "categorical":
            return f"{self.key}: one of {', '.join(encode(c) for c in self.choices)}"
        return f"{self.key}: {self.type} in [{self.low:g}, {self.high:g}]{' (log)' if self.log else ''}"


@dataclass(frozen=True)
class SearchSpace:
    params: tuple[Param, ...]
    source: str  # the file, or "the default space for <task>"

    @property
    def keys(self) -> list[str]:
        return [p.key for p in self.params]


def encode(value: Any) -> str:
    """A choice as the text a trial parameter carries (YAML that reads back to the value): ``64``, ``[15,10]``."""
    return json.dumps(value, separators=(",", ":")) if not isinstance(value, str) else value


def decode(text: str) -> Any:
    return yaml.safe_load(text)


def _number(value: object, where: str, integer: bool) -> float | int:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or (integer and not isinstance(value, int)):
        raise GnnflowError(f"{where} must be {'an integer' if integer else 'a number'}, got {value!r}")
    if not math.isfinite(value):
        raise GnnflowError(f"{where} must be finite, got {value!r}")
    return value


def parse_param(key: object, spec: object, source: str) -> Param:
    """One entry of a space file, its shape checked (its values are checked against the config later)."""
    if not isinstance(key, str) or not key:
        raise GnnflowError(f"search space {source}: key {key!r} is not a dotted config key such as training.learning_rate")
    where = f"search space {source}: key '{key}'"
    if not isinstance(spec, Mapping):
        raise GnnflowError(f"{where}: expected a mapping such as {{type: float, low: 0.001, high: 0.1, log: true}}, got {spec!r}")
    kind = spec.get("type")
    if kind not in _SPEC_FIELDS:
        raise GnnflowError(f"{where}: type {kind!r} is not one of float, int, categorical")
    unknown = sorted(set(spec) - _SPEC_FIELDS[kind])
    if unknown:
        raise GnnflowError(f"{where}: '{unknown[0]}' does not apply to type {kind} (allowed: {', '.join(sorted(_SPEC_FIELDS[kind]))})")
    if kind == "categorical":
        choices = spec.get("choices")
        if not isinstance(choices, list) or not choices:
            raise GnnflowError(f"{where}: categorical needs a non-empty list of choices")
        if len({encode(c) for c in choices}) != len(choices):
            raise GnnflowError(f"{where}: choices {choices} repeat a value")
        return Param(key, "categorical", choices=tuple(choices))
    for bound in ("low", "high"):
        if bound not in spec:
            raise GnnflowError(f"{where}: type {kind} needs '{bound}'")
    low = _number(spec["low"], f"{where}: low", kind == "int")
    high = _number(spec["high"], f"{where}: high", kind == "int")
    log = spec.get("log", False)
    if not isinstance(log, bool):
        raise GnnflowError(f"{where}: log must be true or false, got {log!r}")
    if low >= high:
        raise GnnflowError(f"{where}: low {low} must be below high {high}")
    if log and low <= 0:
        raise GnnflowError(f"{where}: a log scale needs low > 0, got {low}")
    return Param(key, kind, low=low, high=high, log=log)


def check_against(space: SearchSpace, config: GnnflowConfig) -> None:
    """Every key names a tunable field of ``config`` and every bound / choice is a value it accepts."""
    for param in space.params:
        where = f"search space {space.source}: key '{param.key}'"
        if not param.key.startswith(TUNABLE_SECTIONS) or param.key in FIXED_KEYS:
            raise GnnflowError(
                f"{where} cannot be tuned: trials share one preprocess/serialize/partition output and never see the "
                "test split, so only model.* and training.* keys (but training.evaluate_test) vary"
            )
        values = list(param.choices) if param.type == "categorical" else [param.low, param.high]
        for value in values:
            try:
                apply_overrides(config, {param.key: value}, f"search space {space.source}")
            except GnnflowError as exc:
                raise GnnflowError(f"{exc} (value {value!r} of the search space)") from None


def load_space(uri: str, config: GnnflowConfig) -> SearchSpace:
    """A ``--space`` file, validated against ``config``."""
    source = str(storage.parse_uri(uri))
    try:
        raw = yaml.safe_load(storage.read_text(uri))
    except yaml.YAMLError as exc:
        raise GnnflowError(f"search space {source} is not valid YAML: {exc}") from exc
    if not isinstance(raw, dict) or not raw:
        raise GnnflowError(f"search space {source} must be a non-empty mapping of dotted config keys to specs")
    space = SearchSpace(tuple(parse_param(key, spec, source) for key, spec in raw.items()), source)
    check_against(space, config)
    return space


def _fan_out_choices(config: GnnflowConfig) -> list[list[int]]:
    layers = config.model.num_layers
    candidates = [[5] * layers, [10] * layers, [15] + [10] * (layers - 1), [25] + [15] * (layers - 1)]
    current = config.training.fan_outs
    if isinstance(current, list) and current not in candidates:
        candidates.append(current)
    unique: list[list[int]] = []
    for choice in candidates:
        if choice not in unique:
            unique.append(choice)
    return unique


def _weight_decay(config: GnnflowConfig) -> Param:
    """A log scale around Adam's usual range; a config without weight decay (0, which no log scale
    holds) gets it off or at a few usual strengths instead, so that trial 0 can be the config as given."""
    if config.training.weight_decay == 0:
        return Param("training.weight_decay", "categorical", choices=(0.0, 1e-5, 1e-4, 1e-3, 1e-2))
    return Param("training.weight_decay", "float", low=1e-6, high=1e-2, log=True)


def default_space(config: GnnflowConfig) -> SearchSpace:
    """The built-in space for the config's task.

    Both tasks: learning rate and weight decay (log scales around Adam's usual range), hidden
    width, dropout and, for sampled training with one fan-out list, the fan-outs (each list as
    long as model.num_layers). Link prediction adds the negatives per positive, which sets how
    hard the ranking it learns is, and the decoder where retrieval does not need the dot one.
    """
    # GATv2 concatenates its heads: each width is rounded to a multiple of them.
    heads = config.model.attention_heads if config.model.type == "gat" else 1
    widths = tuple(max(heads, round(w / heads) * heads) for w in (32, 64, 128, 256))
    params = [
        Param("training.learning_rate", "float", low=1e-3, high=5e-2, log=True),
        Param("model.hidden_channels", "categorical", choices=widths),
        Param("model.dropout", "float", low=0.0, high=0.7),
        _weight_decay(config),
    ]
    if config.training.mode == "sampled" and isinstance(config.training.fan_outs, list):
        params.append(Param("training.fan_outs", "categorical", choices=tuple(_fan_out_choices(config))))
    if config.task.type == "link_prediction":
        params.append(Param("training.negative_ratio", "categorical", choices=(1.0, 2.0, 4.0)))
        if config.retrieval.enabled is not True:
            params.append(Param("model.decoder", "categorical", choices=("dot", "mlp")))
    space = SearchSpace(tuple(params), f"the default space for {config.task.type}")
    check_against(space, config)
    return space


def _config_value(config: GnnflowConfig, key: str) -> Any:
    value: Any = config.model_dump(mode="json")
    for part in key.split("."):
        value = value.get(part) if isinstance(value, dict) else None
    return value


def _same(choice: Any, value: Any) -> bool:
    """A choice equal to the config's value: by its text, or as numbers (1 and 1.0), never a bool as a number."""
    if encode(choice) == encode(value):
        return True
    numbers = all(isinstance(v, int | float) and not isinstance(v, bool) for v in (choice, value))
    return numbers and choice == value


def _holding(param: Param, value: Any, source: str) -> tuple[Param, str | None]:
    """``param`` widened to hold ``value`` (the config's own), and a note of what was widened (None: it held it)."""
    if param.type == "categorical":
        if any(_same(c, value) for c in param.choices):
            return param, None
        return replace(param, choices=(*param.choices, value)), f"{param.key}: added the config's {encode(value)} to the choices"
    where = f"search space {source}: key '{param.key}'"
    low, high = param.bounds
    if isinstance(value, bool) or not isinstance(value, int | float) or (param.type == "int" and not isinstance(value, int)):
        raise GnnflowError(
            f"{where}: the config's value {value!r} is not a{'n integer' if param.type == 'int' else ' number'}, so trial 0 "
            "could not train the config as given; set the field in the config, or search it as categorical (choices may hold null)"
        )
    if low <= value <= high:
        return param, None
    if param.log and value <= 0:
        raise GnnflowError(
            f"{where}: the config's value {value!r} lies outside [{low:g}, {high:g}], and a log scale cannot reach it, so trial 0 "
            "could not train the config as given; set a positive value in the config, or give the key a linear scale (log: false)"
        )
    widened = replace(param, low=min(param.low, value), high=max(param.high, value))  # type: ignore[type-var]
    return widened, f"{param.key}: [{low:g}, {high:g}] widened to [{widened.bounds[0]:g}, {widened.bounds[1]:g}] for the config's {value:g}"


def holding_config(space: SearchSpace, config: GnnflowConfig) -> tuple[SearchSpace, list[str]]:
    """The space widened, where needed, to hold the config's own value of every key, and what was widened.

    Trial 0 trains the config as given, so that a study measures its gain over it and never
    recommends a config that scored below it on validation: a value the space did not hold would
    be drawn at random instead. Widening (a bound moved to the value, or the value added to the
    choices) keeps the user's config runnable and the rest of the space as written; a value no
    widening can hold (null, or zero on a log scale) is refused naming the key.
    """
    params, notes = [], []
    for param in space.params:
        widened, note = _holding(param, _config_value(config, param.key), space.source)
        params.append(widened)
        if note:
            notes.append(note)
    return SearchSpace(tuple(params), space.source), notes


def config_values(space: SearchSpace, config: GnnflowConfig) -> dict[str, Any]:
    """The config's own values of the space's parameters, for those the space holds (a float or int
    inside its bounds, a categorical among its choices, as the choice itself); the study's first trial
    (every key, once :func:`holding_config` has widened the space)."""
    values: dict[str, Any] = {}
    for param in space.params:
        value = _config_value(config, param.key)
        if param.type == "categorical":
            held = [c for c in param.choices if _same(c, value)]
            if held:
                values[param.key] = held[0]
        elif value is not None and not isinstance(value, bool) and param.bounds[0] <= value <= param.bounds[1]:
            values[param.key] = int(value) if param.type == "int" else float(value)
    return values
