"""``gnnflow serve`` over real HTTP on loopback, with a real Predictor loaded from a small real run
(tests/serving_runs.py): Vertex AI's contract (health 503 → 200, instances → predictions, the AIP_*
variables), 400s that name the instance and the field, the 1.5 MB limit, a 500 that leaves the
server up, good and bad requests mixed at concurrency, and SIGTERM with a request in flight."""

from __future__ import annotations

import asyncio
import http.client
import json
import random
import signal
import socket
import threading
import time
from pathlib import Path

import httpx
import numpy as np
import pandas as pd
import pyarrow.parquet as pq
import pytest

from components.serving.predictor import ExistingNode, Predictor
from pipelines import serve_command
from tests.serving_runs import RunningServer, build_small_run, load_run, new_node, raw_nodes, serve_process, server_in_thread, wait_healthy

pytestmark = pytest.mark.multiworker  # building the run starts worker processes through the launcher


@pytest.fixture(scope="module")
def run_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_small_run(tmp_path_factory.mktemp("serving") / "run")


@pytest.fixture(scope="module")
def nodes(run_root: Path) -> pd.DataFrame:
    return raw_nodes(run_root)


@pytest.fixture(scope="module")
def server(run_root: Path) -> tuple[RunningServer, dict[str, httpx.Response]]:
    """The server, and what its routes answered while the model was still loading (held back by a gate)."""
    gate = threading.Event()

    def load() -> Predictor:
        assert gate.wait(60)
        return load_run(run_root)

    with server_in_thread(load) as running:
        before = {"health": running.health(), "predict": running.post({"instances": [{"node_id": "x"}]})}
        gate.set()
        wait_healthy(running)
        yield running, before


def _ids(nodes: pd.DataFrame, count: int, start: int = 0) -> list[str]:
    return [str(i) for i in nodes["node_id"].iloc[start : start + count]]


def _predictions(response: httpx.Response) -> list[dict]:
    assert response.status_code == 200, response.text
    return response.json()["predictions"]


def test_health_answers_503_while_the_model_loads_then_200(server) -> None:
    running, before = server
    assert before["health"].status_code == 503 and before["health"].json() == {"status": "loading"}
    assert before["predict"].status_code == 503
    assert "still loading" in before["predict"].json()["error"]["message"]
    assert running.health().status_code == 200 and running.health().json() == {"status": "ready"}


def test_existing_nodes_get_infer_exact_embeddings_and_the_label_with_probabilities(server, run_root, nodes) -> None:
    running, _ = server
    ids = _ids(nodes, 5)
    answers = _predictions(running.post({"instances": [{"node_type": "paper", "node_id": i} for i in ids]}))
    shards = sorted(run_root.glob("embeddings/gen-*/embeddings/paper/*.parquet"))
    batch = pd.concat(pq.read_table(f).to_pandas() for f in shards).set_index("node_id")
    assert len(answers) == 5
    for node_id, answer in zip(ids, answers):
        served, stored = np.asarray(answer["embedding"]), np.asarray(batch.loc[node_id, "embedding"])
        assert served.shape == stored.shape
        assert float(served @ stored / (np.linalg.norm(served) * np.linalg.norm(stored))) >= 0.999
        assert set(answer) == {"embedding", "label", "probabilities"}
        assert answer["label"] == max(answer["probabilities"], key=answer["probabilities"].get)
        assert sum(answer["probabilities"].values()) == pytest.approx(1.0, abs=1e-4)
        assert answer["label"] == batch.loc[node_id, "prediction"]


def test_a_new_node_is_embedded_and_types_may_be_left_out_on_a_homogeneous_graph(server, nodes) -> None:
    running, _ = server
    row, neighbours = nodes.iloc[0], _ids(nodes, 3, start=10)
    typed = _predictions(running.post({"instances": [new_node(row, neighbours)], "parameters": {"k": 5}}))
    untyped = _predictions(running.post({"instances": [new_node(row, neighbours, typed=False)]}))
    assert len(typed) == len(untyped) == 1
    assert len(typed[0]["embedding"]) > 0 and set(typed[0]) == {"embedding", "label", "probabilities"}
    np.testing.assert_allclose(typed[0]["embedding"], untyped[0]["embedding"], atol=1e-5)
    assert typed[0]["label"] == untyped[0]["label"]


def _bad_requests(nodes: pd.DataFrame) -> list[tuple[str, object, int | None, str | None, str]]:
    """(name, body (bytes: sent as they are), instance, field, words of the message)."""
    good = new_node(nodes.iloc[1], _ids(nodes, 2, start=20))
    known = _ids(nodes, 1)[0]

    def with_features(**changes: object) -> dict:
        features = {**good["features"], **changes}
        return {"instances": [{**good, "features": {k: v for k, v in features.items() if v is not _DROP}}]}

    def with_edge(**changes: object) -> dict:
        return {"instances": [{**good, "edges": [{**good["edges"][0], **changes}]}]}

    return [
        ("malformed JSON", b'{"instances": [{"node_id": ', None, None, "not valid JSON"),
        ("NaN is not JSON", b'{"instances": [{"node_id": NaN}]}', None, None, "not valid JSON"),
        ("not an object", [1, 2], None, None, "must be a JSON object"),
        ("no instances", {"parameters": {"k": 3}}, None, "instances", "missing field"),
        ("too many instances", {"instances": [{"node_id": known}] * 65}, None, "instances", "more than the limit of 64"),
        ("missing node_id", {"instances": [{"node_id": known}, {"node_type": "paper"}]}, 1, "node_id", "missing field"),
        ("unknown node type", {"instances": [{"node_type": "author", "node_id": known}]}, 0, "node_type", "unknown node type 'author'"),
        ("unknown node id", {"instances": [{"node_id": known}, {"node_id": "no-such-paper"}]}, 1, "node_id", "no-such-paper"),
        ("unknown edge type", with_edge(edge_type="writes"), 0, "edges[0].edge_type", "unknown edge type 'writes'"),
        ("unknown edge endpoint", with_edge(node_id="no-such-paper"), 0, "edges[0].node_id", "no-such-paper"),
        ("bad direction", with_edge(direction="sideways"), 0, "edges[0].direction", '"out" or "in"'),
        ("wrong feature type", with_features(score="high"), 0, "features.score", 'expected a number, got "high"'),
        ("unknown feature column", with_features(colour="red"), 0, "features.colour", "no feature column 'colour'"),
        ("needed feature missing", with_features(score=_DROP), 0, "features.score", "score"),
        ("k out of range", {"instances": [{"node_id": known}], "parameters": {"k": 0}}, None, "parameters.k", "from 1 to 1000"),
    ]


_DROP = object()


def _check_bad(response: httpx.Response, instance: int | None, field: str | None, words: str) -> None:
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert (error["instance"], error["field"]) == (instance, field), error
    assert words in error["message"], error


def test_bad_requests_get_400_naming_the_instance_and_the_field(server, nodes) -> None:
    running, _ = server
    for name, body, instance, field, words in _bad_requests(nodes):
        content = body if isinstance(body, bytes) else json.dumps(body).encode()
        response = httpx.post(running.url + "/predict", content=content, headers={"content-type": "application/json"}, timeout=60)
        try:
            _check_bad(response, instance, field, words)
        except AssertionError as exc:
            raise AssertionError(f"{name}: {exc}") from None
    assert running.health().status_code == 200


def test_a_body_over_vertex_limit_is_a_400_by_content_length_and_by_stream(server, nodes) -> None:
    running, _ = server
    big = json.dumps({"instances": [{"node_id": "x" * 1_600_000}]}).encode()
    declared = httpx.post(running.url + "/predict", content=big, timeout=60)
    streamed = httpx.post(running.url + "/predict", content=iter([big[:800_000], big[800_000:]]), timeout=60)  # chunked: no length
    for response in (declared, streamed):
        _check_bad(response, None, None, "request payload size exceeds the limit: 1572864 bytes")
    assert _predictions(running.post({"instances": [{"node_id": _ids(nodes, 1)[0]}]}))


def test_an_unexpected_error_in_predict_is_a_500_and_the_server_stays_up(server, nodes) -> None:
    running, _ = server
    real = running.slot.predictor
    assert real is not None

    class FailsOnSecondCall:
        """The real predictor, but its second predict call raises (a fault only a broken model would have)."""

        schema = real.schema
        calls = 0

        def predict(self, instances, k=10):
            FailsOnSecondCall.calls += 1
            if FailsOnSecondCall.calls == 2:
                raise RuntimeError("the feature store went away")
            return real.predict(instances, k=k)

    with server_in_thread(lambda: FailsOnSecondCall()) as other:  # type: ignore[arg-type, return-value]
        wait_healthy(other)
        body = {"instances": [{"node_id": _ids(nodes, 1)[0]}]}
        first, failed, third = other.post(body), other.post(body), other.post(body)
    assert failed.status_code == 500
    assert failed.json() == {
        "error": {"message": "internal error: RuntimeError: the feature store went away", "instance": None, "field": None}
    }
    assert _predictions(first) == _predictions(third)


def test_good_and_bad_requests_mixed_at_concurrency_each_get_their_own_answer(server, nodes) -> None:
    running, _ = server
    good = [
        {"instances": [{"node_id": i} for i in _ids(nodes, 3, start=30)]},
        {"instances": [{"node_type": "paper", "node_id": _ids(nodes, 1, start=40)[0]}], "parameters": {"k": 3}},
        {"instances": [new_node(nodes.iloc[50], _ids(nodes, 2, start=51))]},
        {
            "instances": [
                new_node(nodes.iloc[60], []),
                {"node_id": _ids(nodes, 1, start=61)[0]},
                new_node(nodes.iloc[62], _ids(nodes, 4, start=63)),
            ]
        },
        {"instances": [new_node(nodes.iloc[70], _ids(nodes, 1, start=71), typed=False)] * 2},
    ]
    expected = [_predictions(running.post(body)) for body in good]  # each alone, one at a time
    bad = [(json.dumps(b).encode() if not isinstance(b, bytes) else b, i, f, w) for _, b, i, f, w in _bad_requests(nodes)]
    rng = random.Random(0)
    plan = [("good", rng.randrange(len(good))) if rng.random() < 0.7 else ("bad", rng.randrange(len(bad))) for _ in range(200)]
    before = running_batches(running)

    async def send_all() -> list[httpx.Response]:
        limit = asyncio.Semaphore(16)
        async with httpx.AsyncClient(base_url=running.url, timeout=120, limits=httpx.Limits(max_connections=16)) as client:

            async def send(kind: str, which: int) -> httpx.Response:
                content = json.dumps(good[which]).encode() if kind == "good" else bad[which][0]
                async with limit:
                    return await client.post("/predict", content=content, headers={"content-type": "application/json"})

            return await asyncio.gather(*(send(kind, which) for kind, which in plan))

    responses = asyncio.run(send_all())
    for (kind, which), response in zip(plan, responses):
        if kind == "bad":
            _check_bad(response, *bad[which][1:])
            continue
        answers = _predictions(response)
        assert len(answers) == len(expected[which])
        for answer, alone in zip(answers, expected[which]):
            np.testing.assert_allclose(answer["embedding"], alone["embedding"], rtol=1e-4, atol=1e-5)
            assert answer["label"] == alone["label"]
    requests, batches = (now - then for now, then in zip(running_batches(running), before))
    assert batches < requests  # concurrent requests shared model calls
    assert running.health().status_code == 200


def running_batches(running: RunningServer) -> tuple[int, int]:
    """(requests, model calls) the server's micro-batcher has seen."""
    app = running.app
    stats = app.state.batcher.stats
    return stats.requests, stats.batches


def _wait_for(url: str, timeout_s: float = 180) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            if httpx.get(url, timeout=10).status_code == 200:
                return
        except httpx.TransportError:
            pass
        assert time.monotonic() < deadline, f"{url} never answered 200"
        time.sleep(0.1)


def _read_head(connection: socket.socket) -> bytes:
    """One response head (an interim 100 Continue), read byte by byte so nothing after it is consumed."""
    head = b""
    while not head.endswith(b"\r\n\r\n"):
        byte = connection.recv(1)
        assert byte, f"the connection closed after {head!r}"
        head += byte
    return head


def _refused(host: str, port: int) -> bool:
    try:
        socket.create_connection((host, port), timeout=5).close()
    except ConnectionRefusedError:
        return True
    return False


def test_sigterm_stops_accepting_finishes_the_request_in_flight_and_exits_0(server, run_root, nodes) -> None:
    """As Vertex AI starts it: port, routes and model from the AIP_* variables; then SIGTERM while
    a request's body is half sent: no new connection is accepted, that request is answered, exit 0."""
    running, _ = server
    body = {"instances": [new_node(nodes.iloc[80], _ids(nodes, 3, start=81)), {"node_id": _ids(nodes, 1, start=90)[0]}]}
    expected = _predictions(running.post(body))
    environment = {
        "AIP_HTTP_PORT": "0",
        "AIP_HEALTH_ROUTE": "/v1/endpoints/e/deployedModels/m/health",
        "AIP_PREDICT_ROUTE": "/v1/endpoints/e/deployedModels/m:predict",
        "AIP_STORAGE_URI": str(run_root / "model"),
    }
    args = ["--host", "127.0.0.1", "--partitions", str(run_root / "partitions"), "--embeddings", str(run_root / "embeddings")]
    with serve_process(args, environment) as served:
        assert served.url, "\n".join(served.log)
        _wait_for(served.url + environment["AIP_HEALTH_ROUTE"])
        host, port = served.url.removeprefix("http://").split(":")
        content = json.dumps(body).encode()
        connection = socket.create_connection((host, int(port)), timeout=60)
        route = environment["AIP_PREDICT_ROUTE"]
        head = f"POST {route} HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\nContent-Length: {len(content)}\r\n"
        connection.sendall(head.encode() + b"Expect: 100-continue\r\n\r\n")
        # The server says "100 Continue" when the app starts reading the body: the request is in flight.
        assert _read_head(connection).startswith(b"HTTP/1.1 100 ")
        served.process.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + 30
        while not _refused(host, int(port)):
            assert time.monotonic() < deadline, "the server kept accepting connections after SIGTERM"
            time.sleep(0.05)
        assert served.process.poll() is None  # still finishing the request in flight
        connection.sendall(content)
        response = http.client.HTTPResponse(connection)
        response.begin()
        answer = json.loads(response.read())
        connection.close()
        assert response.status == 200, answer
        assert served.process.wait(60) == 0, "\n".join(served.log)
    for got, alone in zip(answer["predictions"], expected, strict=True):
        np.testing.assert_allclose(got["embedding"], alone["embedding"], rtol=1e-4, atol=1e-5)
    log = "\n".join(served.log)
    assert f"model: {run_root / 'model'} (AIP_STORAGE_URI)" in log
    assert "model loaded in" in log and "server stopped" in log


def test_a_model_that_cannot_load_ends_the_server_with_a_one_line_error(run_root: Path, tmp_path: Path) -> None:
    missing = tmp_path / "no-model"
    with serve_process(["--model", str(missing), "--partitions", str(run_root / "partitions"), "--port", "0"]) as served:
        assert served.url  # it listened while loading
        assert served.process.wait(120) == 2
    assert served.log[-1].startswith("error: ") and str(missing) in served.log[-1], served.log[-3:]


def test_serve_loads_a_model_named_by_a_registry_reference(run_root: Path, tmp_path: Path) -> None:
    from components.registry.open import open_registry

    registry = open_registry(str(tmp_path / "registry"), create=True)
    registry.register(str(run_root / "model"), {"val_accuracy": 0.5}, data_version="d", lineage={}, config_yaml="a: 1\n")
    sources = serve_command.ModelSources(f"{tmp_path / 'registry'}@v1", str(run_root / "partitions"), None, "--model")
    predictor = serve_command.load_predictor(sources, str(tmp_path / "cache"))
    assert predictor.schema.task_type == "node_classification"
    assert len(predictor.predict([ExistingNode("paper", str(raw_nodes(run_root)["node_id"].iloc[0]))])) == 1


def test_link_prediction_answers_the_top_k_candidates_of_each_request_at_its_own_k(tmp_path_factory: pytest.TempPathFactory) -> None:
    root = build_small_run(tmp_path_factory.mktemp("serving_link") / "run", task="link_prediction")
    nodes = raw_nodes(root)
    with server_in_thread(lambda: load_run(root)) as running:
        wait_healthy(running)
        bodies = [
            {"instances": [{"node_id": _ids(nodes, 1)[0]}], "parameters": {"k": 3}},
            {
                "instances": [new_node(nodes.iloc[5], _ids(nodes, 2, start=6)), {"node_id": _ids(nodes, 1, start=9)[0]}],
                "parameters": {"k": 7},
            },
            {"instances": [{"node_id": _ids(nodes, 1, start=12)[0]}]},
        ]

        async def send_all() -> list[httpx.Response]:
            async with httpx.AsyncClient(base_url=running.url, timeout=120) as client:
                return await asyncio.gather(*(client.post("/predict", json=body) for body in bodies))

        responses = asyncio.run(send_all())
    known = set(nodes["node_id"].astype(str))
    for body, response in zip(bodies, responses):
        k = body.get("parameters", {}).get("k", 10)
        answers = _predictions(response)
        assert len(answers) == len(body["instances"])
        for instance, answer in zip(body["instances"], answers):
            assert set(answer) == {"embedding", "candidates"}
            candidates = answer["candidates"]
            assert len(candidates) == k
            assert all(c["node_type"] == "paper" and c["node_id"] in known for c in candidates)
            scores = [c["score"] for c in candidates]
            assert scores == sorted(scores, reverse=True)
            assert instance.get("node_id") not in {c["node_id"] for c in candidates}  # an existing node is not its own candidate
