"""The Vertex AI Model Registry backend: the real ``google-cloud-aiplatform`` client (REST) against
the recording server's Model service, and the models' artifacts on the GCS emulator.

The assertions read what the client sent: the upload bodies (artifact URI, parent model, aliases,
serving image), the alias merges, and the history objects written beside the artifacts."""

from __future__ import annotations

import re
import time
from collections.abc import Iterator

import pytest

from components import storage
from components.errors import GnnflowError
from components.registry.vertex import VertexRegistry
from components.registry.vertex_uri import parse_vertex_uri
from components.services.deadline import ServiceUnreachable
from tests.recording_server import TEST_IMAGE, RecordingServer, add_model_registry_routes

pytestmark = pytest.mark.usefixtures("gcs_emulator")

MODEL = "projects/demo-project/locations/europe-west4/models/gnnflow-test"
URI = f"vertex://{MODEL}"
UPLOAD = r"/v1/projects/demo-project/locations/europe-west4/models:upload"
MERGE = r"/v1/projects/demo-project/locations/europe-west4/models/gnnflow-test(@|%40)(?P<v>[0-9]+):mergeVersionAliases"
LINEAGE = {"gs://data/nodes.csv": "1234:5", "gs://data/edges.csv": "99:7"}


@pytest.fixture
def model_service(monkeypatch: pytest.MonkeyPatch) -> Iterator[RecordingServer]:
    """A recorder answering like the Model service, which the registry is pointed at."""
    with RecordingServer() as server:
        add_model_registry_routes(server)
        monkeypatch.setenv("GNNFLOW_VERTEX_ENDPOINT", server.url)
        yield server


def publish_model(root: str, val_accuracy: float) -> str:
    """A published train output (manifest, generation folder, metrics.json) at ``root``."""
    with storage.staged_output(root, "train") as staging:
        staging.write_json("metrics.json", {"val_accuracy": val_accuracy, "test_accuracy": val_accuracy - 0.01, "best_epoch": 3})
        staging.write_bytes("model.pt", b"weights")
        staging.publish()
    return root


def generation_of(root: str) -> str:
    return storage.open_published(root).manifest.generation


def register(registry: VertexRegistry, model_uri: str, accuracy: float, data_version: str = "abc123") -> int:
    return registry.register(
        model_uri, {"val_accuracy": accuracy}, data_version=data_version, lineage=LINEAGE, config_yaml="training: {epochs: 3}\n"
    ).version


def test_the_uri_names_project_region_and_model(monkeypatch):
    target = parse_vertex_uri("vertex://projects/p-1/locations/us-central1/models/1234567")
    assert (target.project, target.region, target.name) == ("p-1", "us-central1", "1234567")
    assert target.resource_name == "projects/p-1/locations/us-central1/models/1234567"
    monkeypatch.delenv("GNNFLOW_VERTEX_ENDPOINT", raising=False)
    assert target.endpoint_url == "https://us-central1-aiplatform.googleapis.com"
    assert not target.plain_http
    monkeypatch.setenv("GNNFLOW_VERTEX_ENDPOINT", "http://127.0.0.1:5")
    assert target.endpoint_url == "http://127.0.0.1:5" and target.plain_http


@pytest.mark.parametrize(
    "uri",
    [
        "vertex://projects/p/locations/europe-west4/models/",
        "vertex://projects/p/models/m",
        "vertex://projects/p/locations/europe-west4/models/My Model",
        "vertex://projects/p/locations/europe-west4/models/-bad",
        "vertex://projects/p/locations/europe-west4/models/m/versions/2",
        "vertex://projects/p/locations/europe-west4/models/m@2",
    ],
)
def test_a_malformed_uri_is_refused_naming_it(uri):
    with pytest.raises(GnnflowError, match="not a Vertex AI Model Registry model") as error:
        parse_vertex_uri(uri)
    assert repr(uri) in str(error.value) and "\n" not in str(error.value)


def test_register_uploads_versions_with_artifacts_parent_aliases_and_image(model_service, gcs_bucket):
    registry = VertexRegistry.open(URI, create=True, image=TEST_IMAGE)
    first = publish_model(f"gs://{gcs_bucket}/runs/1/model", 0.80)
    second = publish_model(f"gs://{gcs_bucket}/runs/2/model", 0.83)
    assert register(registry, first, 0.80) == 1
    assert register(registry, second, 0.83, data_version="def456") == 2

    one, two = (r.json for r in model_service.seen("POST", UPLOAD))
    assert "authorization" not in model_service.seen("POST", UPLOAD)[0].headers  # plain HTTP: anonymous
    assert one["modelId"] == "gnnflow-test" and "parentModel" not in one
    assert two["parentModel"] == MODEL and "modelId" not in two
    assert one["model"]["artifactUri"] == f"{first}/{generation_of(first)}"
    assert two["model"]["artifactUri"] == f"{second}/{generation_of(second)}"
    assert [body["model"]["containerSpec"]["imageUri"] for body in (one, two)] == [TEST_IMAGE, TEST_IMAGE]
    assert [body["model"]["versionAliases"] for body in (one, two)] == [["latest"], ["latest"]]
    assert two["model"]["labels"] == {"gnnflow-data-version": "def456", "gnnflow-generation": generation_of(second).lower()}
    assert "val_accuracy=0.83" in two["model"]["versionDescription"]

    versions = registry.versions()
    assert [(v.version, v.model_uri, v.aliases) for v in versions] == [(1, first, ("default",)), (2, second, ("latest",))]
    assert versions[1].metrics["val_accuracy"] == pytest.approx(0.83)  # read from the artifacts' metrics.json
    assert versions[1].metrics["best_epoch"] == 3
    assert (versions[1].data_version, versions[1].lineage) == ("def456", LINEAGE)
    assert versions[0].config_yaml == "training: {epochs: 3}\n"
    assert registry.resolve("latest").version == 2 and registry.resolve("v1").model_uri == first

    # The same published model again (a retried step) is the version it already is.
    assert register(registry, second, 0.83) == 2
    assert len(model_service.seen("POST", UPLOAD)) == 2


def test_blessed_moves_in_one_call_and_every_move_is_in_the_history(model_service, gcs_bucket):
    registry = VertexRegistry.open(URI, create=True, image=TEST_IMAGE)
    first = publish_model(f"gs://{gcs_bucket}/runs/1/model", 0.80)
    second = publish_model(f"gs://{gcs_bucket}/runs/2/model", 0.83)
    register(registry, first, 0.80)
    register(registry, second, 0.83)

    assert registry.set_alias("blessed", 1, "first version").previous is None
    assert registry.set_alias("blessed", 2, "passed the gate").previous == 1
    assert registry.set_alias("blessed", 1, "rollback: bad embeddings").previous == 2

    merges = model_service.seen("POST", MERGE)
    assert [(re.fullmatch(MERGE, m.path)["v"], m.json["versionAliases"]) for m in merges] == [
        ("1", ["blessed"]),  # v1 holds `default` already
        ("2", ["blessed", "default"]),  # one call: Vertex takes both off v1
        ("1", ["blessed", "default"]),
    ]
    by_version = {v.version: v.aliases for v in registry.versions()}
    assert by_version == {1: ("blessed", "default"), 2: ("latest",)}
    assert registry.resolve("blessed").version == 1

    history = registry.history()
    assert [(c.alias, c.version, c.previous, c.reason) for c in history] == [
        ("blessed", 1, None, "first version"),
        ("blessed", 2, 1, "passed the gate"),
        ("blessed", 1, 2, "rollback: bad embeddings"),
    ]
    assert history[0].at < history[1].at < history[2].at
    # Each move lies beside the artifacts of the version it moved to.
    assert len(storage.list_files(f"{first}/_registry/aliases/gnnflow-test")) == 2
    assert len(storage.list_files(f"{second}/_registry/aliases/gnnflow-test")) == 1


def test_aliases_given_at_registration_go_with_the_upload_and_into_the_history(model_service, gcs_bucket):
    registry = VertexRegistry.open(URI, create=True, image=TEST_IMAGE)
    register(registry, publish_model(f"gs://{gcs_bucket}/runs/1/model", 0.8), 0.8)
    registry.set_alias("candidate", 1, "first try")
    second = publish_model(f"gs://{gcs_bucket}/runs/2/model", 0.9)
    registry.register(second, {}, data_version="", lineage={}, config_yaml="", aliases=["candidate"])

    [_, upload] = model_service.seen("POST", UPLOAD)
    assert upload.json["model"]["versionAliases"] == ["latest", "candidate"]
    assert "labels" in upload.json["model"] and "gnnflow-data-version" not in upload.json["model"]["labels"]
    assert {v.version: v.aliases for v in registry.versions()} == {1: ("default",), 2: ("candidate", "latest")}
    assert [(c.version, c.previous, c.reason) for c in registry.history()] == [(1, None, "first try"), (2, 1, "set when registered")]


def test_a_model_that_does_not_exist_is_an_error_without_create(model_service):
    with pytest.raises(GnnflowError, match=r"model 'gnnflow-test' does not exist in Vertex AI Model Registry") as error:
        VertexRegistry.open(URI)
    assert URI in str(error.value) and "\n" not in str(error.value)
    assert [r.path for r in model_service.seen("GET")] == [f"/v1/{MODEL}"]
    with pytest.raises(GnnflowError, match="a new model's id must start with a letter"):
        VertexRegistry.open("vertex://projects/demo-project/locations/europe-west4/models/123", create=True)


def test_a_version_that_does_not_exist_is_an_error(model_service, gcs_bucket):
    registry = VertexRegistry.open(URI, create=True, image=TEST_IMAGE)
    register(registry, publish_model(f"gs://{gcs_bucket}/runs/1/model", 0.8), 0.8)
    with pytest.raises(GnnflowError, match=rf"^{URI}@v7: no version v7 in this registry \(versions: v1\)$"):
        registry.resolve("v7")
    with pytest.raises(GnnflowError, match=rf"^{URI}@blessed: no alias 'blessed' in this registry"):
        registry.resolve("blessed")
    with pytest.raises(GnnflowError, match=rf"^{URI}@v4: no such version in this registry \(versions: v1\)$"):
        registry.set_alias("blessed", 4, "typo")
    with pytest.raises(GnnflowError, match="alias 'latest' cannot be set"):
        registry.set_alias("latest", 1, "no")
    assert model_service.seen("POST", MERGE) == []


def test_a_model_outside_cloud_storage_is_refused_before_any_upload(model_service, tmp_path):
    registry = VertexRegistry.open(URI, create=True, image=TEST_IMAGE)
    local = publish_model(str(tmp_path / "model"), 0.8)
    with pytest.raises(GnnflowError, match=r"keeps models on Cloud Storage only; publish the model to a gs:// output") as error:
        register(registry, local, 0.8)
    assert str(error.value).startswith(f"{local}: ")
    assert model_service.seen("POST", UPLOAD) == []


def test_a_version_whose_output_was_republished_is_not_resolved(model_service, gcs_bucket):
    registry = VertexRegistry.open(URI, create=True, image=TEST_IMAGE)
    root = publish_model(f"gs://{gcs_bucket}/runs/1/model", 0.8)
    register(registry, root, 0.8)
    publish_model(root, 0.7)  # train ran again into the same output: the registered generation is deleted
    with pytest.raises(GnnflowError, match=r"v1's model \(gen-.*\) is no longer published at gs://.*/runs/1/model"):
        registry.resolve("v1")
    assert registry.versions()[0].metrics == {}  # listed still, its metrics gone with it


def test_an_unreachable_endpoint_fails_within_the_deadline_in_one_line(monkeypatch):
    monkeypatch.setenv("GNNFLOW_VERTEX_ENDPOINT", "http://127.0.0.1:9")  # nothing listens there
    monkeypatch.setenv("GNNFLOW_SERVICE_DEADLINE_S", "1")
    started = time.monotonic()
    with pytest.raises(ServiceUnreachable) as error:
        VertexRegistry.open(URI)
    assert time.monotonic() - started < 15
    message = str(error.value)
    assert message.startswith(f"registry {URI}: Vertex AI Model Registry at http://127.0.0.1:9 did not answer within 1 s")
    assert "\n" not in message
