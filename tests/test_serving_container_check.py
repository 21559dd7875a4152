"""containers/check_serving.py, the evidence that ``gnnflow serve`` answers in a real container of
the step image: the container it starts (Vertex AI's environment, runc, ulimits, a read-only run
folder, the image's own user) and the checks it applies to the server's answers. The script itself
needs root, podman and the built image, and runs by hand (containers/README.md)."""

from __future__ import annotations

import importlib.util
import pathlib
import sys
from types import ModuleType

import httpx
import numpy as np
import pytest

REPO = pathlib.Path(__file__).resolve().parents[1]
SCRIPT = REPO / "containers" / "check_serving.py"


@pytest.fixture(scope="module")
def check() -> ModuleType:
    spec = importlib.util.spec_from_file_location("check_serving", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up while being defined
    spec.loader.exec_module(module)
    return module


def test_the_container_is_started_as_vertex_ai_starts_the_deployed_spec(check) -> None:
    root = pathlib.Path("/var/tmp/run-1")
    command = check.run_command("localhost/x:cpu", "c1", root, 41234, "image")
    joined = " ".join(command)
    assert command[:4] == ["podman", "--runtime", "runc", "run"]
    assert "--ulimit nofile=4096:4096 --ulimit nproc=4096:4096" in joined
    assert "-p 127.0.0.1:41234:8080" in joined and "-v /var/tmp/run-1:/mnt/run:ro" in joined
    for variable in ("AIP_HTTP_PORT=8080", "AIP_HEALTH_ROUTE=/health", "AIP_PREDICT_ROUTE=/predict", "AIP_STORAGE_URI=/mnt/run/model"):
        assert f"--env={variable}" in command
    assert "--user" not in joined and "--network" not in joined  # the image's user, a network of its own
    serve = ["serve", "--partitions", "/mnt/run/partitions", "--embeddings", "/mnt/run/embeddings"]
    assert command[-7:] == ["localhost/x:cpu", "gnnflow", *serve]
    deployed = check.run_command("localhost/x:cpu", "c1", root, 41234, "deployed")
    assert deployed[-8:] == ["--entrypoint", "gnnflow", "localhost/x:cpu", *serve]
    computing = check.run_command("localhost/x:cpu", "c1", root, 41234, "image", embeddings=False)
    assert computing[-5:] == ["localhost/x:cpu", "gnnflow", *serve[:3]]


def test_an_existing_node_must_match_infers_exact_embedding_and_label(check) -> None:
    stored = np.array([1.0, 2.0, 3.0])
    assert check.check_existing({"embedding": [1.0, 2.0, 3.0001], "label": "class_1"}, stored, "class_1") == pytest.approx(1.0)
    with pytest.raises(check.CheckFailed, match=r"cosine 0\.0+ with infer's exact embedding, below 0\.999"):
        check.check_existing({"embedding": [3.0, 0.0, -1.0], "label": "class_1"}, stored, "class_1")
    with pytest.raises(check.CheckFailed, match="label 'class_2', infer predicted 'class_1'"):
        check.check_existing({"embedding": [1.0, 2.0, 3.0], "label": "class_2"}, stored, "class_1")
    with pytest.raises(check.CheckFailed, match="embedding of 2 values, infer stored 3"):
        check.check_existing({"embedding": [1.0, 2.0], "label": "class_1"}, stored, "class_1")


def test_a_new_nodes_label_must_be_in_the_vocabulary(check) -> None:
    good = {"embedding": [0.1, 0.2], "label": "class_0", "probabilities": {"class_0": 0.75, "class_1": 0.25}}
    check.check_new(good, {"class_0", "class_1"}, 2)
    with pytest.raises(check.CheckFailed, match=r"label 'class_9' is not in the vocabulary \['class_0', 'class_1'\]"):
        check.check_new({**good, "label": "class_9"}, {"class_0", "class_1"}, 2)
    with pytest.raises(check.CheckFailed, match="do not sum to 1"):
        check.check_new({**good, "probabilities": {"class_0": 0.5}}, {"class_0", "class_1"}, 2)


def test_a_bad_request_must_get_a_400_naming_its_instance_and_field(check) -> None:
    def answer(status: int, instance: int | None, field: str | None) -> httpx.Response:
        return httpx.Response(status, json={"error": {"message": "unknown node id 'x'", "instance": instance, "field": field}})

    assert check.check_error(answer(400, 1, "node_id"), 1, "node_id") == "unknown node id 'x'"
    with pytest.raises(check.CheckFailed, match="400 names instance 0, field 'node_id'; expected 1, 'node_id'"):
        check.check_error(answer(400, 0, "node_id"), 1, "node_id")
    with pytest.raises(check.CheckFailed, match="bad request answered 500, not 400"):
        check.check_error(answer(500, None, None), 1, "node_id")
