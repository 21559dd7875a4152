"""The search space of ``gnnflow tune``: a YAML file of dotted config keys, or a built-in default per task.

A ``--space`` file maps each key to how it is searched::

    training.learning_rate: {type: float, low: 0.001, high: 0.05, log: true}
    model.hidden_channels: {type: categorical, choices: [64, 128, 256]}
    training.fan_outs: {type: categorical, choices: [[10, 10], [15, 10]]}
    model.type: {type: categorical, choices: [graphsage, appnp, gcnii]}
    model.propagation_steps: {type: categorical, choices: [5, 10, 20], when: {model.type: [appnp]}}
    model.teleport: {type: float, low: 0.05, high: 0.3, when: {model.type: [appnp, gcnii]}}
    model.num_layers: {type: categorical, choices: [8, 16, 32], when: {model.type: [gcnii]}}

Every key and bound is checked against the config before any step runs: a key that names no
config field, a spec that is not a float / int / categorical one, ``low`` above ``high`` and a
value the field refuses are errors naming the file and the key. Only ``model.*`` and
``training.*`` keys are allowed: a study shares one preprocess / serialize / partition output,
which any other section would change. (``infer.*`` keys, Correct & Smooth's, would not change it,
but act after training, which is all a trial runs: they are refused too; see the README's tune
section for how to choose them on validation.)

**Conditional parameters.** ``when: {KEY: [VALUE, ...]}`` searches a key only in the trials whose
``KEY`` took one of the values; the other trials do not draw it, do not record it (its column in
``trials.csv`` is empty) and keep the config's value of it. ``KEY`` must be a categorical key of
the space listed above the conditional one (conditions may chain: that key may have a condition
of its own), and each value one of its choices; anything else is an error naming the file and
the key. Each of a conditional key's values is checked with its condition holding (the example's
``model.num_layers: 8`` with ``model.type: gcnii``, which a graphsage config with two fan-outs
would refuse alone). Trial 0 searches the keys whose conditions the config's own values meet.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import replace
from typing import Any

import yaml

from components import storage
from components.config import GnnflowConfig, apply_overrides
from components.errors import GnnflowError
from pipelines.tune.model_space import model_params
from pipelines.tune.params import Condition, Param, ParamType, SearchSpace, active, decode, encode, same

__all__ = ["Condition", "Param", "ParamType", "SearchSpace", "decode", "encode"]  # re-exported: where callers import them from
__all__ += ["active", "check_against", "check_conditions", "config_values", "default_space", "holding_config", "load_space"]
__all__ += ["parse_param", "searched_by_config"]

TUNABLE_SECTIONS = ("model.", "training.")
# Fields a trial may not change: what selection must not see, or what the shared data fixes.
FIXED_KEYS = ("training.evaluate_test",)
_SPEC_FIELDS: dict[str, set[str]] = {"float": {"type", "low", "high", "log", "when"}, "int": {"type", "low", "high", "log", "when"}}
_SPEC_FIELDS["categorical"] = {"type", "choices", "when"}


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
        return Param(key, "categorical", choices=tuple(choices), when=_condition(spec.get("when"), where))
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
    return Param(key, kind, low=low, high=high, log=log, when=_condition(spec.get("when"), where))


def _condition(raw: object, where: str) -> Condition | None:
    """``when: {KEY: [VALUE, ...]}``: one key, a non-empty list of its values (checked against the space later)."""
    if raw is None:
        return None
    if not isinstance(raw, Mapping) or len(raw) != 1:
        raise GnnflowError(
            f"{where}: when must map one key of the space to a list of its values, such as {{model.type: [appnp]}}, got {raw!r}"
        )
    ((key, values),) = raw.items()
    if not isinstance(key, str) or not isinstance(values, list) or not values:
        raise GnnflowError(f"{where}: when {{{key}: ...}} needs a non-empty list of {key}'s values, got {values!r}")
    return Condition(key, tuple(values))


def check_conditions(space: SearchSpace) -> None:
    """Each condition names a categorical key listed above its own, at values among that key's choices."""
    seen: dict[str, Param] = {}
    for param in space.params:
        condition = param.when
        if condition is not None:
            where = f"search space {space.source}: key '{param.key}'"
            parent = seen.get(condition.key)
            if parent is None:
                listed = "is listed below it" if condition.key in space.keys else "is not a key of the space"
                raise GnnflowError(f"{where}: its condition names '{condition.key}', which {listed} (a condition names a key above it)")
            if parent.type != "categorical":
                raise GnnflowError(
                    f"{where}: its condition names '{condition.key}', a {parent.type} key: a condition needs a categorical one"
                )
            for value in condition.values:
                if not any(same(c, value) for c in parent.choices):
                    raise GnnflowError(
                        f"{where}: its condition's value {encode(value)} is not one of the choices of '{condition.key}' "
                        f"({', '.join(encode(c) for c in parent.choices)})"
                    )
        seen[param.key] = param


def _holding_condition(space: SearchSpace, param: Param) -> dict[str, Any]:
    """Values under which ``param`` is searched: each condition up its chain at its first value."""
    values: dict[str, Any] = {}
    condition = param.when
    while condition is not None:
        values.setdefault(condition.key, condition.values[0])
        condition = space.param(condition.key).when
    return values


def check_against(space: SearchSpace, config: GnnflowConfig) -> None:
    """Every key names a tunable field of ``config`` and every bound / choice is a value it accepts."""
    for param in space.params:
        where = f"search space {space.source}: key '{param.key}'"
        if not param.key.startswith(TUNABLE_SECTIONS) or param.key in FIXED_KEYS:
            if param.key.startswith("infer."):
                raise GnnflowError(
                    f"{where} cannot be tuned: a trial runs train only, so nothing it measures depends on infer.*; "
                    "choose infer.smoothing and its alphas on the best trial's model (the README's tune section)"
                )
            raise GnnflowError(
                f"{where} cannot be tuned: trials share one preprocess/serialize/partition output and never see the "
                "test split, so only model.* and training.* keys (but training.evaluate_test) vary"
            )
        values = list(param.choices) if param.type == "categorical" else [param.low, param.high]
        # A conditional value is checked as a trial takes it: with its condition holding, at each of its values.
        contexts = [{**_holding_condition(space, param), param.when.key: v} for v in param.when.values] if param.when else [{}]
        for value in values:
            for context in contexts:
                try:
                    apply_overrides(config, {**context, param.key: value}, f"search space {space.source}")
                except GnnflowError as exc:
                    with_ = "".join(f", with {k} {encode(v)}" for k, v in context.items())
                    raise GnnflowError(f"{exc} (value {value!r} of the search space{with_})") from None


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
    check_conditions(space)
    check_against(space, config)
    return space


def _fan_out_choices(config: GnnflowConfig) -> list[list[int]]:
    current = config.training.fan_outs
    # As deep as the config samples: num_layers hops for a stack, but appnp's and gcnii's depth is their own.
    layers = len(current) if isinstance(current, list) else config.model.num_layers
    candidates = [[5] * layers, [10] * layers, [15] + [10] * (layers - 1), [25] + [15] * (layers - 1)]
    if isinstance(current, list) and current not in candidates:
        candidates.append(current)
    unique: list[list[int]] = []
    for choice in candidates:
        if choice not in unique:
            unique.append(choice)
    return unique


def _weight_decay(config: GnnflowConfig) -> Param:
    """A log scale around Adam's usual range, up to 0.1 since decay on the input layer alone
    (``training.weight_decay_scope``) takes more; a config without weight decay (0, which no log
    scale holds) gets it off or at a few usual strengths instead, so that trial 0 can be the config as given."""
    if config.training.weight_decay == 0:
        return Param("training.weight_decay", "categorical", choices=(0.0, 1e-5, 1e-4, 1e-3, 1e-2))
    return Param("training.weight_decay", "float", low=1e-6, high=1e-1, log=True)


def default_space(config: GnnflowConfig) -> SearchSpace:
    """The built-in space for the config's task.

    Both tasks: learning rate and weight decay (log scales around Adam's usual range) and what the
    decay applies to (every parameter, or the input layers), hidden width, dropout and, for
    sampled training with one fan-out list, the fan-outs (each list as
    deep as the config samples). Node classification adds the encoder and its own parameters,
    each searched only in trials of the types it belongs to, and the training mode where the graph
    trains both ways (:mod:`pipelines.tune.model_space`); the fan-outs are then searched only in
    sampled trials. Link prediction adds the negatives per positive, which sets how hard the
    ranking it learns is, and the decoder where retrieval does not need the dot one.
    """
    # GATv2 concatenates its heads: each width is rounded to a multiple of them.
    heads = config.model.attention_heads if config.model.type == "gat" else 1
    widths = tuple(max(heads, round(w / heads) * heads) for w in (32, 64, 128, 256))
    scopes = (config.training.weight_decay_scope, *(s for s in ("all", "input_layer") if s != config.training.weight_decay_scope))
    params = [
        Param("training.learning_rate", "float", low=1e-3, high=5e-2, log=True),
        Param("model.hidden_channels", "categorical", choices=widths),
        Param("model.dropout", "float", low=0.0, high=0.7),
        _weight_decay(config),
        Param("training.weight_decay_scope", "categorical", choices=scopes),
    ]
    models, mode = model_params(config)
    params += models
    fan_outs = Param("training.fan_outs", "categorical", choices=tuple(_fan_out_choices(config)))
    if mode is not None and isinstance(config.training.fan_outs, list):
        params += [mode, replace(fan_outs, when=Condition("training.mode", ("sampled",)))]
    elif config.training.mode == "sampled" and isinstance(config.training.fan_outs, list):
        params.append(fan_outs)
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


def _holding(param: Param, value: Any, source: str) -> tuple[Param, str | None]:
    """``param`` widened to hold ``value`` (the config's own), and a note of what was widened (None: it held it)."""
    if param.type == "categorical":
        if any(same(c, value) for c in param.choices):
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
    taken: dict[str, Any] = {}  # the config's values of the keys trial 0 searches
    for param in space.params:
        if param.when is not None and not param.when.holds(taken):
            params.append(param)  # trial 0 does not search it: the config's value stays, whatever the space holds
            continue
        value = _config_value(config, param.key)
        widened, note = _holding(param, value, space.source)
        params.append(widened)
        taken[param.key] = value
        if note:
            notes.append(note)
    return SearchSpace(tuple(params), space.source), notes


def config_values(space: SearchSpace, config: GnnflowConfig) -> dict[str, Any]:
    """The config's own values of the parameters trial 0 searches (those without a condition, and
    those whose condition the config's values meet), for those the space holds (a float or int inside
    its bounds, a categorical among its choices, as the choice itself): the study's first trial
    (every such key, once :func:`holding_config` has widened the space)."""
    values: dict[str, Any] = {}
    for param in space.params:
        if param.when is not None and not param.when.holds(values):
            continue
        value = _config_value(config, param.key)
        if param.type == "categorical":
            held = [c for c in param.choices if same(c, value)]
            if held:
                values[param.key] = held[0]
        elif value is not None and not isinstance(value, bool) and param.bounds[0] <= value <= param.bounds[1]:
            values[param.key] = int(value) if param.type == "int" else float(value)
    return values


def searched_by_config(space: SearchSpace, config: GnnflowConfig) -> list[Param]:
    """The parameters trial 0 searches: those :func:`config_values` must hold."""
    return active(space, config_values(space, config))
