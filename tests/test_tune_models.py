"""``gnnflow tune`` chooses the model: the default space's encoder and its conditional parameters,
that sampled trials are valid configs that carry only the parameters their conditions allow, that
trial 0 is the config as given, and the ``when:`` conditions of a ``--space`` file (no training:
configs are parsed in memory, trials drawn by the study's own sampler)."""

from __future__ import annotations

import pathlib
from typing import Any

import optuna
import pytest
import yaml

from components.config import GnnflowConfig, apply_overrides, parse_config
from components.errors import GnnflowError
from pipelines.cli import main as gnnflow
from pipelines.tune.space import SearchSpace, config_values, default_space, holding_config, load_space, searched_by_config
from pipelines.tune.study import TuneOptions, params_of, sample, tpe_sampler
from pipelines.tune.vertex import parameter_specs
from pipelines.tune.vertex_study import space_from_json, space_json

HOMOGENEOUS = {
    "nodes": [{"type": "paper", "uri": "nodes.csv", "label_column": "label", "features": [{"columns": ["f*"]}]}],
    "edges": [{"type": "cites", "uri": "edges.csv", "src_type": "paper", "dst_type": "paper"}],
}
HETEROGENEOUS = {
    "nodes": [
        {"type": "paper", "uri": "n.csv", "label_column": "label", "features": [{"columns": ["f*"]}]},
        {"type": "author", "uri": "a.csv", "features": [{"columns": ["g*"]}]},
    ],
    "edges": [
        {"type": "writes", "uri": "w.csv", "src_type": "author", "dst_type": "paper"},
        {"type": "cites", "uri": "c.csv", "src_type": "paper", "dst_type": "paper"},
    ],
}
CONDITIONS = {
    "model.aggregation": ("graphsage",),
    "model.propagation_steps": ("appnp",),
    "model.teleport": ("appnp", "gcnii"),
    "model.identity_strength": ("gcnii",),
    "model.num_layers": ("gcnii",),
}


def config(graph: dict = HOMOGENEOUS, **sections: dict) -> GnnflowConfig:
    return parse_config(yaml.safe_dump({"graph": graph, **sections}), "test config")


def conditions(space: SearchSpace) -> dict[str, tuple[str, tuple[Any, ...]] | None]:
    return {p.key: (p.when.key, p.when.values) if p.when else None for p in space.params}


def test_the_default_space_chooses_the_encoder_with_each_ones_parameters_under_its_condition():
    space = default_space(config())  # graphsage, 2 layers, fan-outs [15, 10], sampled
    assert space.param("model.type").choices == ("graphsage", "gcn", "appnp", "gcnii")
    when = conditions(space)
    assert {key: when[key] for key in CONDITIONS} == {key: ("model.type", types) for key, types in CONDITIONS.items()}
    assert space.param("model.num_layers").choices == (8, 16, 32)  # gcnii deeper than the 2 a stack has
    assert space.param("model.propagation_steps").choices == (5, 10, 20)
    assert space.param("training.mode").choices == ("sampled", "full_graph")
    assert when["training.fan_outs"] == ("training.mode", ("sampled",))  # full_graph samples nothing
    assert space.keys.index("model.type") < space.keys.index("model.aggregation")  # a condition's key comes first
    assert when["training.learning_rate"] is None and when["model.dropout"] is None


def test_a_heterogeneous_graph_offers_appnp_and_gcnii_but_no_gcn_and_no_full_graph_mode():
    space = default_space(config(HETEROGENEOUS, model={"type": "rgcn"}))
    assert space.param("model.type").choices == ("rgcn", "graphsage", "appnp", "gcnii")  # their typed form; gcn has none
    when = conditions(space)
    assert when["model.aggregation"] == ("model.type", ("rgcn", "graphsage"))
    assert {key: when[key] for key in CONDITIONS if key != "model.aggregation"} == {
        key: ("model.type", types) for key, types in CONDITIONS.items() if key != "model.aggregation"
    }
    assert "training.mode" not in space.keys and when["training.fan_outs"] is None  # full_graph is homogeneous-only
    # A featureless homogeneous graph: gcn needs node features; appnp and gcnii learn embeddings for its nodes.
    featureless = {**HOMOGENEOUS, "nodes": [{"type": "paper", "uri": "n.csv", "label_column": "label"}]}
    assert default_space(config(featureless)).param("model.type").choices == ("graphsage", "appnp", "gcnii")


def test_a_gcnii_config_keeps_its_type_and_a_gat_config_trains_sampled_only():
    """gcnii's 16 layers are no stack's depth (one fan-out per layer), so the other types are not offered."""
    space = default_space(config(model={"type": "gcnii"}))
    assert "model.type" not in space.keys
    assert conditions(space)["model.num_layers"] is None and conditions(space)["model.identity_strength"] is None
    assert config_values(space, config(model={"type": "gcnii"}))["model.num_layers"] == 16
    gat = default_space(config(model={"type": "gat"}))
    assert gat.param("model.type").choices == ("gat", "graphsage", "gcn", "appnp", "gcnii")
    assert "training.mode" not in gat.keys and conditions(gat)["training.fan_outs"] is None  # gat has no full-graph form
    # init-config's appnp has a one-layer MLP and samples two hops: a stack of one layer is not what
    # it means, so only the propagation models are offered, in both modes.
    proposal = default_space(config(model={"type": "appnp", "num_layers": 1}, training={"mode": "full_graph"}))
    assert proposal.param("model.type").choices == ("appnp", "gcnii")
    assert proposal.param("training.mode").choices == ("full_graph", "sampled")
    assert default_space(config(model={"type": "appnp"})).param("model.type").choices == ("appnp", "graphsage", "gcn", "gcnii")
    link = default_space(config(task={"type": "link_prediction"}))
    assert "model.type" not in link.keys and "training.mode" not in link.keys  # link prediction's space is as it was


@pytest.mark.parametrize(
    "base",
    [
        {},
        {"model": {"type": "appnp"}},
        {"model": {"type": "gcn"}},
        {"training": {"mode": "full_graph"}},
        {"training": {"fan_outs": [5]}, "model": {"num_layers": 1}},
    ],
    ids=["graphsage", "appnp", "gcn", "full_graph", "one-hop"],
)
def test_sampled_trials_are_valid_configs_carrying_only_the_parameters_their_conditions_allow(base):
    given = config(**base)
    space, _ = holding_config(default_space(given), given)
    seen: set[tuple[str, str]] = set()

    def objective(trial: optuna.Trial) -> float:
        params = sample(trial, space)
        trained = apply_overrides(given, params, f"trial {trial.number}")  # the config's validators accept every trial
        assert params_of(trial, space) == params
        kind = trained.model.type
        for key, types in CONDITIONS.items():
            if key in space.keys and space.param(key).when is not None:
                assert (key in params) == (kind in types), (key, kind, params)
        if "training.fan_outs" in params:
            assert trained.training.mode == "sampled"
        seen.add((kind, trained.training.mode))
        return (trial.number * 0.618034) % 1.0  # a figure that varies, so that TPE models something

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    # The study's own sampler (seeded TPE, grouped), then seeded random draws, which reach every type in every mode.
    for sampler in (tpe_sampler(TuneOptions(trials=60, seed=3)), optuna.samplers.RandomSampler(seed=3)):
        study = optuna.create_study(direction="maximize", sampler=sampler)
        study.optimize(objective, n_trials=60)
        assert all(t.state == optuna.trial.TrialState.COMPLETE for t in study.trials)
    types = space.param("model.type").choices
    modes = space.param("training.mode").choices if "training.mode" in space.keys else (given.training.mode,)
    assert seen == {(t, m) for t in types for m in modes}  # every type is drawn in every mode


def test_trial_zero_is_the_config_as_given_with_only_the_conditions_it_meets():
    given = config(model={"type": "gcn", "dropout": 0.3})
    space, notes = holding_config(default_space(given), given)
    assert notes == []
    baseline = config_values(space, given)
    # gcn: no aggregation, propagation steps, teleport, identity strength or gcnii depth in trial 0.
    assert set(baseline) == {
        "training.learning_rate",
        "model.hidden_channels",
        "model.dropout",
        "training.weight_decay",
        "training.weight_decay_scope",
        "model.type",
        "training.mode",
        "training.fan_outs",
    }
    assert [p.key for p in searched_by_config(space, given)] == list(baseline)
    study = optuna.create_study(direction="maximize", sampler=tpe_sampler(TuneOptions(trials=3)))
    study.enqueue_trial(
        {p.key: baseline[p.key] if p.type != "categorical" else _text(baseline[p.key]) for p in searched_by_config(space, given)}
    )
    trial = study.ask()
    params = sample(trial, space)
    assert params == baseline and apply_overrides(given, params, "trial 0") == given
    # The config's own values outside the space widen it for trial 0 only where its conditions hold.
    deep = config(model={"type": "gcnii", "num_layers": 12, "teleport": 0.5})
    widened, notes = holding_config(default_space(deep), deep)
    assert notes == [
        "model.teleport: [0.05, 0.3] widened to [0.05, 0.5] for the config's 0.5",
        "model.num_layers: added the config's 12 to the choices",
    ]
    shallow = config(model={"type": "graphsage", "num_layers": 3}, training={"fan_outs": [10, 10, 10]})
    space, notes = holding_config(default_space(shallow), shallow)
    assert notes == [] and space.param("model.num_layers").choices == (8, 16, 32)  # gcnii's depths, not the stack's 3


def _text(value: Any) -> str:
    from pipelines.tune.space import encode

    return encode(value)


def _space_file(tmp_path: pathlib.Path, space: dict) -> str:
    path = tmp_path / "space.yaml"
    path.write_text(yaml.safe_dump(space, sort_keys=False))
    return str(path)


TYPES = {"model.type": {"type": "categorical", "choices": ["graphsage", "appnp", "gcnii"]}}


def test_a_space_file_states_conditions_with_when(tmp_path):
    path = _space_file(
        tmp_path,
        {
            **TYPES,
            "model.teleport": {"type": "float", "low": 0.05, "high": 0.3, "when": {"model.type": ["appnp", "gcnii"]}},
            "model.num_layers": {"type": "categorical", "choices": [8, 16], "when": {"model.type": ["gcnii"]}},
        },
    )
    space = load_space(path, config())
    assert conditions(space) == {
        "model.type": None,
        "model.teleport": ("model.type", ("appnp", "gcnii")),
        "model.num_layers": ("model.type", ("gcnii",)),
    }
    assert space.param("model.num_layers").describe() == "model.num_layers: one of 8, 16 (when model.type is gcnii)"
    assert space_from_json(space_json(space)) == space  # the tuning pipeline's copy keeps the conditions
    [spec] = parameter_specs(space)  # Vertex AI: children nest under the key their condition names
    nested = {c["parameter_spec"]["parameter_id"]: c["parent_categorical_values"]["values"] for c in spec["conditional_parameter_specs"]}
    assert spec["parameter_id"] == "model.type" and nested == {"model.teleport": ["appnp", "gcnii"], "model.num_layers": ["gcnii"]}


BAD_CONDITIONS = [
    (
        {"model.teleport": {"type": "float", "low": 0.05, "high": 0.3, "when": {"model.kind": ["appnp"]}}},
        "key 'model.teleport': its condition names 'model.kind', which is not a key of the space",
    ),
    (
        {"model.teleport": {"type": "float", "low": 0.05, "high": 0.3, "when": {"model.type": ["appnp"]}}, **TYPES},
        "key 'model.teleport': its condition names 'model.type', which is listed below it",
    ),
    (
        {**TYPES, "model.teleport": {"type": "float", "low": 0.05, "high": 0.3, "when": {"model.type": ["apnp"]}}},
        "key 'model.teleport': its condition's value apnp is not one of the choices of 'model.type' (graphsage, appnp, gcnii)",
    ),
    (
        {
            "model.dropout": {"type": "float", "low": 0.1, "high": 0.5},
            "model.teleport": {"type": "float", "low": 0.1, "high": 0.3, "when": {"model.dropout": [0.1]}},
        },
        "key 'model.teleport': its condition names 'model.dropout', a float key: a condition needs a categorical one",
    ),
    (
        {**TYPES, "model.teleport": {"type": "float", "low": 0.1, "high": 0.3, "when": {"model.type": "appnp"}}},
        "key 'model.teleport': when {model.type: ...} needs a non-empty list of model.type's values, got 'appnp'",
    ),
    (
        {**TYPES, "model.teleport": {"type": "float", "low": 0.1, "high": 0.3, "when": {"model.type": ["appnp"], "model.x": ["a"]}}},
        "key 'model.teleport': when must map one key of the space to a list of its values",
    ),
    # Checked with its condition holding: 3 gcnii layers are fine, but gcnii is not among the condition's values here.
    (
        {**TYPES, "model.num_layers": {"type": "categorical", "choices": [3], "when": {"model.type": ["graphsage"]}}},
        "training.fan_outs has 2 entries but model.num_layers is 3: give one fan-out per layer "
        "(value 3 of the search space, with model.type graphsage)",
    ),
    (
        {"infer.smoothing_alpha": {"type": "float", "low": 0.5, "high": 0.9}},
        "key 'infer.smoothing_alpha' cannot be tuned: a trial runs train only",
    ),
]


@pytest.mark.parametrize(("space", "message"), BAD_CONDITIONS, ids=[f"bad-{i}" for i in range(len(BAD_CONDITIONS))])
def test_a_bad_condition_is_refused_naming_the_file_and_key(tmp_path, space, message):
    path = _space_file(tmp_path, space)
    with pytest.raises(GnnflowError) as raised:
        load_space(path, config())
    assert message in str(raised.value) and f"search space {path}" in str(raised.value)


def test_the_command_refuses_a_bad_condition_before_any_step(tmp_path, capsys):
    (tmp_path / "config.yaml").write_text(yaml.safe_dump({"graph": HOMOGENEOUS}))
    path = _space_file(tmp_path, BAD_CONDITIONS[0][0])
    out = tmp_path / "study"
    argv = ["tune", "--config", str(tmp_path / "config.yaml"), "--output", str(out), "--trials", "2", "--space", path]
    assert gnnflow(argv) == 2
    err = capsys.readouterr().err
    assert BAD_CONDITIONS[0][1] in err and path in err and "Traceback" not in err
    assert not out.exists()
