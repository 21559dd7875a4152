"""Shared pytest fixtures. Each block below belongs to one concern; add new ones as blocks."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

import pytest

from components.storage import Uri, parse_uri
from tests.bigquery_emulator import BigQueryEmulator
from tests.flaky_http_proxy import Failure, FlakyProxy
from tests.gcs_emulator import GcsEmulator
from tests.recording_server import RecordingServer, add_kfp_routes, add_vertex_routes, compile_package, write_inputs
from tests.shared_datasets import build_citeseer_node_partitions, require_citeseer
from tests.small_graphs import build_one_sided_validation, with_updates

# ---------------------------------------------------------------------------------------
# GCS on loopback: one fake-gcs-server per test session, a fresh bucket per test, and
# failure-injecting proxies in front of it. See tests/gcs_emulator.py and
# tests/flaky_http_proxy.py.
# ---------------------------------------------------------------------------------------

_GCS_TEST_ENVIRONMENT = {
    # Anything that would try Google's metadata server or a real endpoint is pointed at
    # a closed loopback port, so a mistake fails fast instead of reaching (or waiting
    # for) the internet.
    "GCE_METADATA_HOST": "127.0.0.1:9",
    "GCE_METADATA_IP": "127.0.0.1:9",
    "grpc_proxy": "http://127.0.0.1:9",
    "GOOGLE_CLOUD_PROJECT": "test",
    # google-cloud-storage 3.x otherwise fetches each bucket's metadata in a background
    # thread on first use (for tracing attributes); that extra, unordered request would
    # race the requests a test means to fail through FlakyProxy.
    "DISABLE_GCS_PYTHON_CLIENT_OTEL_BUCKET_METADATA": "true",
}


@pytest.fixture(scope="session")
def gcs_emulator() -> Iterator[GcsEmulator]:
    """The session's GCS emulator, with `STORAGE_EMULATOR_HOST` pointing at it."""
    with GcsEmulator() as emulator, pytest.MonkeyPatch.context() as environment:
        for name, value in _GCS_TEST_ENVIRONMENT.items():
            environment.setenv(name, value)
        environment.setenv("STORAGE_EMULATOR_HOST", emulator.url)
        yield emulator


@pytest.fixture
def gcs_bucket(gcs_emulator: GcsEmulator) -> str:
    """Name of a new, empty bucket on the emulator, unique to this test."""
    name = f"test-{uuid.uuid4().hex[:20]}"
    gcs_emulator.create_bucket(name)
    return name


# ---------------------------------------------------------------------------------------
# BigQuery on loopback: one bqemulator per test session (REST and Storage Read gRPC), a fresh
# dataset per test. See tests/bigquery_emulator.py.
# ---------------------------------------------------------------------------------------


@pytest.fixture(scope="session")
def bigquery_emulator(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BigQueryEmulator]:
    """The session's BigQuery emulator, with the BIGQUERY_*EMULATOR_HOST variables pointing at it.

    Its load jobs read ``gs://`` URIs from the files of :func:`gcs_bucket_bigquery_reads`."""
    gcs_root = str(tmp_path_factory.mktemp("gcs-files"))
    with BigQueryEmulator(gcs_local_root=gcs_root) as emulator, pytest.MonkeyPatch.context() as environment:
        for name, value in {**_GCS_TEST_ENVIRONMENT, **emulator.environment}.items():
            environment.setenv(name, value)
        yield emulator


@pytest.fixture
def gcs_bucket_bigquery_reads(bigquery_emulator: BigQueryEmulator, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """A new bucket on a GCS emulator of its own whose objects BigQuery's load jobs can read, as
    real BigQuery reads Cloud Storage: its filesystem backend keeps them where the BigQuery
    emulator resolves ``gs://`` URIs. ``STORAGE_EMULATOR_HOST`` points at it for the test."""
    assert bigquery_emulator.gcs_local_root is not None
    with GcsEmulator(filesystem_root=bigquery_emulator.gcs_local_root) as emulator:
        for name, value in _GCS_TEST_ENVIRONMENT.items():
            monkeypatch.setenv(name, value)
        monkeypatch.setenv("STORAGE_EMULATOR_HOST", emulator.url)
        name = f"test-{uuid.uuid4().hex[:20]}"
        emulator.create_bucket(name)
        yield name


@pytest.fixture
def bigquery_dataset(bigquery_emulator: BigQueryEmulator) -> str:
    """``project.dataset`` of a new, empty dataset on the emulator, unique to this test."""
    from components.warehouse.clients import bigquery_client

    name = f"test_{uuid.uuid4().hex[:16]}"
    bigquery_client(bigquery_emulator.project).create_dataset(name)
    return f"{bigquery_emulator.project}.{name}"


@pytest.fixture
def flaky_gcs(gcs_emulator: GcsEmulator) -> Iterator[Callable[[Sequence[Failure]], FlakyProxy]]:
    """Factory: `make(failures)` starts a `FlakyProxy` in front of the emulator.

    Point clients at it with `tests.gcs_emulator.storage_emulator_host(proxy.url)`.
    Proxies are stopped when the test ends.
    """
    proxies: list[FlakyProxy] = []

    def make(failures: Sequence[Failure]) -> FlakyProxy:
        proxy = FlakyProxy(gcs_emulator.url, failures)
        proxy.start()
        proxies.append(proxy)
        return proxy

    yield make
    for proxy in proxies:
        proxy.stop()


@pytest.fixture(params=["local", "gcs"])
def root(request: pytest.FixtureRequest, tmp_path: Path) -> Uri:
    """An empty storage folder, once per backend: under tmp_path, or an object prefix in a fresh
    emulator bucket (test_storage.py, test_publish.py)."""
    if request.param == "local":
        return parse_uri(tmp_path / "root")
    bucket = request.getfixturevalue("gcs_bucket")
    return parse_uri(f"gs://{bucket}/root")


# --------------------------------------------------------------------------- end of GCS


# ---------------------------------------------------------------------------------------
# Submission and scheduling: the real aiplatform / kfp clients talk to a request recorder on
# loopback (tests/recording_server.py); the input tables live on the GCS emulator.
# ---------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def package(tmp_path_factory: pytest.TempPathFactory) -> str:
    """The compiled gnnflow pipeline (KFP IR YAML) for the test image."""
    return compile_package(str(tmp_path_factory.mktemp("package") / "gnnflow.yaml"))


@pytest.fixture
def recorder() -> Iterator[RecordingServer]:
    """A recorder answering like the Vertex AI and KFP REST APIs."""
    with RecordingServer() as server:
        add_vertex_routes(server)
        add_kfp_routes(server)
        yield server


@pytest.fixture
def config_uri(gcs_bucket: str) -> str:
    """A valid config on the emulator whose tables are there too."""
    return write_inputs(gcs_bucket)


# ------------------------------------------------------------------ end of submission


# ---------------------------------------------------------------------------------------
# Real graphs from ../shared/datasets: skipped where absent, failed under CI=true
# (tests/shared_datasets.py).
# ---------------------------------------------------------------------------------------


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    """A test marked ``citeseer`` checks for the tables before its fixtures (which read them) are set up."""
    if item.get_closest_marker("citeseer") is not None:
        require_citeseer()


# ---------------------------------------------------------------------------------------
# Small graphs, preprocessed and partitioned once per session (tests/small_graphs.py).
# ---------------------------------------------------------------------------------------


@pytest.fixture(scope="session")
def one_sided_validation(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict, Uri, int]:
    """The demo graph whose validation nodes all lie in partition 0 of 2 (see build_one_sided_validation)."""
    return build_one_sided_validation(tmp_path_factory.mktemp("one_sided"))


@pytest.fixture(scope="session")
def one_sided_model(one_sided_validation: tuple[dict, Uri, int], tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A train step's output folder after training one_sided_validation's config as it is (5
    epochs, 2 workers, training.device auto), once per session. Read it as it is; a test that
    trains on from it or damages it works on its own copy (shutil.copytree)."""
    from components.train.step import train

    raw, partitions, _ = one_sided_validation
    model = tmp_path_factory.mktemp("one_sided_model") / "model"
    train(with_updates(raw), partitions, model)
    return model


@pytest.fixture(scope="session")
def citeseer_node_partitions(tmp_path_factory: pytest.TempPathFactory) -> dict[int, Uri]:
    """CiteSeer for node classification partitioned for 1 and 2 workers, once per session (train, full-graph)."""
    return build_citeseer_node_partitions(tmp_path_factory.mktemp("citeseer_node"))
