"""The compiled KFP pipeline (``gnnflow compile``): loaded back from its IR YAML and checked.

The IR is what Vertex AI Pipelines and KFP run: ``root.dag.tasks`` (the DAG and its edges),
``components`` (typed inputs and outputs), ``deploymentSpec.executors`` (image, command,
resources).
"""

from __future__ import annotations

import pytest
import yaml

from components import storage
from components.config import ResourcesSpec
from pipelines.cli import main as gnnflow
from pipelines.dag import DEFAULT_IMAGE, compile_pipeline

IMAGE = "europe-docker.pkg.dev/acme-ml/gnn/gnnflow:1.4.0"
STEPS = {"preprocess", "serialize", "partition", "train", "infer", "report"}

# consumer task → {input artifact: (producer task, producer's output)}
EDGES = {
    "preprocess": {},
    "serialize": {"preprocessed": ("preprocess", "preprocessed")},
    "partition": {"tfrecords": ("serialize", "tfrecords")},
    "train": {"partitions": ("partition", "partitions")},
    "infer": {"partitions": ("partition", "partitions"), "model": ("train", "model")},
    "report": {"model": ("train", "model"), "embeddings": ("infer", "embeddings")},
}
OUTPUT_TYPES = {
    "preprocess": {"preprocessed": "system.Dataset"},
    "serialize": {"tfrecords": "system.Dataset"},
    "partition": {"partitions": "system.Dataset"},
    "train": {"model": "system.Model", "metrics": "system.Metrics"},
    "infer": {"embeddings": "system.Dataset", "metrics": "system.Metrics"},
    "report": {"report": "system.Artifact", "metrics": "system.Metrics", "html": "system.HTML"},
}
RESOURCES_YAML = """\
graph: {nodes: [], edges: []}    # not read by compile: only the resources section is
resources:
  world_size: 4
  requests: {cpu: "2", memory: 8G}
  step_requests:
    train: {cpu: "8", memory: 32G, accelerator_type: NVIDIA_TESLA_T4, accelerator_count: 2}
    infer: {memory: 16G}
"""


def _compile(tmp_path, **kwargs) -> dict:
    path = tmp_path / "pipeline.yaml"
    compile_pipeline(str(path), **kwargs)
    return next(yaml.safe_load_all(path.read_text()))  # the pipeline spec; the Kubernetes platform spec follows


@pytest.fixture(scope="module")
def spec(tmp_path_factory) -> dict:
    return _compile(
        tmp_path_factory.mktemp("dag"), image=IMAGE, resources=ResourcesSpec.model_validate(yaml.safe_load(RESOURCES_YAML)["resources"])
    )


def test_six_tasks_wired_by_typed_artifacts(spec):
    tasks = spec["root"]["dag"]["tasks"]
    assert set(tasks) == STEPS
    for name, task in tasks.items():
        artifacts = task.get("inputs", {}).get("artifacts", {})
        wired = {k: (v["taskOutputArtifact"]["producerTask"], v["taskOutputArtifact"]["outputArtifactKey"]) for k, v in artifacts.items()}
        assert wired == EDGES[name], name
        assert set(task.get("dependentTasks", [])) == {producer for producer, _ in EDGES[name].values()}, name
    for step, outputs in OUTPUT_TYPES.items():
        declared = spec["components"][f"comp-{step}"]["outputDefinitions"]["artifacts"]
        assert {k: v["artifactType"]["schemaTitle"] for k, v in declared.items()} == outputs, step
    assert spec["pipelineInfo"]["name"] == "gnnflow"


def test_pipeline_parameters_reach_every_task(spec):
    parameters = spec["root"]["inputDefinitions"]["parameters"]
    assert {k: v["parameterType"] for k, v in parameters.items()} == {
        "config": "STRING",
        "overrides": "STRING",
        "data_version": "STRING",
        "infer_mode": "STRING",
    }
    assert "defaultValue" not in parameters["config"]  # required
    assert {k: v.get("defaultValue") for k, v in parameters.items() if k != "config"} == {
        "overrides": "{}",
        "data_version": "",
        "infer_mode": "auto",
    }
    tasks = spec["root"]["dag"]["tasks"]
    for name, task in tasks.items():
        given = task["inputs"]["parameters"]
        assert given["config"] == {"componentInputParameter": "config"}, name
        assert given["overrides"] == {"componentInputParameter": "overrides"}, name
    # data_version keys preprocess's cache; the inference mode reaches infer.
    assert tasks["preprocess"]["inputs"]["parameters"]["data_version"] == {"componentInputParameter": "data_version"}
    assert tasks["infer"]["inputs"]["parameters"]["mode"] == {"componentInputParameter": "infer_mode"}
    # Multi-worker steps know the layout they were compiled for: 0 replicas, workers inside the task (runner local).
    for name in ("partition", "train", "infer"):
        assert tasks[name]["inputs"]["parameters"]["replicas"] == {"runtimeValue": {"constant": 0}}


def test_every_executor_runs_the_image_without_installing_anything(spec):
    executors = spec["deploymentSpec"]["executors"]
    assert set(executors) == {f"exec-{s}" for s in STEPS}
    for name, executor in executors.items():
        container = executor["container"]
        assert container["image"] == IMAGE, name
        text = " ".join([*container["command"], *container["args"]])
        assert "pip install" not in text and "pip3 install" not in text, name
        assert "kfp.dsl.executor_main" in text, name
        step = name.removeprefix("exec-")
        assert f"from components.{step}.step import {step} as run_step" in text, name


def test_resource_requests_come_from_the_config(spec):
    executors = spec["deploymentSpec"]["executors"]
    resources = {name.removeprefix("exec-"): e["container"].get("resources", {}) for name, e in executors.items()}
    for step in ("preprocess", "serialize", "partition", "report"):
        assert resources[step]["resourceCpuRequest"] == resources[step]["resourceCpuLimit"] == "2", step
        assert resources[step]["resourceMemoryRequest"] == resources[step]["resourceMemoryLimit"] == "8G", step
        assert "accelerator" not in resources[step], step
    train = resources["train"]
    assert train["resourceCpuLimit"] == "8" and train["resourceMemoryLimit"] == "32G"
    assert train["accelerator"]["resourceType"] == "NVIDIA_TESLA_T4"
    assert train["accelerator"]["resourceCount"] == "2"
    # A step's own requests replace only the fields they set.
    assert resources["infer"]["resourceMemoryLimit"] == "16G" and resources["infer"]["resourceCpuLimit"] == "2"


def test_retries_only_on_single_process_steps_and_caching_on(spec):
    tasks = spec["root"]["dag"]["tasks"]
    for name in ("preprocess", "serialize", "report"):
        policy = tasks[name]["retryPolicy"]
        assert policy["maxRetryCount"] == 2 and policy["backoffDuration"] == "30s" and policy["backoffFactor"] == 2.0, name
    for name in ("partition", "train", "infer"):
        assert "retryPolicy" not in tasks[name], name
    assert all(task["cachingOptions"]["enableCache"] is True for task in tasks.values())


def test_no_resources_means_no_requests_and_default_image(tmp_path):
    spec = _compile(tmp_path)
    for executor in spec["deploymentSpec"]["executors"].values():
        assert executor["container"]["image"] == DEFAULT_IMAGE
        assert "resources" not in executor["container"]


def test_compile_command_with_image_and_config(tmp_path, capsys):
    config = tmp_path / "config.yaml"
    config.write_text(RESOURCES_YAML)
    out = tmp_path / "out" / "pipeline.yaml"
    assert gnnflow(["compile", "-o", str(out), "--image", IMAGE, "--config", str(config)]) == 0
    spec = next(yaml.safe_load_all(out.read_text()))
    assert {e["container"]["image"] for e in spec["deploymentSpec"]["executors"].values()} == {IMAGE}
    assert spec["deploymentSpec"]["executors"]["exec-train"]["container"]["resources"]["resourceCpuLimit"] == "8"
    assert str(out) in capsys.readouterr().err


def test_compile_to_gcs(gcs_bucket):
    target = f"gs://{gcs_bucket}/specs/pipeline.yaml"
    compile_pipeline(target, image=IMAGE)
    spec = next(yaml.safe_load_all(storage.read_text(target)))
    assert set(spec["root"]["dag"]["tasks"]) == STEPS


@pytest.mark.parametrize(
    ("resources", "key"),
    [
        ("requests: {cpu: lots}", "resources.requests.cpu"),
        ("requests: {memory: 8 GB}", "resources.requests.memory"),
        ("step_requests: {trian: {cpu: '2'}}", "resources.step_requests.trian"),
        ("requests: {accelerator_count: 2}", "resources.requests"),
        ("runner: kubernetes", "resources.runner"),
        ("cpu: '4'", "resources.cpu"),
    ],
)
def test_compile_rejects_bad_resources_naming_the_key(tmp_path, capsys, resources, key):
    config = tmp_path / "config.yaml"
    config.write_text(f"resources:\n  {resources}\n")
    out = tmp_path / "pipeline.yaml"
    assert gnnflow(["compile", "-o", str(out), "--config", str(config)]) == 2
    err = capsys.readouterr().err
    assert f"key '{key}" in err and str(config) in err
    assert not out.exists()
