"""The model part of the default search space of node classification: which encoder, each
encoder's own parameters (searched only in trials of that encoder), and the training mode.

Which ``model.type`` values a study offers is decided by the config's own validators: a type is a
choice when the config with that type (and the values a trial of it takes) is accepted, so ``gcn``
appears only for a homogeneous graph with node features (``appnp`` and ``gcnii`` have a typed form
for the others), and ``training.mode`` only where every offered type trains full-graph. A trial keeps the
config's value of every key it does not search, so a type is offered only where those values mean
the same to it: ``model.num_layers`` is a stack's depth (graphsage, gcn, gat, rgcn: one fan-out per
layer) and APPNP's MLP depth, which the space leaves as the config has it, and gcnii's layer count,
which gcnii trials search. A gcnii config's 16 layers are neither, so a gcnii config keeps its type
and tunes gcnii's own parameters; nor is an appnp config's MLP depth a stack's when it differs from
the hops the config samples (init-config's one-layer MLP against its two fan-outs), so such a config
offers appnp and gcnii only.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from components.config import GnnflowConfig, apply_overrides
from components.errors import GnnflowError
from pipelines.tune.params import Condition, Param

# The encoders a study may choose between (gat and rgcn are searched only when the config has them:
# their own parameters, heads and relations, are not in the default space).
CANDIDATE_TYPES = ("graphsage", "gcn", "appnp", "gcnii")
STACK_TYPES = ("graphsage", "gcn", "gat", "rgcn")  # model.num_layers is their depth, one fan-out per layer
PROPAGATION_STEPS = (5, 10, 20)  # APPNP's K: the paper's 10, half and double
GCNII_LAYERS = (8, 16, 32)  # GCNII's paper ranges 2 to 64 on the citation graphs; 16 is gnnflow's default
TELEPORT = (0.05, 0.3)  # APPNP's alpha (0.1 in the paper, searched over [0.05, 0.2]); GCNII's initial residual (0.1)
IDENTITY_STRENGTH = (0.25, 1.5)  # GCNII's lambda: 0.5 in the paper, 0.6 to 1.5 on some of its graphs


def sampled_depth(config: GnnflowConfig) -> int:
    """How many hops the config's one fan-out list samples (model.num_layers when it has a mapping)."""
    fan_outs = config.training.fan_outs
    return len(fan_outs) if isinstance(fan_outs, list) else config.model.num_layers


def _companions(config: GnnflowConfig, model_type: str) -> dict[str, Any] | None:
    """The values a trial of ``model_type`` takes beside the config's, at the shallowest its conditional
    parameters allow; None when none of them reaches the sampled depth."""
    depth = sampled_depth(config)
    if model_type in STACK_TYPES and config.model.type == "appnp" and config.model.num_layers != depth:
        return None  # the MLP's depth would become the stack's: not what the config means by it
    if model_type == "gcnii" and config.model.type != "gcnii":
        layers = [n for n in GCNII_LAYERS if n >= depth]
        return {"model.num_layers": layers[0]} if layers else None
    if model_type == "appnp" and config.model.type != "appnp":
        steps = [k for k in PROPAGATION_STEPS if k >= depth]
        return {"model.propagation_steps": steps[0]} if steps else None
    return {}


def _valid(config: GnnflowConfig, model_type: str, mode: str | None = None) -> bool:
    """Whether the config accepts a trial of ``model_type`` (in ``mode``, or the config's)."""
    companions = _companions(config, model_type)
    if companions is None:
        return False
    overrides = {"model.type": model_type, **companions, **({"training.mode": mode} if mode else {})}
    try:
        apply_overrides(config, overrides, "the default search space")
    except GnnflowError:
        return False
    return True


def type_choices(config: GnnflowConfig) -> tuple[str, ...]:
    """The config's type first, then each candidate a trial of it would train validly."""
    own = config.model.type
    if own == "gcnii":
        return (own,)
    return (own, *(t for t in CANDIDATE_TYPES if t != own and _valid(config, t)))


def _full_graph_choice(config: GnnflowConfig, types: tuple[str, ...]) -> Param | None:
    """``training.mode`` when every type choice trains both ways on this graph (node classification on a
    homogeneous graph with node features, encoders graphsage, gcn, appnp, gcnii); None otherwise."""
    modes = ("sampled", "full_graph") if config.training.mode == "sampled" else ("full_graph", "sampled")
    if not all(_valid(config, t, modes[1]) for t in types):
        return None
    return Param("training.mode", "categorical", choices=modes)


def model_params(config: GnnflowConfig) -> tuple[list[Param], Param | None]:
    """Node classification's model parameters (``model.type`` first, each type's own after it) and
    ``training.mode`` where both modes train (the fan-outs, searched after it, are then sampled-only)."""
    if config.task.type != "node_classification":
        return [], None
    types = type_choices(config)
    depth = sampled_depth(config)
    params = [Param("model.type", "categorical", choices=types)] if len(types) > 1 else []

    own = [
        (("graphsage", "rgcn"), Param("model.aggregation", "categorical", choices=("mean", "max", "sum"))),
        (("appnp",), Param("model.propagation_steps", "categorical", choices=tuple(k for k in PROPAGATION_STEPS if k >= depth))),
        (("appnp", "gcnii"), Param("model.teleport", "float", low=TELEPORT[0], high=TELEPORT[1])),
        (("gcnii",), Param("model.identity_strength", "float", low=IDENTITY_STRENGTH[0], high=IDENTITY_STRENGTH[1])),
        (("gcnii",), Param("model.num_layers", "categorical", choices=tuple(n for n in GCNII_LAYERS if n >= depth))),
    ]
    for owners, param in own:
        held = tuple(t for t in types if t in owners)
        if not held or (param.type == "categorical" and not param.choices):
            continue  # no trial's type reads it (or no value reaches the sampled depth: the config's stays)
        params.append(replace(param, when=None if len(held) == len(types) else Condition("model.type", held)))
    return params, _full_graph_choice(config, types)
