"""Step ``register`` end to end on published models (a tmp folder and the fake-gcs-server), its
up-front checks, its command line, its KFP component, and ``gnnflow models`` through argparse.

No ``from __future__ import annotations``: KFP reads the pipeline function's annotations as types."""

import argparse
import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from kfp import compiler, dsl

from components import storage
from components.config import GnnflowConfig, parse_config
from components.config.preflight import PlannedRun
from components.demo.graph import generate_demo_graph, write_demo_graph
from components.errors import GnnflowError
from components.register import checks
from components.register.__main__ import main as register_main
from components.register.component import build_component
from components.register.component import register as register_component
from components.register.step import _promote, register
from components.registry.gate import evaluate_gate
from components.registry.open import open_registry
from components.runtime.entrypoint import run_cli
from components.storage import Uri
from components.tables.reading import tables_fingerprint
from pipelines.models_command import add_models_parser, run_models
from tests.test_registry import publish_model


@pytest.fixture(scope="module")
def tables(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    return write_demo_graph(generate_demo_graph(200, seed=1), tmp_path_factory.mktemp("tables"))


def make_config(tables: tuple[Path, Path], output: Uri, registry: str | None, **section: Any) -> GnnflowConfig:
    nodes, edges = tables
    raw = {
        "graph": {
            "nodes": [{"type": "paper", "uri": str(nodes), "label_column": "label", "features": [{"columns": ["w*"]}]}],
            "edges": [{"type": "cites", "uri": str(edges), "src_type": "paper", "dst_type": "paper"}],
        },
        "output": {"root": str(output)},
        "registry": {"uri": registry, **section},
    }
    return parse_config(yaml.safe_dump(raw), "test config")


def metrics(accuracy: float) -> dict[str, Any]:
    return {"val_accuracy": accuracy, "val_macro_f1": accuracy - 0.1, "test_accuracy": accuracy, "best_epoch": 2}


def test_register_blesses_the_first_then_gates_the_rest(root: Uri, tables: tuple[Path, Path]) -> None:
    registry_uri = str(root.join("registry"))
    config = make_config(tables, root.join("run"), registry_uri, max_drop=0.02)
    first = publish_model(root.join("run1", "model"), metrics(0.80))
    result = register(config, first.root, root.join("run1", "register"), "sha256:abc")
    assert (result.version.name, result.blessed, result.decision.passed) == ("v1", True, True)
    assert result.decision.reason == "v1 passes the gate: nothing is blessed yet (val_accuracy 0.8)"
    version = result.version
    assert version.data_version == "sha256:abc" and version.metrics == metrics(0.80)
    nodes, edges = tables
    assert version.lineage == {
        str(nodes): tables_fingerprint(config.graph.model_copy(update={"edges": []})),
        str(edges): tables_fingerprint(config.graph.model_copy(update={"nodes": []})),
    }
    assert version.lineage[str(nodes)] != version.lineage[str(edges)]
    assert parse_config(version.config_yaml, "registered config") == config
    decision = result.published.read_json("decision.json")
    assert decision == {
        "registry": registry_uri,
        "version": "v1",
        "model_uri": f"{registry_uri}/versions/v1/model",
        "source_model_uri": str(first.root),
        "blessed": True,
        "decision": {
            "passed": True,
            "metric": "val_accuracy",
            "candidate": 0.8,
            "blessed": None,
            "blessed_version": None,
            "max_drop": 0.02,
            "reason": result.decision.reason,
        },
    }
    assert result.published.manifest.step == "register"

    worse = publish_model(root.join("run2", "model"), metrics(0.77))
    refused = register(config, worse.root, root.join("run2", "register"), "sha256:def")
    assert (refused.version.name, refused.blessed) == ("v2", False)
    assert refused.decision.reason == "v2 fails the gate: val_accuracy 0.77 < blessed v1's 0.8 - max_drop 0.02 = 0.78"
    registry = open_registry(registry_uri, create=False)
    assert registry.resolve("blessed").name == "v1"  # the blessed alias stayed where it was
    assert refused.published.read_json("decision.json")["blessed"] is False

    within = publish_model(root.join("run3", "model"), metrics(0.79))
    passed = register(config, within.root, root.join("run3", "register"), "sha256:ghi")
    assert (passed.version.name, passed.blessed) == ("v3", True)
    assert registry.resolve("blessed").name == "v3"
    assert [(c.version, c.previous, c.reason) for c in registry.history()] == [
        (1, None, result.decision.reason),
        (3, 1, "v3 passes the gate: val_accuracy 0.79 >= blessed v1's 0.8 - max_drop 0.02 = 0.78"),
    ]
    again = register(config, within.root, root.join("run3", "register"), "sha256:ghi")  # a retried task
    assert (again.version.name, again.blessed, again.decision.reason) == (
        "v3",
        True,
        "v3 passed the gate before (this registration was retried); blessed is v3 now",
    )
    assert len(registry.versions()) == 3 and len(registry.history()) == 2
    best = register(config, publish_model(root.join("run4", "model"), metrics(0.9)).root, root.join("run4", "register"), "")
    assert (best.version.name, best.blessed) == ("v4", True)
    late = register(config, within.root, root.join("run3", "register"), "sha256:ghi")  # v3's task retried after v4 won
    assert (late.version.name, late.blessed) == ("v3", False)
    assert late.decision.reason == "v3 passed the gate before (this registration was retried); blessed is v4 now"
    assert registry.resolve("blessed").name == "v4"


def test_a_blessed_moved_while_gating_is_judged_again(tmp_path: Path) -> None:
    """The gate read v1 as blessed; v2 took the alias before v3's promotion landed: v3 is judged
    against v2, which it does not match, and v2 gets the alias back."""
    root = storage.parse_uri(tmp_path)
    registry = open_registry(str(tmp_path / "registry"), create=True)
    for accuracy in (0.7, 0.9, 0.8):
        model = publish_model(root.join(f"m{accuracy}"), metrics(accuracy))
        registry.register(str(model.root), metrics(accuracy), data_version="", lineage={}, config_yaml="")
    registry.set_alias("blessed", 1, "first")
    v1, v2, v3 = registry.versions()
    stale = evaluate_gate(v3.metrics, v1, "val_accuracy", 0.0, candidate_version=3)
    registry.set_alias("blessed", 2, "another train's gate")
    final = _promote(registry, v3, stale, "val_accuracy", 0.0)
    assert not final.passed and final.reason == "v3 fails the gate: val_accuracy 0.8 < blessed v2's 0.9"
    assert registry.resolve("blessed").name == "v2"
    assert [(c.version, c.previous, c.reason) for c in registry.history()][-2:] == [
        (3, 2, stale.reason),
        (2, 3, f"restored: {final.reason}"),
    ]


def test_the_gate_metric_can_be_chosen(tmp_path: Path, tables: tuple[Path, Path]) -> None:
    root = storage.parse_uri(tmp_path)
    config = make_config(tables, root.join("run"), str(tmp_path / "registry"), metric="val_macro_f1")
    register(config, publish_model(root.join("a"), metrics(0.8)).root, root.join("ra"), "")
    result = register(config, publish_model(root.join("b"), {**metrics(0.9), "val_macro_f1": 0.6}).root, root.join("rb"), "")
    assert not result.blessed and result.decision.reason == "v2 fails the gate: val_macro_f1 0.6 < blessed v1's 0.7"


def test_a_metric_the_task_does_not_produce_is_refused_before_the_run(tmp_path: Path, tables: tuple[Path, Path]) -> None:
    root = storage.parse_uri(tmp_path)
    config = make_config(tables, root.join("run"), str(tmp_path / "registry"), metric="val_roc_auc")
    message = (
        r"^registry.metric 'val_roc_auc' is not a validation metric that node_classification produces: "
        r"choose one of val_accuracy, val_macro_f1$"
    )
    with pytest.raises(GnnflowError, match=message):
        checks.before_run(PlannedRun(config))
    with pytest.raises(GnnflowError, match=message):
        register(config, publish_model(root.join("m"), metrics(0.8)).root, root.join("out"), "")
    assert not (tmp_path / "registry").exists() and not (tmp_path / "out").exists()


def test_a_missing_bucket_is_refused_before_the_run(gcs_emulator: object, tmp_path: Path, tables: tuple[Path, Path]) -> None:
    config = make_config(tables, storage.parse_uri(tmp_path), "gs://no-such-registry-bucket/models")
    with pytest.raises(
        GnnflowError, match=r"^model registry gs://no-such-registry-bucket/models cannot be created: bucket .* does not exist$"
    ):
        checks.before_run(PlannedRun(config))
    checks.before_run(PlannedRun(make_config(tables, storage.parse_uri(tmp_path), None)))  # no registry: nothing to check
    checks.before_run(PlannedRun(make_config(tables, storage.parse_uri(tmp_path), str(tmp_path / "new"))))


def test_bad_inputs_publish_nothing(tmp_path: Path, tables: tuple[Path, Path]) -> None:
    root = storage.parse_uri(tmp_path)
    unpublished = root.join("never")
    config = make_config(tables, root.join("run"), str(tmp_path / "registry"))
    with pytest.raises(GnnflowError, match=rf"^{unpublished} is not a published output"):
        register(config, unpublished, root.join("out"), "")
    no_metric = publish_model(root.join("m"), {"val_macro_f1": 0.5})
    with pytest.raises(GnnflowError, match=r"metrics.json has no 'val_accuracy' \(it has val_macro_f1\)$"):
        register(config, no_metric.root, root.join("out"), "")
    with pytest.raises(GnnflowError, match=r"^register: registry.uri is not set"):
        register(make_config(tables, root.join("run"), None), no_metric.root, root.join("out"), "")
    assert not (tmp_path / "registry").exists() and not (tmp_path / "out").exists()


def test_the_command_line(tmp_path: Path, tables: tuple[Path, Path], capsys: pytest.CaptureFixture[str]) -> None:
    root = storage.parse_uri(tmp_path)
    config = make_config(tables, root.join("run"), str(tmp_path / "registry"))
    config_file = tmp_path / "config.yaml"
    config_file.write_text(config.to_yaml())
    publish_model(root.join("run", "model"), metrics(0.8))
    result = register_main(["--config", str(config_file), "--data-version", "v-1"])
    assert (result.version.name, result.blessed, result.version.data_version) == ("v1", True, "v-1")
    assert storage.open_published(root.join("run", "register")).read_json("decision.json")["version"] == "v1"
    assert capsys.readouterr().out == "v1 blessed: v1 passes the gate: nothing is blessed yet (val_accuracy 0.8)\n"
    second = register_main(["--config-yaml", config.to_yaml(), "--model", str(root.join("run", "model")), "--output", str(tmp_path / "o")])
    assert second.version.name == "v1"  # the same published model: found, not added again
    assert second.version.data_version == "v-1"
    bad = config.model_copy(update={"registry": config.registry.model_copy(update={"metric": "val_auc"})})
    assert run_cli(register_main, ["--config-yaml", bad.to_yaml()]) == 2
    errors = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error: ")]
    assert errors == [
        "error: registry.metric 'val_auc' is not a validation metric that node_classification produces: "
        "choose one of val_accuracy, val_macro_f1"
    ]


def test_the_kfp_component_returns_blessed_and_version(tmp_path: Path, tables: tuple[Path, Path]) -> None:
    root = storage.parse_uri(tmp_path)
    config = make_config(tables, root.join("run"), str(tmp_path / "registry"))
    model = dsl.Model(name="model", uri=str(publish_model(root.join("model"), metrics(0.8)).root), metadata={})
    registration = dsl.Artifact(name="registration", uri=str(tmp_path / "registration"), metadata={})
    outputs = register_component(config.to_yaml(), "{}", "sha256:x", model, registration)
    assert outputs.Output is True and registration.metadata["version"] == "v1"
    assert registration.metadata["version"] == "v1" and registration.metadata["blessed"] is True
    assert storage.open_published(registration.uri).read_json("decision.json")["version"] == "v1"
    worse = dsl.Model(name="model", uri=str(publish_model(root.join("worse"), metrics(0.5)).root), metadata={})
    second = dsl.Artifact(name="r", uri=str(tmp_path / "r2"), metadata={})
    refused = register_component(config.to_yaml(), "{}", "", worse, second)
    assert refused.Output is False and second.metadata["version"] == "v2"
    with pytest.raises(SystemExit) as stopped:  # a bad config ends the task with the step's exit status
        register_component(config.to_yaml(), '{"registry.metric": "val_auc"}', "", worse, registration)
    assert stopped.value.code == 2


def test_the_component_gates_a_compiled_dag(tmp_path: Path) -> None:
    op = build_component("example.com/gnnflow:test")

    @dsl.pipeline(name="gated")
    def gated(config: str) -> None:
        model = dsl.importer(artifact_uri="gs://b/model", artifact_class=dsl.Model, reimport=False)
        task = op(config=config, overrides="{}", data_version="", model=model.output)
        with dsl.If(task.outputs["Output"] == True, name="blessed"):  # noqa: E712 - a KFP condition
            # Any task stands in for infer, report and export here.
            op(config=config, overrides="{}", data_version="", model=model.output)

    path = tmp_path / "gated.yaml"
    compiler.Compiler().compile(gated, str(path))
    spec = yaml.safe_load(path.read_text())
    outputs = spec["components"]["comp-register"]["outputDefinitions"]
    assert outputs["parameters"] == {"Output": {"parameterType": "BOOLEAN"}}
    assert set(outputs["artifacts"]) == {"registration"}
    condition = spec["root"]["dag"]["tasks"]["condition-1"]["triggerPolicy"]["condition"]
    assert condition == "inputs.parameter_values['pipelinechannel--register-Output'] == true"


@pytest.mark.filterwarnings("ignore:You may be attemping to run a task:RuntimeWarning")  # the image is this environment
def test_the_component_runs_under_kfp_local(tmp_path: Path, tables: tuple[Path, Path]) -> None:
    """KFP's own executor runs the function and reads its named outputs (SubprocessRunner, this environment)."""
    import kfp.local

    root = storage.parse_uri(tmp_path)
    config = make_config(tables, root.join("run"), str(tmp_path / "registry"))
    model = publish_model(root.join("model"), metrics(0.8))
    kfp.local.init(runner=kfp.local.SubprocessRunner(use_venv=False), pipeline_root=str(tmp_path / "pipeline"), raise_on_error=True)
    op = build_component("example.com/gnnflow:test")

    @dsl.pipeline(name="register-only")
    def registering(config: str, model_uri: str) -> bool:
        imported = dsl.importer(artifact_uri=model_uri, artifact_class=dsl.Model)
        task = op(config=config, overrides="{}", data_version="sha256:kfp", model=imported.output)
        with dsl.If(task.outputs["Output"] == True, name="blessed"):  # noqa: E712 - a KFP condition
            op(config=config, overrides="{}", data_version="sha256:again", model=imported.output)
        return task.outputs["Output"]

    assert registering(config=config.to_yaml(), model_uri=str(model.root)).output is True
    # The branch ran (kfp.local skips one whose condition it cannot resolve, silently): the second task's folder.
    assert len(list((tmp_path / "pipeline").glob("register-only-*/register-2/registration"))) == 1
    version = open_registry(str(tmp_path / "registry"), create=False).resolve("blessed")
    assert (version.name, version.data_version) == ("v1", "sha256:kfp")


def test_gnnflow_models_through_argparse(root: Uri, capsys: pytest.CaptureFixture[str]) -> None:
    registry_uri = str(root.join("registry"))
    registry = open_registry(registry_uri, create=True)
    for accuracy in (0.7, 0.8):
        model = publish_model(root.join(f"m{accuracy}"), metrics(accuracy))
        registry.register(str(model.root), metrics(accuracy), data_version="", lineage={}, config_yaml="")
    parser = argparse.ArgumentParser(prog="gnnflow")
    add_models_parser(parser.add_subparsers(dest="command", required=True))

    def gnnflow(*argv: str, status: int = 0) -> str:
        args = parser.parse_args(list(argv))
        assert args.handler is run_models
        assert run_cli(lambda _: run_models(args), []) == status
        captured = capsys.readouterr()
        return captured.out if status == 0 else "\n".join(line for line in captured.err.splitlines() if line.startswith("error: "))

    assert gnnflow("models", "promote", "--registry", registry_uri, "--version", "v1", "--reason", "baseline") == (
        f"{registry_uri}: blessed moved from unset to v1 (baseline)\n"
    )
    assert "moved from v1 to v2 (better)" in gnnflow(
        "models", "promote", "--registry", registry_uri, "--version", "v2", "--reason", "better"
    )
    listed = json.loads(gnnflow("models", "list", "--registry", registry_uri, "--json"))
    assert [(v["version"], v["aliases"]) for v in listed] == [("v1", []), ("v2", ["blessed"])]
    assert gnnflow("models", "list", "--registry", registry_uri).splitlines()[2].split()[5] == "blessed"
    assert "moved from v2 to v1 (drift)" in gnnflow("models", "rollback", "--registry", registry_uri, "--reason", "drift")
    assert gnnflow("models", "rollback", "--registry", registry_uri, status=2) == (
        "error: give --reason TEXT: why the alias moves (it is recorded in the registry's history)"
    )
    assert gnnflow("models", "list", "--registry", registry_uri + "-missing", status=2).startswith(
        f"error: model registry {registry_uri}-missing does not exist"
    )
