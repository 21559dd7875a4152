"""Multi-worker steps as Vertex AI CustomJobs (``resources.runner: vertex``).

The pipeline is compiled with google-cloud-pipeline-components' CustomJob wrapper; the tests
read the compiled IR (what Vertex AI Pipelines receives) and run a replica's command from it
as real processes, one per replica, with ``CLUSTER_SPEC`` as Vertex AI sets it.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from components import storage
from components.config import apply_overrides, load_config, parse_config
from components.errors import GnnflowError
from components.runtime import pipeline_task
from pipelines.cli import main as gnnflow

IMAGE = "us-docker.pkg.dev/acme-ml/gnn/gnnflow:2.0"
MULTI_WORKER = ("partition", "train", "infer")
GRAPH = """\
graph:
  nodes: [{type: paper, uri: gs://data/nodes.parquet, label_column: label}]
  edges: [{type: cites, uri: gs://data/edges.parquet, src_type: paper, dst_type: paper}]
"""
RESOURCES = """\
resources:
  world_size: 4
  runner: vertex
  requests: {cpu: "2", memory: 8G}
  custom_job:
    machine_type: n1-highmem-16
    accelerator_type: NVIDIA_TESLA_T4
    accelerator_count: 2
    boot_disk_gb: 200
    service_account: gnn-trainer@acme-ml.iam.gserviceaccount.com
    network: projects/1234/global/networks/ml
    timeout_s: 7200
    tensorboard: projects/acme-ml/locations/europe-west4/tensorboards/42
"""


def _compile(folder: Path, resources: str, image: str = IMAGE) -> dict:
    config, out = folder / "config.yaml", folder / "pipeline.yaml"
    config.write_text(GRAPH + resources)
    assert gnnflow(["compile", "-o", str(out), "--image", image, "--config", str(config)]) == 0
    return yaml.safe_load(out.read_text())


@pytest.fixture(scope="module")
def spec(tmp_path_factory) -> dict:
    return _compile(tmp_path_factory.mktemp("vertex"), RESOURCES)


def _job_inputs(spec: dict, step: str) -> dict:
    """The CustomJob component's parameters with the values compiled in (their defaults)."""
    declared = spec["components"][f"comp-{step}"]["inputDefinitions"]["parameters"]
    return {name: p.get("defaultValue") for name, p in declared.items()}


def test_multi_worker_tasks_are_custom_jobs_that_vertex_pipelines_launches(spec):
    executors, tasks = spec["deploymentSpec"]["executors"], spec["root"]["dag"]["tasks"]
    for step in MULTI_WORKER:
        container = executors[f"exec-{step}"]["container"]
        assert container["command"] == ["python3", "-u", "-m", "google_cloud_pipeline_components.container.v1.custom_job.launcher"]
        assert container["args"][:2] == ["--type", "CustomJob"]
        assert container["image"] == "gcr.io/ml-pipeline/google-cloud-pipeline-components:2.22.0"
        assert "resources" not in container  # the launcher needs no machine of its own: requests apply to the other tasks
        inputs = _job_inputs(spec, step)
        assert inputs["display_name"] == f"gnnflow-{step}"
        assert inputs["labels"] == {"gnnflow-step": step}
        assert inputs["service_account"] == "gnn-trainer@acme-ml.iam.gserviceaccount.com"
        assert inputs["network"] == "projects/1234/global/networks/ml"
        assert inputs["timeout"] == "7200s"
        assert inputs["restart_job_on_worker_restart"] is True
        assert inputs["strategy"] == "STANDARD"
        assert inputs["project"] == "{{$.pipeline_google_cloud_project_id}}"  # the pipeline's own project and region
        assert inputs["location"] == "{{$.pipeline_google_cloud_location}}"
        assert inputs["tensorboard"] == ("projects/acme-ml/locations/europe-west4/tensorboards/42" if step == "train" else "")
        # The step's own artifacts stay the task's, so the DAG and the run's lineage are unchanged.
        outputs = spec["components"][f"comp-{step}"]["outputDefinitions"]
        assert set(outputs["parameters"]) == {"gcp_resources"}  # the job's name, which the console links
        assert tasks[step]["inputs"]["parameters"]["replicas"] == {"runtimeValue": {"constant": 4}}
    train_root = tasks["train"]["inputs"]["parameters"]["base_output_directory"]["runtimeValue"]["constant"]
    assert train_root == "{{$.pipeline_root}}/{{$.pipeline_job_uuid}}/train-custom-job"  # AIP_TENSORBOARD_LOG_DIR lies below
    assert "base_output_directory" not in tasks["partition"]["inputs"]["parameters"]
    for step in ("preprocess", "serialize", "report"):  # unchanged: run in their task, with the task requests
        container = executors[f"exec-{step}"]["container"]
        assert container["image"] == IMAGE and container["resources"]["resourceCpuLimit"] == "2", step


def test_replica_pools_chief_and_workers_with_machine_disk_image_and_command(spec):
    for step in MULTI_WORKER:
        chief, workers = _job_inputs(spec, step)["worker_pool_specs"]
        assert (chief["replica_count"], workers["replica_count"]) == (1, 3)  # world_size 4, one process per replica
        for pool in (chief, workers):
            assert pool["machine_spec"] == {"machine_type": "n1-highmem-16", "accelerator_type": "NVIDIA_TESLA_T4", "accelerator_count": 2}
            assert pool["disk_spec"] == {"boot_disk_type": "pd-ssd", "boot_disk_size_gb": 200}
            container = pool["container_spec"]
            assert container["image_uri"] == IMAGE
            # Each replica runs the step's component in the step image: KFP's executor calls the
            # step function, which reads CLUSTER_SPEC; the run's config and overrides arrive in
            # the executor input (Vertex AI substitutes it, JSON-escaped, into the job request).
            command = container["command"]
            assert command[:2] == ["sh", "-ec"] and "python3 -m kfp.dsl.executor_main" in command[2]
            assert f"def {step}(" in command[3] and "replicas: int" in command[3]
            assert f"from components.{step}.step import {step} as run_step" in command[3]
            assert "pip install" not in " ".join(command)
            assert container["args"] == ["--executor_input", "{{$.json_escape[1]}}", "--function_to_execute", step]
        assert {**chief, "replica_count": 0} == {**workers, "replica_count": 0}  # the same spec in both pools


def test_hyperdisk_only_families_boot_from_hyperdisk_by_default(tmp_path):
    spec = _compile(tmp_path, "resources: {world_size: 2, runner: vertex, custom_job: {machine_type: c4-standard-8}}\n")
    for pool in _job_inputs(spec, "train")["worker_pool_specs"]:
        assert pool["disk_spec"]["boot_disk_type"] == "hyperdisk-balanced"


def test_one_pool_when_every_worker_fits_one_replica(tmp_path):
    spec = _compile(tmp_path, "resources: {world_size: 4, processes_per_replica: 4, runner: vertex}\n")
    [pool] = _job_inputs(spec, "train")["worker_pool_specs"]
    assert pool["replica_count"] == 1
    assert pool["machine_spec"] == {"machine_type": "n1-standard-8"}
    inputs = _job_inputs(spec, "train")
    assert (inputs["service_account"], inputs["network"], inputs["tensorboard"]) == ("", "", "")
    assert spec["root"]["dag"]["tasks"]["train"]["inputs"]["parameters"]["replicas"] == {"runtimeValue": {"constant": 1}}
    assert "base_output_directory" not in spec["root"]["dag"]["tasks"]["train"]["inputs"]["parameters"]


@pytest.mark.parametrize(
    ("resources", "message"),
    [
        (
            "runner: vertex\n  custom_job: {accelerator_type: NVIDIA_TESLA_T5}",
            "resources.custom_job.accelerator_type 'NVIDIA_TESLA_T5' is not a Vertex AI accelerator",
        ),
        (
            "runner: vertex\n  step_requests: {train: {accelerator_type: NVIDIA_TESLA_T4}}",
            "step_requests.train does not apply with runner vertex",
        ),
        ("runner: vertex\n  world_size: 3\n  processes_per_replica: 2", "world_size 3 is not a multiple of processes_per_replica 2"),
        ("runner: vertex\n  custom_job: {tensorboard: my-board}", "key 'resources.custom_job.tensorboard'"),
        ("runner: vertex\n  custom_job: {project: acme}", "key 'resources.custom_job.project': unknown key"),
        (
            "runner: vertex\n  custom_job: {tensorboard: projects/p/locations/l/tensorboards/1}",
            "resources.custom_job.tensorboard needs resources.custom_job.service_account",
        ),
        (
            "runner: vertex\n  custom_job: {machine_type: n1-standard-8, accelerator_type: NVIDIA_L4}",
            "resources.custom_job.machine_type 'n1-standard-8' does not take resources.custom_job.accelerator_type NVIDIA_L4: "
            "NVIDIA_L4 runs on g2-standard-4",
        ),
        (
            "runner: vertex\n  custom_job: {machine_type: a2-highgpu-2g, accelerator_type: NVIDIA_TESLA_A100}",
            "resources.custom_job.accelerator_count 1: a2-highgpu-2g takes 2 NVIDIA_TESLA_A100 per machine",
        ),
        (
            "runner: vertex\n  custom_job: {machine_type: g2-standard-8}",
            "resources.custom_job.machine_type 'g2-standard-8' comes with GPUs: set resources.custom_job.accelerator_type NVIDIA_L4 "
            "with accelerator_count 1",
        ),
        (
            "runner: vertex\n  custom_job: {machine_type: c4-standard-8, boot_disk_type: pd-ssd}",
            "resources.custom_job.boot_disk_type 'pd-ssd': c4-standard-8 boots only from Hyperdisk",
        ),
        (
            "runner: vertex\n  custom_job: {machine_type: n1-standard-8, boot_disk_type: hyperdisk-balanced}",
            "resources.custom_job.boot_disk_type 'hyperdisk-balanced': n1 machines take no Hyperdisk",
        ),
        (
            "runner: vertex\n  world_size: 4\n  processes_per_replica: 2\n  custom_job: {accelerator_type: NVIDIA_TESLA_T4}",
            "resources.processes_per_replica 2 is more than resources.custom_job.accelerator_count 1",
        ),
        (
            "runner: vertex\n  world_size: 16\n  processes_per_replica: 16\n  custom_job: {machine_type: n1-standard-8}",
            "resources.processes_per_replica 16 is more than the 8 vCPUs of n1-standard-8",
        ),
        ("runner: vertex\n  custom_job: {accelerator_type: TPU_V3}", "gnnflow's steps run on CPUs or NVIDIA GPUs, not TPUs"),
        ("runner: vertex\n  custom_job: {boot_disk_type: pd-balanced}", "key 'resources.custom_job.boot_disk_type'"),
        ("strategy: spot", "resources.strategy spot applies to CustomJob replicas (resources.runner: vertex)"),
        (
            "runner: vertex\n  strategy: spot\n  custom_job: {restart_job_on_worker_restart: false}",
            "resources.strategy spot needs resources.custom_job.restart_job_on_worker_restart true",
        ),
        (
            "runner: vertex\n  strategy: spot\n  custom_job: {max_wait_s: 600}",
            "resources.custom_job.max_wait_s applies to resources.strategy flex_start, not spot",
        ),
        ("runner: vertex\n  strategy: preemptible", "key 'resources.strategy'"),
    ],
)
def test_bad_vertex_resources_are_refused_at_compile_time(tmp_path, capsys, resources, message):
    config, out = tmp_path / "config.yaml", tmp_path / "pipeline.yaml"
    config.write_text(f"resources:\n  {resources}\n")
    assert gnnflow(["compile", "-o", str(out), "--image", IMAGE, "--config", str(config)]) == 2
    assert message in capsys.readouterr().err
    assert not out.exists()


@pytest.mark.parametrize(
    ("resources", "strategy", "max_wait"),
    [
        ("strategy: spot", "SPOT", "86400s"),
        ("strategy: flex_start\n  custom_job: {max_wait_s: 3600}", "FLEX_START", "3600s"),
    ],
)
def test_spot_and_flex_start_reach_the_compiled_custom_jobs(tmp_path, resources, strategy, max_wait):
    spec = _compile(tmp_path, f"resources:\n  runner: vertex\n  world_size: 2\n  {resources}\n")
    for step in MULTI_WORKER:
        inputs = _job_inputs(spec, step)
        assert (inputs["strategy"], inputs["max_wait_duration"], inputs["restart_job_on_worker_restart"]) == (strategy, max_wait, True)


def test_the_placeholder_image_is_refused_with_runner_vertex(tmp_path, capsys):
    config = tmp_path / "config.yaml"
    config.write_text("resources: {runner: vertex}\n")
    assert gnnflow(["compile", "-o", str(tmp_path / "pipeline.yaml"), "--config", str(config)]) == 2
    assert "the image 'gnnflow:latest' names no registry that Vertex AI could pull from" in capsys.readouterr().err


def test_a_run_whose_config_asks_for_another_layout_is_refused_naming_both():
    config = parse_config(GRAPH + RESOURCES, "test config")
    pipeline_task.check_compiled_layout("train", config, 4)  # as compiled
    cases = [
        (config, 2, "compiled for runner vertex with 2 replica(s), but the run's config asks for runner vertex with 4 replica(s)"),
        (config, 0, "compiled for runner local, but the run's config asks for runner vertex with 4 replica(s)"),
        (
            apply_overrides(config, {"resources.runner": "local"}),
            4,
            "compiled for runner vertex with 4 replica(s), but the run's config asks for runner local",
        ),
    ]
    for run_config, replicas, message in cases:
        with pytest.raises(GnnflowError, match="compile again with gnnflow compile --config") as error:
            pipeline_task.check_compiled_layout("train", run_config, replicas)
        assert message in str(error.value)


def test_the_replicas_the_compiled_job_describes_run_the_step_together(tmp_path, gcs_bucket):
    """Each pool's container command from the compiled IR, run as Vertex AI would (one process per
    replica, CLUSTER_SPEC naming its place, the executor input substituted), partitions a graph on
    gs:// (the emulator): both replicas work, the chief publishes and alone writes the task's output."""
    from components.preprocess.step import preprocess
    from components.serialize.step import serialize
    from tests.tiny_graph import write_tiny_graph

    config = apply_overrides(load_config(write_tiny_graph(tmp_path / "graph")), {"resources.world_size": 2, "resources.runner": "vertex"})
    root = storage.parse_uri(f"gs://{gcs_bucket}/run")
    preprocess(config, root.join("preprocessed"))
    serialize(config, root.join("preprocessed"), root.join("tfrecords"))
    spec = _compile(tmp_path, "resources: {world_size: 2, runner: vertex}\n")
    pools = _job_inputs(spec, "partition")["worker_pool_specs"]
    assert [pool["replica_count"] for pool in pools] == [1, 1]

    output = root.join("partitions")
    executor_input = {
        "inputs": {
            "parameterValues": {"config": config.to_yaml(), "overrides": "{}", "replicas": 2},
            "artifacts": {"tfrecords": _artifacts("tfrecords", str(root.join("tfrecords")))},
        },
        "outputs": {"artifacts": {"partitions": _artifacts("partitions", str(output))}},
    }
    master = _free_port()  # the RPC port is the master's + 1, as on Vertex AI
    cluster = {"workerpool0": [f"127.0.0.1:{master}"], "workerpool1": ["127.0.0.1:1"]}
    # python3 in the command must be this interpreter, as it is the image's on Vertex AI
    environment = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    replicas, output_files = [], []
    for index, pool in enumerate(pools):
        output_files.append(tmp_path / f"pool{index}" / "executor_output.json")
        task_input = {**executor_input, "outputs": {**executor_input["outputs"], "outputFile": str(output_files[-1])}}
        container = pool["container_spec"]
        args = [json.dumps(task_input) if arg == "{{$.json_escape[1]}}" else arg for arg in container["args"]]
        cluster_spec = json.dumps({"cluster": cluster, "task": {"type": f"workerpool{index}", "index": 0}})
        replicas.append(
            subprocess.Popen(
                [*container["command"], *args],
                env={**environment, "CLUSTER_SPEC": cluster_spec},
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
            )
        )
    try:
        logs = [replica.communicate(timeout=300)[0] for replica in replicas]
    finally:
        for replica in replicas:
            if replica.poll() is None:
                replica.kill()
        shutil.rmtree(f"/gcs/{gcs_bucket}", ignore_errors=True)  # KFP's executor makes the gcsfuse folders of gs:// outputs
        with_contents = os.path.isdir("/gcs") and os.listdir("/gcs")
        if os.path.isdir("/gcs") and not with_contents:
            os.rmdir("/gcs")
    assert [replica.returncode for replica in replicas] == [0, 0], "\n".join(logs)
    assert "starting ranks 1-1 of 2" in logs[1]  # the worker replica took rank 1 from CLUSTER_SPEC
    published = storage.open_published(output, step="partition")
    assert published.manifest.counts["partitions"] == 2
    assert published.manifest.counts["nodes.item"] == 5
    written = json.loads(output_files[0].read_text())["artifacts"]["partitions"]["artifacts"][0]
    assert written["uri"] == str(output)
    assert written["metadata"]["count_partitions"] == 2 and written["metadata"]["generation"] == published.manifest.generation
    assert not output_files[1].exists()  # only the chief writes the task's executor output


def test_a_worker_replica_of_a_local_task_is_an_error():
    with pytest.raises(GnnflowError, match="non-leading cluster replica inside a pipeline task"):
        pipeline_task.published_here("train", None, 0)
    assert pipeline_task.published_here("train", None, 2) is None


def _artifacts(name: str, uri: str) -> dict:
    return {"artifacts": [{"name": name, "uri": uri, "type": {"schemaTitle": "system.Dataset"}, "metadata": {}}]}


def _free_port() -> int:
    """A loopback port free now (the replicas here are started by the test, as a platform would)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]
