"""The day-two pipelines as compiled: the register task and the gate (``dsl.If`` on its
``blessed`` output) of the training pipeline, and the inference-only pipeline
(``gnnflow compile --from-model``), loaded back from their IR YAML."""

from __future__ import annotations

import pytest
import yaml

from components.config import RegistrySpec
from components.errors import GnnflowError
from pipelines.cli import main as gnnflow
from pipelines.dag import compile_pipeline
from pipelines.run_request import check_package

IMAGE = "europe-docker.pkg.dev/acme-ml/gnn/gnnflow:1.4.0"


def _compile(tmp_path, name: str = "pipeline.yaml", **kwargs) -> tuple[dict, str]:
    path = tmp_path / name
    compile_pipeline(str(path), image=IMAGE, **kwargs)
    return next(yaml.safe_load_all(path.read_text())), str(path)


def _inputs(task: dict) -> dict[str, str]:
    """Input artifact → producing task."""
    return {name: a["taskOutputArtifact"]["producerTask"] for name, a in task.get("inputs", {}).get("artifacts", {}).items()}


def test_gated_pipeline_runs_infer_report_export_only_for_a_blessed_model(tmp_path):
    spec, _ = _compile(tmp_path, export=True, registry=RegistrySpec(uri="gs://models/registry", metric="val_macro_f1"))
    tasks = spec["root"]["dag"]["tasks"]
    assert _inputs(tasks["register"]) == {"model": "train"}
    assert tasks["register"]["inputs"]["parameters"]["data_version"]["componentInputParameter"] == "data_version"
    executor = spec["deploymentSpec"]["executors"][tasks["register"]["componentRef"]["name"].replace("comp-", "exec-")]
    assert {"name": "GNNFLOW_IMAGE", "value": IMAGE} in executor["container"]["env"]  # a Vertex version's serving container
    condition = next(t for name, t in tasks.items() if name.startswith("condition"))
    assert condition["triggerPolicy"]["condition"] == "inputs.parameter_values['pipelinechannel--register-Output'] == true"
    gated = spec["components"][condition["componentRef"]["name"]]["dag"]["tasks"]
    assert set(gated) == {"infer", "report", "export"}  # nothing downstream runs outside the condition
    assert not {"infer", "report", "export"} & set(tasks)
    outputs = spec["root"]["outputDefinitions"]["artifacts"]
    assert "registration" in outputs and "embeddings" not in outputs  # made inside the condition: the tasks' own


def test_downstream_always_registers_without_a_condition(tmp_path):
    spec, _ = _compile(tmp_path, registry=RegistrySpec(uri="gs://models/registry", downstream="always"))
    tasks = spec["root"]["dag"]["tasks"]
    assert {"register", "infer", "report"} <= set(tasks) and not any(n.startswith("condition") for n in tasks)
    assert _inputs(tasks["infer"])["model"] == "train"


def test_no_registry_no_register_task(tmp_path):
    spec, _ = _compile(tmp_path)
    assert "register" not in spec["root"]["dag"]["tasks"]


def test_inference_only_pipeline_trains_nothing_and_resolves_its_model_at_run_time(tmp_path):
    spec, path = _compile(tmp_path, from_model=True)
    tasks = spec["root"]["dag"]["tasks"]
    assert set(tasks) == {"resolve-model", "preprocess-with-model", "serialize", "partition", "infer", "report"}
    assert spec["root"]["inputDefinitions"]["parameters"]["model"]["parameterType"] == "STRING"
    assert tasks["resolve-model"]["inputs"]["parameters"]["model_reference"]["componentInputParameter"] == "model"
    assert tasks["resolve-model"]["cachingOptions"] == {}  # never cached: the alias moves between runs
    assert _inputs(tasks["preprocess-with-model"]) == {"model": "resolve-model"}
    assert _inputs(tasks["infer"]) == {"partitions": "partition", "model": "resolve-model"}
    assert _inputs(tasks["report"]) == {"model": "resolve-model", "embeddings": "infer"}
    assert spec["pipelineInfo"]["name"] == "gnnflow-inference"
    # submit refuses the wrong package for what is asked, before anything is sent
    check_package(path, inference_only=True)
    with pytest.raises(GnnflowError, match="inference-only pipeline: drop --from-model, or compile with it"):
        check_package(path)
    _, training = _compile(tmp_path, "training.yaml")
    with pytest.raises(GnnflowError, match="training pipeline: compile it with --from-model"):
        check_package(training, inference_only=True)


def test_compile_command_reads_the_registry_section(tmp_path, caplog):
    config = tmp_path / "config.yaml"
    config.write_text("graph: {nodes: [], edges: []}\nregistry: {uri: gs://models/registry, max_drop: 0.01}\n")
    assert gnnflow(["compile", "-o", str(tmp_path / "p.yaml"), "--image", IMAGE, "--config", str(config)]) == 0
    assert "register" in next(yaml.safe_load_all((tmp_path / "p.yaml").read_text()))["root"]["dag"]["tasks"]
    assert gnnflow(["compile", "-o", str(tmp_path / "i.yaml"), "--image", IMAGE, "--from-model"]) == 0
    assert "resolve-model" in next(yaml.safe_load_all((tmp_path / "i.yaml").read_text()))["root"]["dag"]["tasks"]
    config.write_text("graph: {nodes: [], edges: []}\nregistry: {max_drop: -1}\n")
    assert gnnflow(["compile", "-o", str(tmp_path / "bad.yaml"), "--config", str(config)]) == 2
    assert "key 'registry.max_drop'" in caplog.text
