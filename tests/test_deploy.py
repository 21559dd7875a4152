"""``gnnflow deploy``: the real ``google-cloud-aiplatform`` clients (REST) against the recording
server's Model and Endpoint services, the published model, partitions and embeddings on the GCS
emulator. The assertions read what the clients sent: the upload (artifacts, serving container),
the endpoint lookup or creation, and the deployment (machines, replicas, traffic); a rerun sends
nothing that creates; each refusal is one line and sends nothing. Also the Vector Search upsert
of new nodes' embeddings (``components.serving.vector_search_upsert``)."""

from __future__ import annotations

import argparse
import socket
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest

from components import storage
from components.errors import GnnflowError
from components.registry.vertex import VertexRegistry
from components.runtime.entrypoint import run_cli
from components.services import deadline
from components.serving import vector_search_upsert
from components.serving.vector_search_upsert import upsert_embeddings
from pipelines import deploy
from tests.recording_server import (
    TEST_IMAGE,
    RecordingServer,
    add_endpoint_routes,
    add_model_list_route,
    add_model_registry_routes,
    add_vector_upsert_routes,
)

pytestmark = pytest.mark.usefixtures("gcs_emulator")

PARENT = "projects/demo-project/locations/europe-west4"
UPLOAD = f"/v1/{PARENT}/models:upload"
ENDPOINTS = f"/v1/{PARENT}/endpoints"
DEPLOY = f"/v1/{PARENT}/endpoints/[0-9]+:deployModel"


@dataclass
class Vertex:
    server: RecordingServer
    models: dict[str, list[dict[str, Any]]]
    endpoints: dict[str, dict[str, Any]]

    def created(self) -> list[str]:
        """The paths of every request that creates something."""
        return [r.path for r in self.server.seen("POST")]


@pytest.fixture
def vertex(monkeypatch: pytest.MonkeyPatch) -> Iterator[Vertex]:
    """A recorder answering like Vertex AI's Model and Endpoint services, which deploy is pointed at."""
    with RecordingServer() as server:
        models = add_model_registry_routes(server)
        add_model_list_route(server, models)
        endpoints = add_endpoint_routes(server, models)
        monkeypatch.setenv("GNNFLOW_VERTEX_ENDPOINT", server.url)
        monkeypatch.delenv("GNNFLOW_IMAGE", raising=False)
        yield Vertex(server, models, endpoints)


@pytest.fixture(scope="module")
def silent_vertex() -> Iterator[RecordingServer]:
    """One recorder for the refusal tests, which must send it nothing (each checks that it stayed empty)."""
    with RecordingServer() as server, pytest.MonkeyPatch.context() as environment:
        add_endpoint_routes(server, add_model_registry_routes(server))
        environment.setenv("GNNFLOW_VERTEX_ENDPOINT", server.url)
        environment.delenv("GNNFLOW_IMAGE", raising=False)
        yield server


def publish(root: str, step: str) -> str:
    with storage.staged_output(root, step) as staging:
        staging.write_json("metrics.json" if step == "train" else "meta.json", {"step": step})
        staging.publish()
    return root


@pytest.fixture
def published(gcs_bucket: str) -> dict[str, str]:
    """A run's published model, partitions and embeddings on the emulator."""
    run = f"gs://{gcs_bucket}/runs/1"
    return {
        "model": publish(f"{run}/model", "train"),
        "partitions": publish(f"{run}/partitions", "partition"),
        "embeddings": publish(f"{run}/embeddings", "infer"),
    }


def gnnflow_deploy(capsys: pytest.CaptureFixture[str], *arguments: str) -> tuple[int, str, str]:
    """``gnnflow deploy ARGUMENTS`` as the command line runs it: exit status, stdout, and the
    error line on stderr ("" when none; the log lines above it are not part of it)."""
    parser = argparse.ArgumentParser(prog="gnnflow")
    deploy.add_parser(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(["deploy", *arguments])
    status = run_cli(lambda _: args.handler(args), [])
    captured = capsys.readouterr()
    errors = [line for line in captured.err.splitlines() if line.startswith("error: ")]
    assert len(errors) <= 1, captured.err
    if errors:  # the whole message is that one line: nothing of it continues below
        assert captured.err.endswith(errors[0] + "\n"), captured.err
    return status, captured.out, errors[0] if errors else ""


def base_arguments(published: dict[str, str], *extra: str) -> list[str]:
    return [
        "--model", published["model"], "--partitions", published["partitions"], "--embeddings", published["embeddings"],
        "--project", "demo-project", "--region", "europe-west4", "--image", TEST_IMAGE, "--endpoint", "papers", *extra,
    ]  # fmt: skip


def test_deploy_uploads_the_model_with_the_serving_container_creates_the_endpoint_and_deploys(vertex, published, capsys):
    status, out, err = gnnflow_deploy(
        capsys,
        *base_arguments(
            published, "--machine-type", "n1-standard-8", "--min-replicas", "1", "--max-replicas", "3", "--env", "OMP_NUM_THREADS=4"
        ),
    )
    assert status == 0, err

    [upload] = vertex.server.seen("POST", UPLOAD)
    assert "authorization" not in upload.headers  # plain HTTP: anonymous
    model = upload.json["model"]
    assert model["artifactUri"] == published["model"]
    assert model["containerSpec"] == {
        "imageUri": TEST_IMAGE,
        "command": ["gnnflow"],
        "args": ["serve", "--partitions", published["partitions"], "--embeddings", published["embeddings"]],
        "env": [{"name": "OMP_NUM_THREADS", "value": "4"}],
        "ports": [{"containerPort": 8080}],
        "predictRoute": "/predict",
        "healthRoute": "/health",
    }
    assert set(model["labels"]) == {"gnnflow-serving-key", "gnnflow-generation"}
    assert model["labels"]["gnnflow-generation"] == storage.open_published(published["model"]).manifest.generation.lower()

    [lookup] = vertex.server.seen("GET", ENDPOINTS)
    assert lookup.query["filter"] == ['display_name="papers"']
    [create] = vertex.server.seen("POST", ENDPOINTS)
    assert create.json["displayName"] == "papers"

    [deployment] = vertex.server.seen("POST", DEPLOY)
    [endpoint] = vertex.endpoints
    [model_name] = vertex.models
    assert deployment.path == f"/v1/{endpoint}:deployModel"
    assert deployment.json["deployedModel"]["model"] == f"{model_name}@1"
    assert deployment.json["deployedModel"]["dedicatedResources"] == {
        "machineSpec": {"machineType": "n1-standard-8"},
        "minReplicaCount": 1,
        "maxReplicaCount": 3,
    }
    assert deployment.json["trafficSplit"] == {"0": 100}
    [deployed] = vertex.endpoints[endpoint]["deployedModels"]
    assert vertex.endpoints[endpoint]["trafficSplit"] == {deployed["id"]: 100}

    assert out.splitlines() == [
        f"endpoint: {endpoint} (created)",
        f"predict URL: {vertex.server.url}/v1/{endpoint}:predict",
        f"model: {model_name}@1 (uploaded)",
        f"deployed model: {deployed['id']}",
        f"traffic: {deployed['id']}=100",
    ]


def test_a_rerun_deploys_nothing_twice_and_a_new_container_joins_the_same_endpoint(vertex, published, capsys):
    assert gnnflow_deploy(capsys, *base_arguments(published))[0] == 0
    status, out, err = gnnflow_deploy(capsys, *base_arguments(published))
    assert status == 0, err
    assert len(vertex.server.seen("POST", UPLOAD)) == 1
    assert len(vertex.server.seen("POST", ENDPOINTS)) == 1
    assert len(vertex.server.seen("POST", DEPLOY)) == 1
    [endpoint] = vertex.endpoints
    [first] = vertex.endpoints[endpoint]["deployedModels"]
    assert f"deployed model: {first['id']} (already deployed; nothing changed)" in out.splitlines()
    assert "(already uploaded)" in out

    # Other embeddings: another container, so another serving model, deployed beside the first on
    # the endpoint found by its display name, with the traffic split asked for.
    other = publish(published["embeddings"].replace("runs/1", "runs/2"), "infer")
    arguments = base_arguments({**published, "embeddings": other}, "--traffic-split", f"new=10,{first['id']}=90")
    status, out, err = gnnflow_deploy(capsys, *arguments)
    assert status == 0, err
    assert len(vertex.server.seen("POST", UPLOAD)) == 2 and len(vertex.server.seen("POST", ENDPOINTS)) == 1
    second = vertex.server.seen("POST", DEPLOY)[-1]
    assert second.json["trafficSplit"] == {"0": 10, first["id"]: 90}
    new_id = vertex.endpoints[endpoint]["deployedModels"][1]["id"]
    assert vertex.endpoints[endpoint]["trafficSplit"] == {new_id: 10, first["id"]: 90}
    assert f"traffic: {new_id}=10,{first['id']}=90" in out


def test_a_republished_model_at_the_same_uri_is_uploaded_again(vertex, published, capsys):
    assert gnnflow_deploy(capsys, *base_arguments(published))[0] == 0
    publish(published["model"], "train")  # a new generation: another model
    assert gnnflow_deploy(capsys, *base_arguments(published))[0] == 0
    uploads = vertex.server.seen("POST", UPLOAD)
    assert len(uploads) == 2 and len(vertex.server.seen("POST", DEPLOY)) == 2
    generations = [u.json["model"]["labels"]["gnnflow-generation"] for u in uploads]
    assert generations[0] != generations[1]


def register_version(published: dict[str, str]) -> str:
    registry = VertexRegistry.open(f"vertex://{PARENT}/models/papers-registry", create=True, image=TEST_IMAGE)
    registry.register(published["model"], {"val_accuracy": 0.9}, data_version="d1", lineage={}, config_yaml="")
    return registry.uri


def test_a_registry_version_without_a_serving_command_gets_a_serving_model_naming_it(vertex, published, capsys):
    registry = register_version(published)
    status, out, err = gnnflow_deploy(capsys, *base_arguments({**published, "model": f"{registry}@latest"}))
    assert status == 0, err
    uploads = vertex.server.seen("POST", UPLOAD)
    assert len(uploads) == 2  # the registration, then the serving model
    serving = uploads[1].json["model"]
    assert serving["artifactUri"] == published["model"]  # the published folder, which the server opens
    assert serving["containerSpec"]["command"] == ["gnnflow"]
    assert serving["labels"]["gnnflow-registry-model"] == "papers-registry"
    assert serving["labels"]["gnnflow-registry-version"] == "1"
    assert serving["displayName"] == "papers-registry v1"


def test_a_registry_version_that_serves_this_way_is_deployed_itself(vertex, published, capsys):
    registry = register_version(published)
    [version] = vertex.models[f"{PARENT}/models/papers-registry"]
    version["containerSpec"] = {
        "imageUri": TEST_IMAGE,
        "command": ["gnnflow"],
        "args": ["serve", "--partitions", published["partitions"], "--embeddings", published["embeddings"]],
        "ports": [{"containerPort": 8080}],
        "predictRoute": "/predict",
        "healthRoute": "/health",
    }
    status, out, err = gnnflow_deploy(capsys, *base_arguments({**published, "model": f"{registry}@v1"}))
    assert status == 0, err
    assert len(vertex.server.seen("POST", UPLOAD)) == 1  # only the registration
    [deployment] = vertex.server.seen("POST", DEPLOY)
    assert deployment.json["deployedModel"]["model"] == f"{PARENT}/models/papers-registry@1"
    assert f"model: {PARENT}/models/papers-registry@1 (already uploaded)" in out
    assert gnnflow_deploy(capsys, *base_arguments({**published, "model": f"{registry}@v1"}))[0] == 0
    assert len(vertex.server.seen("POST", DEPLOY)) == 1  # the rerun finds it deployed


REFUSALS = [
    (["--min-replicas", "3", "--max-replicas", "2"], "--max-replicas 2 is less than --min-replicas 3"),
    (["--min-replicas", "0"], "--min-replicas 0: Vertex AI serves with at least 1 replica"),
    (["--machine-type", "e2-micro"], "--machine-type e2-micro: a shared-core machine"),
    (["--machine-type", "a2-highgpu-1g"], "--machine-type a2-highgpu-1g comes with GPUs or TPUs"),
    (["--machine-type", "n1-standard-3"], "--machine-type n1-standard-3: Vertex AI Prediction offers these machines with 2, 4, 8"),
    (["--machine-type", "n1-highcpu-2"], "--machine-type n1-highcpu-2: Vertex AI Prediction offers these machines with 4, 8"),
    (["--machine-type", "N1_STANDARD_4"], "--machine-type 'N1_STANDARD_4' is not a Compute Engine machine type"),
    (["--image", "gnnflow:latest"], "--image 'gnnflow:latest' names no registry host"),
    (["--image", "localhost/gnnflow:latest"], "is on this machine's registry, which Vertex AI cannot reach"),
    (["--traffic-split", "new=50"], "--traffic-split new=50 sums to 50; the shares must sum to 100"),
    (["--traffic-split", "new:100"], "--traffic-split 'new:100': expected ID=PERCENT pairs"),
    (["--traffic-split", "old=100"], "--traffic-split old=100: name 'new' or a deployed model's id"),
    (["--region", "europe"], "--region 'europe' is not a Vertex AI region"),
    (["--env", "AIP_HTTP_PORT=1"], "--env AIP_HTTP_PORT: an environment variable name"),
]


@pytest.mark.parametrize(("extra", "message"), REFUSALS, ids=[r[1].split(" ")[0] + "-" + str(i) for i, r in enumerate(REFUSALS)])
def test_what_vertex_would_refuse_is_one_line_and_sends_nothing(silent_vertex, capsys, extra, message):
    arguments = base_arguments({"model": "gs://b/model", "partitions": "gs://b/partitions", "embeddings": "gs://b/embeddings"}, *extra)
    status, out, err = gnnflow_deploy(capsys, *arguments)
    assert status == 2 and out == ""
    assert message in err, err
    assert silent_vertex.requests == []


def test_folders_outside_cloud_storage_are_refused_naming_them(vertex, published, tmp_path, capsys):
    local = str(tmp_path / "model")
    for name, message in (
        ("model", f"--model {local}: Vertex AI copies a model from Cloud Storage only"),
        ("partitions", f"--partitions {local}: the server on Vertex AI reads it from Cloud Storage only"),
        ("embeddings", f"--embeddings {local}: the server on Vertex AI reads it from Cloud Storage only"),
    ):
        status, _, err = gnnflow_deploy(capsys, *base_arguments({**published, name: local}))
        assert status == 2 and message in err, err
    assert vertex.server.requests == []


def test_a_folder_that_is_not_a_published_model_is_refused_before_any_request(vertex, published, capsys):
    status, _, err = gnnflow_deploy(capsys, *base_arguments({**published, "model": published["partitions"]}))
    assert status == 2 and f"{published['partitions']} holds the output of step 'partition', expected 'train'" in err
    assert vertex.server.requests == []


def test_a_traffic_split_naming_a_model_the_endpoint_lacks_creates_nothing(vertex, published, capsys):
    status, _, err = gnnflow_deploy(capsys, *base_arguments(published, "--traffic-split", "new=50,42=50"))
    assert status == 2 and "--traffic-split new=50,42=50: endpoint 'papers' has no deployed model 42 (it has: none)" in err
    assert vertex.created() == []  # looked up, nothing created


def test_two_endpoints_with_the_display_name_are_named_and_nothing_is_created(vertex, published, capsys):
    for number in ("11", "12"):
        name = f"{PARENT}/endpoints/{number}"
        vertex.endpoints[name] = {"name": name, "displayName": "papers", "deployedModels": [], "trafficSplit": {}}
    status, _, err = gnnflow_deploy(capsys, *base_arguments(published))
    assert status == 2 and f"--endpoint 'papers': 2 endpoints have this display name ({PARENT}/endpoints/11, {PARENT}/endpoints/12)" in err
    assert vertex.created() == []


def test_a_failed_deployment_is_one_line_naming_the_operation(vertex, published, capsys):
    failed = {
        "name": f"{PARENT}/endpoints/1/operations/9",
        "done": True,
        "error": {"code": 9, "message": "Model server never became ready"},
    }
    vertex.server.route("POST", DEPLOY, (200, failed))
    status, _, err = gnnflow_deploy(capsys, *base_arguments(published))
    assert status == 2
    assert "Vertex AI failed it: " in err and "Model server never became ready" in err and "operations/9" in err


@pytest.fixture
def closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_an_unreachable_vertex_endpoint_is_one_line_at_the_deadline(vertex, published, closed_port, monkeypatch, capsys):
    monkeypatch.setenv(deadline.ENV_VARIABLE, "1")
    endpoint = f"http://127.0.0.1:{closed_port}"
    status, out, err = gnnflow_deploy(capsys, *base_arguments(published, "--api-endpoint", endpoint))
    assert status == 2 and out == ""
    assert f"looking up endpoint 'papers': Vertex AI at {endpoint} did not answer within 1 s" in err
    assert vertex.server.requests == []  # --api-endpoint wins over $GNNFLOW_VERTEX_ENDPOINT


# ------------------------------------------------------------------ Vector Search streaming upsert
INDEX = f"{PARENT}/indexes/314"


def test_new_nodes_embeddings_are_upserted_with_ids_vectors_and_restricts(monkeypatch):
    with RecordingServer() as server:
        received = add_vector_upsert_routes(server, INDEX)
        points = [
            ("paper:n1", [0.5, -1.0, 2.0], {"node_type": "paper"}),
            ("author:7", [1.0, 0.0, 0.25], {"node_type": "author", "split": "new"}),
        ]
        assert upsert_embeddings(INDEX, points, api_endpoint=server.url) == 2
        [request] = server.seen("POST", f"/v1/{INDEX}:upsertDatapoints")
        assert "authorization" not in request.headers  # plain HTTP: anonymous
        assert received == request.json["datapoints"]

        monkeypatch.setattr(vector_search_upsert, "MAX_POINTS_PER_REQUEST", 1)  # more points than a request takes
        assert upsert_embeddings(INDEX, points, api_endpoint=server.url) == 2
        chunks = [r.json["datapoints"] for r in server.seen("POST", f"/v1/{INDEX}:upsertDatapoints")[1:]]
    assert chunks == [received[:1], received[1:2]] and len(received) == 4
    assert received[:2] == [
        {"datapointId": "paper:n1", "featureVector": [0.5, -1.0, 2.0], "restricts": [{"namespace": "node_type", "allowList": ["paper"]}]},
        {
            "datapointId": "author:7",
            "featureVector": [1.0, 0.0, 0.25],
            "restricts": [{"namespace": "node_type", "allowList": ["author"]}, {"namespace": "split", "allowList": ["new"]}],
        },
    ]


@pytest.mark.parametrize(
    ("index", "points", "message"),
    [
        ("314", [("a", [1.0], {})], "Vector Search index '314': expected projects/PROJECT/locations/REGION/indexes/ID"),
        (
            INDEX,
            [("a", [1.0, 2.0], {}), ("b", [1.0], {})],
            "datapoint 1 ('b') for " + INDEX + ": 1 dimensions, but the first datapoint has 2",
        ),
        (
            INDEX,
            [("a", [float("nan")], {})],
            "datapoint 0 ('a') for " + INDEX + ": the feature vector must be a non-empty list of finite numbers",
        ),
        (INDEX, [("", [1.0], {})], "the id must be a non-empty string"),
    ],
)
def test_malformed_upserts_are_refused_naming_the_datapoint(index, points, message):
    with RecordingServer() as server:
        with pytest.raises(GnnflowError) as error:
            upsert_embeddings(index, points, api_endpoint=server.url)
        assert server.requests == []
    assert message in str(error.value) and "\n" not in str(error.value)


def test_an_unreachable_index_endpoint_is_one_line_at_the_deadline(closed_port, monkeypatch):
    monkeypatch.setenv(deadline.ENV_VARIABLE, "1")
    endpoint = f"http://127.0.0.1:{closed_port}"
    with pytest.raises(
        GnnflowError, match=rf"Vector Search index {INDEX}: Vertex AI Vector Search at {endpoint} did not answer within 1 s"
    ):
        upsert_embeddings(INDEX, [("a", [1.0], {})], api_endpoint=endpoint)


def test_an_endpoint_named_by_resource_is_used_as_is_and_a_missing_one_is_an_error(vertex, published, capsys):
    name = f"{PARENT}/endpoints/77"
    vertex.endpoints[name] = {"name": name, "displayName": "someone-elses-name", "deployedModels": [], "trafficSplit": {}}
    status, out, err = gnnflow_deploy(capsys, *base_arguments(published), "--endpoint", name)
    assert status == 0, err
    assert vertex.server.seen("GET", ENDPOINTS) == [] and vertex.server.seen("POST", ENDPOINTS) == []
    [deployment] = vertex.server.seen("POST", DEPLOY)
    assert deployment.path == f"/v1/{name}:deployModel" and f"endpoint: {name}" in out.splitlines()

    status, _, err = gnnflow_deploy(capsys, *base_arguments(published), "--endpoint", f"{PARENT}/endpoints/78")
    assert status == 2 and err == f"error: --endpoint {PARENT}/endpoints/78: no such endpoint at {vertex.server.url}"
    assert len(vertex.server.seen("POST", DEPLOY)) == 1


def test_the_image_comes_from_the_flag_or_gnnflow_image(silent_vertex, monkeypatch, capsys):
    arguments = base_arguments({"model": "gs://b/model", "partitions": "gs://b/partitions", "embeddings": "gs://b/embeddings"})
    without_image = [a for i, a in enumerate(arguments) if a != "--image" and (i == 0 or arguments[i - 1] != "--image")]
    status, _, err = gnnflow_deploy(capsys, *without_image)
    assert status == 2 and err == "error: gnnflow deploy needs --image (the step image in a registry) or $GNNFLOW_IMAGE"
    monkeypatch.setenv("GNNFLOW_IMAGE", "gnnflow")
    status, _, err = gnnflow_deploy(capsys, *without_image)
    assert status == 2 and "--image 'gnnflow' names no registry host" in err
    assert silent_vertex.requests == []
