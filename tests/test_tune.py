"""``gnnflow tune``: the local study for real on a 300-node demo graph (data steps once, train per
trial, validation metrics only), what it publishes, the search-space refusals made before any
step runs, and train's hypertune metrics file (what a Vertex AI trial reports)."""

from __future__ import annotations

import csv
import io
import json
import pathlib

import pytest
import yaml

from components import storage
from components.config import apply_overrides, load_config
from components.demo.graph import generate_demo_graph, write_demo_graph
from components.errors import GnnflowError
from components.tables.proposal import propose_config
from components.train import __main__ as train_main
from pipelines.cli import main as gnnflow
from pipelines.tune.space import config_values, default_space, holding_config
from pipelines.tune.study import TuneOptions, check_parallel, prepare, startup_trials, tpe_sampler

pytestmark = pytest.mark.multiworker

# The tiny config trains GATv2 of width 48 with one head. Each value of the space fits it alone,
# but 3 heads do not divide a width of 16. Trial 0 is the config's own values; seed 4 of the TPE
# sampler (whose first trials are seeded random draws) gives trial 2 that combination, which the
# config refuses, so that trial fails while trials 0 and 1 (width 48, one head) train. The
# config's learning rate (0.01) lies below the space's: the study widens it to [0.01, 0.05].
SPACE = {
    "training.learning_rate": {"type": "float", "low": 0.02, "high": 0.05, "log": True},
    "model.hidden_channels": {"type": "categorical", "choices": [16, 48]},
    "model.attention_heads": {"type": "categorical", "choices": [1, 3]},
}
SEED = 4
METRIC = "val_accuracy"


@pytest.fixture(scope="module")
def tiny_config(tmp_path_factory: pytest.TempPathFactory) -> pathlib.Path:
    folder = tmp_path_factory.mktemp("tune_data")
    nodes, edges = write_demo_graph(generate_demo_graph(300), folder)
    config = propose_config(
        str(nodes), str(edges), id_column="node_id", src_column="src", dst_column="dst", label_column="label", node_type="paper"
    )
    path = folder / "config.yaml"
    raw = config.model_dump(mode="json")
    raw["training"] |= {"mode": "sampled", "epochs": 3, "early_stopping_patience": None}
    raw["model"] |= {"type": "gat", "hidden_channels": 48, "attention_heads": 1, "num_layers": 2}
    raw["serialize"] |= {"num_shards": 1}
    path.write_text(yaml.safe_dump(raw))
    return path


def _write_space(folder: pathlib.Path, space: dict) -> pathlib.Path:
    path = folder / "space.yaml"
    path.write_text(yaml.safe_dump(space, sort_keys=False))
    return path


@pytest.fixture(scope="module")
def study(tiny_config: pathlib.Path, tmp_path_factory: pytest.TempPathFactory) -> dict:
    """One real study of three trials; what it published, read right after it (later tests rerun into its folder)."""
    folder = tmp_path_factory.mktemp("tune")
    out = folder / "study"
    space = _write_space(folder, SPACE)
    argv = ["tune", "--config", str(tiny_config), "--output", str(out), "--trials", "3", "--space", str(space), "--seed", str(SEED)]
    assert gnnflow(argv) == 0
    partitions = storage.open_published(out / "data" / "partitions", step="partition")
    models = {n: storage.open_published(out / "trials" / f"{n:03d}", step="train") for n in (0, 1)}
    return {
        "out": out,
        "rows": list(csv.DictReader(io.StringIO((out / "trials.csv").read_text()))),
        "best_config": load_config(str(out / "best_config.yaml")),
        "study": json.loads(storage.open_published(out, step="tune").read_bytes("study.json")),
        "partitions_generation": partitions.manifest.generation,
        "model_metrics": {n: m.read_json("metrics.json") for n, m in models.items()},
        "model_sources": {n: m.manifest.metadata["source"] for n, m in models.items()},
        "space": space,
    }


def test_trials_table_records_each_trial_with_its_validation_metric_and_the_failed_one_with_its_error(study):
    rows = study["rows"]
    assert list(rows[0]) == ["trial", *SPACE, METRIC, f"{METRIC}_per_seed", "epochs_run", "seconds", "state", "error"]  # no test column
    assert [r["trial"] for r in rows] == ["0", "1", "2"]
    assert [r["state"] for r in rows] == ["COMPLETE", "COMPLETE", "FAIL"]
    assert [(r["model.hidden_channels"], r["model.attention_heads"]) for r in rows] == [("48", "1"), ("48", "1"), ("16", "3")]
    failed = rows[2]
    assert "model.attention_heads 3 does not divide model.hidden_channels 16" in failed["error"]
    assert failed[METRIC] == "" and failed["epochs_run"] == ""
    for n in (0, 1):
        row, metrics = rows[n], study["model_metrics"][n]
        assert float(row[METRIC]) == pytest.approx(metrics[METRIC], rel=1e-5)
        assert row["epochs_run"] == "3" and row["error"] == ""
        assert float(row[f"{METRIC}_per_seed"]) == float(row[METRIC])  # one training per trial
        assert 0.01 <= float(row["training.learning_rate"]) <= 0.05  # the space widened to hold the config's 0.01


def test_trial_zero_is_the_config_as_given(study, tiny_config):
    """The study starts from the user's config, so its best is never below it on validation; the
    config's learning rate lies outside the space as written, which was widened to hold it."""
    config = load_config(str(tiny_config))
    assert config.training.learning_rate == 0.01 < SPACE["training.learning_rate"]["low"]
    first = study["rows"][0]
    assert float(first["training.learning_rate"]) == pytest.approx(config.training.learning_rate, rel=1e-5)
    assert study["study"]["trials"][0]["params"]["training.learning_rate"] == config.training.learning_rate
    assert (first["model.hidden_channels"], first["model.attention_heads"]) == ("48", "1")
    assert float(study["rows"][1]["training.learning_rate"]) != pytest.approx(config.training.learning_rate, rel=1e-3)  # trial 1 is drawn
    config = apply_overrides(config, {"model.hidden_channels": 64}, "test")  # a width of the default space
    space = default_space(config)
    assert config_values(space, config) == {
        "training.learning_rate": config.training.learning_rate,
        "model.hidden_channels": config.model.hidden_channels,
        "model.dropout": config.model.dropout,
        "training.weight_decay": config.training.weight_decay,
        "training.weight_decay_scope": "input_layer",  # the proposal's
        "model.type": "gat",  # gat's type only: graphsage's aggregation, appnp's and gcnii's parameters are not searched
        "training.fan_outs": config.training.fan_outs,
    }
    outside = apply_overrides(config, {"training.learning_rate": 0.5, "model.hidden_channels": 96}, "test")
    assert set(config_values(space, outside)) == {
        "model.dropout",
        "training.weight_decay",
        "training.weight_decay_scope",
        "model.type",
        "training.fan_outs",
    }  # not in the space
    widened, notes = holding_config(space, outside)
    assert config_values(widened, outside) == {**config_values(space, outside), "training.learning_rate": 0.5, "model.hidden_channels": 96}
    assert notes == [
        "training.learning_rate: [0.001, 0.05] widened to [0.001, 0.5] for the config's 0.5",
        "model.hidden_channels: added the config's 96 to the choices",
    ]
    rate = next(p for p in widened.params if p.key == "training.learning_rate")
    assert (rate.low, rate.high, rate.log) == (1e-3, 0.5, True)  # only the side the value lies past moves
    assert holding_config(widened, outside) == (widened, [])


def test_the_space_widened_for_the_config_is_said_in_the_log(tiny_config, tmp_path, caplog):
    space = _write_space(
        tmp_path, {"training.learning_rate": SPACE["training.learning_rate"], "model.dropout": {"type": "float", "low": 0.6, "high": 0.7}}
    )
    with caplog.at_level("WARNING", logger="gnnflow.tune"):
        _, widened = prepare(str(tiny_config), {}, str(space))
    bounds = {p.key: (p.low, p.high) for p in widened.params}
    assert bounds == {"training.learning_rate": (0.01, 0.05), "model.dropout": (0.5, 0.7)}
    said = [r.getMessage() for r in caplog.records]
    assert any("widened" in m and "training.learning_rate: [0.02, 0.05] widened to [0.01, 0.05] for the config's 0.01" in m for m in said)
    assert any("model.dropout: [0.6, 0.7] widened to [0.5, 0.7] for the config's 0.5" in m for m in said)


def test_a_config_value_no_widening_holds_is_refused_naming_the_key_before_any_step(tiny_config, tmp_path, capsys):
    """Zero on a log scale: trial 0 could not be the config as given, so the study is refused."""
    space = _write_space(tmp_path, {"training.weight_decay": {"type": "float", "low": 1e-5, "high": 1e-2, "log": True}})
    out = tmp_path / "study"
    argv = ["tune", "--config", str(tiny_config), "--output", str(out), "--trials", "2", "--space", str(space)]
    assert gnnflow([*argv, "--set", "training.weight_decay=0"]) == 2
    err = capsys.readouterr().err
    assert f"search space {space}: key 'training.weight_decay': the config's value 0" in err and "a log scale cannot reach it" in err
    assert "Traceback" not in err and not out.exists()
    # The default space takes a config without weight decay: off, or one of a few strengths.
    config = apply_overrides(load_config(str(tiny_config)), {"training.weight_decay": 0}, "test")
    decay = next(p for p in default_space(config).params if p.key == "training.weight_decay")
    assert decay.type == "categorical" and decay.choices[0] == 0.0
    assert config_values(default_space(config), config)["training.weight_decay"] == 0.0


def test_trials_never_evaluate_the_test_split(study):
    for metrics in study["model_metrics"].values():
        assert METRIC in metrics
        assert not [k for k in metrics if k.startswith("test_")]
    assert '"test_' not in json.dumps(study["study"]) and "test_" not in (study["out"] / "trials.csv").read_text()


def test_best_config_is_the_best_trials_params_and_loads(study):
    rows = [r for r in study["rows"] if r["state"] == "COMPLETE"]
    best = max(rows, key=lambda r: (float(r[METRIC]), -int(r["trial"])))
    assert study["study"]["best_trial"] == int(best["trial"])
    assert study["study"]["best_value"] == pytest.approx(float(best[METRIC]), rel=1e-5)
    config = study["best_config"]
    params = study["study"]["best_params"]
    assert config.training.learning_rate == params["training.learning_rate"]
    assert config.training.learning_rate == pytest.approx(float(best["training.learning_rate"]), rel=1e-5)
    assert (config.model.hidden_channels, config.model.attention_heads) == (48, 1)
    assert config.training.evaluate_test is True  # the user's setting: a run of the best config reports test figures
    assert config.training.epochs == 3


def test_plot_and_page_are_published_with_the_manifest(study):
    out = study["out"]
    published = storage.open_published(out, step="tune")
    assert set(published.manifest.files) == {"trials.csv", "best_config.yaml", "trials.png", "tuning.html", "study.json"}
    assert published.manifest.counts == {"trials": 3, "complete": 2}
    png = (out / "trials.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and png == published.read_bytes("trials.png")
    page = (out / "tuning.html").read_text()
    assert 'src="data:image/png;base64,' in page and "trials.png" in page
    assert f"Best: trial {study['study']['best_trial']}" in page


def test_data_steps_run_once_and_a_second_study_reuses_them(study, tiny_config, capsys):
    out = study["out"]
    # Every trial trained on the one partition output the study published first.
    assert set(study["model_sources"].values()) == {str(storage.parse_uri(out / "data" / "partitions"))}
    capsys.readouterr()
    argv = ["tune", "--config", str(tiny_config), "--output", str(out), "--trials", "1", "--space", str(study["space"]), "--seed", "0"]
    assert gnnflow(argv) == 0
    printed = capsys.readouterr().out
    assert "data steps ran: none; skipped (up to date): preprocess, serialize, partition" in printed
    assert storage.open_published(out / "data" / "partitions").manifest.generation == study["partitions_generation"]
    assert len(list(csv.DictReader(io.StringIO((out / "trials.csv").read_text())))) == 1


def test_a_study_whose_every_trial_fails_publishes_nothing_new(study, tiny_config, capsys):
    """Trial 0 trains the config as given, so every trial failing takes a config that fails in train:
    a learning rate that leaves the loss at chance, which train's health check stops after one epoch."""
    out = study["out"]
    before = {name: (out / name).read_bytes() for name in ("manifest.json", "trials.csv", "best_config.yaml")}
    space = {"training.learning_rate": {"type": "float", "low": 1e-9, "high": 2e-9, "log": True}}
    (out.parent / "all_fail").mkdir()
    space = _write_space(out.parent / "all_fail", space)
    settings = ["training.learning_rate=1e-9", "training.batch_size=2", "training.epochs=1", "training.stop_at_chance_epochs=1"]
    argv = ["tune", "--config", str(tiny_config), "--output", str(out), "--trials", "2", "--space", str(space)]
    code = gnnflow([*argv, *(a for setting in settings for a in ("--set", setting))])
    assert code == 2
    err = capsys.readouterr().err
    assert "every one of the 2 trial(s) failed; trial 0: " in err and "the model is not learning" in err
    assert {name: (out / name).read_bytes() for name in before} == before


BAD_SPACES = [
    ({"training.learnin_rate": {"type": "float", "low": 0.001, "high": 0.1}}, "key 'training.learnin_rate' does not name a config field"),
    ({"training.learning_rate": {"type": "float", "low": 0.1, "high": 0.001}}, "key 'training.learning_rate': low 0.1 must be below high"),
    ({"model.dropout": {"type": "string", "low": 0.1, "high": 0.5}}, "key 'model.dropout': type 'string' is not one of float, int"),
    ({"model.hidden_channels": {"type": "int", "low": 8.5, "high": 64}}, "key 'model.hidden_channels': low must be an integer"),
    ({"model.dropout": {"type": "float", "low": 0.1, "high": 1.5}}, "key 'model.dropout'"),
    ({"partition.seed": {"type": "int", "low": 0, "high": 3}}, "key 'partition.seed' cannot be tuned"),
    ({"model.dropout": {"type": "categorical", "choices": []}}, "key 'model.dropout': categorical needs a non-empty list"),
    ({"training.learning_rate": {"type": "float", "low": 0.0, "high": 0.1, "log": True}}, "a log scale needs low > 0"),
    ({"model.dropout": {"type": "float", "low": 0.1, "high": 0.5, "step": 0.1}}, "'step' does not apply to type float"),
    # The tiny config has no early stopping (null): no int space can hold that as trial 0.
    (
        {"training.early_stopping_patience": {"type": "int", "low": 2, "high": 5}},
        "key 'training.early_stopping_patience': the config's value None is not an integer",
    ),
]


@pytest.mark.parametrize(("space", "message"), BAD_SPACES, ids=[next(iter(s)) + f"-{i}" for i, (s, _) in enumerate(BAD_SPACES)])
def test_a_bad_space_is_refused_naming_the_key_before_any_step_runs(tiny_config, tmp_path, capsys, space, message):
    path = _write_space(tmp_path, space)
    out = tmp_path / "study"
    assert gnnflow(["tune", "--config", str(tiny_config), "--output", str(out), "--trials", "2", "--space", str(path)]) == 2
    err = capsys.readouterr().err
    assert message in err and str(path) in err
    assert not out.exists()  # no step ran, nothing was written


def test_a_space_that_is_not_a_mapping_is_refused(tiny_config, tmp_path, capsys):
    path = tmp_path / "space.yaml"
    path.write_text("- training.learning_rate\n")
    assert gnnflow(["tune", "--config", str(tiny_config), "--output", str(tmp_path / "o"), "--trials", "1", "--space", str(path)]) == 2
    assert f"search space {path} must be a non-empty mapping" in capsys.readouterr().err


def test_parallel_trials_must_fit_the_cores(tiny_config):
    config = load_config(str(tiny_config))
    check_parallel(config, TuneOptions(trials=4, parallel=2), cores=2)
    with pytest.raises(GnnflowError, match="--parallel 3 trials of resources.world_size 1 worker.* need 3 cores, this machine has 2"):
        check_parallel(config, TuneOptions(trials=4, parallel=3), cores=2)
    with pytest.raises(GnnflowError, match="--parallel 5 exceeds --trials 4"):
        check_parallel(config, TuneOptions(trials=4, parallel=5), cores=8)
    with pytest.raises(GnnflowError, match="--trials must be at least 1"):
        check_parallel(config, TuneOptions(trials=0), cores=8)
    with pytest.raises(GnnflowError, match="--repeats must be at least 1, got 0"):
        check_parallel(config, TuneOptions(trials=1, repeats=0), cores=8)


def test_the_sampler_guides_most_of_a_short_study():
    """Optuna's default of 10 random startup trials would leave a 12-trial study 2 guided ones."""
    assert [startup_trials(n) for n in (1, 3, 9, 12, 30, 100)] == [3, 3, 3, 4, 10, 10]
    sampler = tpe_sampler(TuneOptions(trials=12, seed=7))
    assert sampler._n_startup_trials == 4 and sampler._multivariate is True


def test_repeats_score_a_trial_by_the_mean_of_its_seeds(tiny_config, tmp_path):
    """--repeats 2: the trial trains with training.seed and seed + 1, each under its own folder, and
    its metric is their mean (a different draw per seed: both models are trained, not one twice)."""
    out = tmp_path / "study"
    space = _write_space(tmp_path, {"training.learning_rate": SPACE["training.learning_rate"]})
    argv = ["tune", "--config", str(tiny_config), "--output", str(out), "--trials", "1", "--space", str(space), "--repeats", "2"]
    assert gnnflow(argv) == 0
    seed = load_config(str(tiny_config)).training.seed
    per_seed = []
    for s in (seed, seed + 1):
        model = storage.open_published(out / "trials" / "000" / f"seed-{s}", step="train")
        assert yaml.safe_load(model.read_bytes("config.resolved.yaml"))["training"]["seed"] == s
        per_seed.append(model.read_json("metrics.json")[METRIC])
    (row,) = csv.DictReader(io.StringIO((out / "trials.csv").read_text()))
    assert [float(v) for v in row[f"{METRIC}_per_seed"].split()] == pytest.approx(per_seed, rel=1e-5)
    assert float(row[METRIC]) == pytest.approx(sum(per_seed) / 2, rel=1e-5)
    assert json.loads(storage.open_published(out, step="tune").read_bytes("study.json"))["trials"][0]["seed_values"] == pytest.approx(
        per_seed
    )


def test_train_writes_the_hypertune_metrics_file_with_trial_parameters_as_overrides(study, tmp_path, monkeypatch):
    """What a Vertex AI trial runs: train with ``--KEY=VALUE`` trial parameters appended, reporting through the metrics file."""
    out = study["out"]
    metric_file = tmp_path / "hypertune" / "output.metrics"
    monkeypatch.setenv("CLOUD_ML_HP_METRIC_FILE", str(metric_file))
    monkeypatch.setenv("CLOUD_ML_TRIAL_ID", "7")
    model = tmp_path / "model"
    monkeypatch.setenv("AIP_MODEL_DIR", str(model))  # the trial's folder: train's output when --output is absent
    argv = ["--config", str(out / "best_config.yaml"), "--input", str(out / "data" / "partitions"), "--set", "training.evaluate_test=false"]
    argv += ["--training.learning_rate=0.02", "--training.fan_outs=[5,5]", "--model.hidden_channels=16"]  # one head divides 16
    published = train_main.main(argv)  # no --hypertune-metric: the env var alone asks for the task's validation metric
    assert published is not None and published.root == storage.parse_uri(model)
    metrics = published.read_json("metrics.json")
    assert not [k for k in metrics if k.startswith("test_")]
    resolved = yaml.safe_load(published.read_bytes("config.resolved.yaml"))
    assert resolved["training"]["learning_rate"] == 0.02 and resolved["model"]["hidden_channels"] == 16
    [line] = metric_file.read_text().splitlines()
    record = json.loads(line)
    assert set(record) == {"checkpoint_path", "global_step", "timestamp", METRIC, "trial"}
    assert record[METRIC] == str(float(metrics[METRIC]))
    assert record["trial"] == "7" and record["global_step"] == str(metrics["epochs_run"]) and record["checkpoint_path"] == ""
    assert list(json.loads(line)) == sorted(record)  # keys sorted, as cloudml-hypertune writes them


def test_train_refuses_a_trial_argument_that_is_not_a_dotted_key():
    with pytest.raises(SystemExit):
        train_main.parse_args(["--config", "c.yaml", "--learning_rate=0.1"])
    args, overrides = train_main.parse_args(["--config", "c.yaml", "--training.fan_outs=[15,10]", "--set", "model.decoder=mlp"])
    assert overrides == {"model.decoder": "mlp", "training.fan_outs": [15, 10]}


def test_default_space_follows_the_task_and_the_model(tiny_config):
    config = load_config(str(tiny_config))  # node classification, GATv2 with one head, fan-outs [15, 10]
    space = default_space(config)
    basics = ["training.learning_rate", "model.hidden_channels", "model.dropout", "training.weight_decay", "training.weight_decay_scope"]
    models = ["model.type", "model.aggregation", "model.propagation_steps", "model.teleport", "model.identity_strength", "model.num_layers"]
    assert space.keys == [*basics, *models, "training.fan_outs"]  # gat has no full-graph form: no training.mode
    assert next(p for p in space.params if p.key == "training.fan_outs").choices == ([5, 5], [10, 10], [15, 10], [25, 15])
    link = apply_overrides(config, {"task.type": "link_prediction", "model.attention_heads": 3, "model.hidden_channels": 48}, "test")
    space = default_space(link)
    assert space.keys[-2:] == ["training.negative_ratio", "model.decoder"]
    widths = next(p for p in space.params if p.key == "model.hidden_channels").choices
    assert widths == (33, 63, 129, 255)  # multiples of the 3 heads, nearest to 32, 64, 128, 256


def test_a_bigquery_column_of_the_wrong_type_is_refused_before_the_data_steps(tmp_path, bigquery_dataset, capsys, caplog):
    from components.warehouse.clients import bigquery_client

    project = bigquery_dataset.split(".")[0]
    bigquery_client(project).query(
        f"CREATE TABLE `{bigquery_dataset}.papers` AS SELECT 'p1' AS paper_id, 'text' AS score UNION ALL SELECT 'p2', 'more'"
    ).result()
    bigquery_client(project).query(f"CREATE TABLE `{bigquery_dataset}.cites` AS SELECT 'p1' AS src, 'p2' AS dst").result()
    raw = {
        "graph": {
            "nodes": [
                {"type": "paper", "uri": f"bq://{bigquery_dataset}.papers", "id_column": "paper_id", "features": [{"columns": ["score"]}]}
            ],
            "edges": [{"type": "cites", "uri": f"bq://{bigquery_dataset}.cites", "src_type": "paper", "dst_type": "paper"}],
        },
        "task": {"type": "link_prediction"},
    }
    config = tmp_path / "config.yaml"
    config.write_text(yaml.safe_dump(raw))
    out = tmp_path / "study"
    assert gnnflow(["tune", "--config", str(config), "--output", str(out), "--trials", "2"]) == 2
    assert "column 'score' is STRING, but the config uses it as the numeric feature" in capsys.readouterr().err
    assert not any("==> preprocess" in record.getMessage() for record in caplog.records), "preprocess started"
