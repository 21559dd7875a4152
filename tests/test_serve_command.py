"""``gnnflow serve``'s command (pipelines/serve_command.py) without a server: where it listens, its
routes and limits, and what it loads, from the flags, a run root and Vertex AI's AIP_* variables."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from components.errors import GnnflowError
from components.serving.app import ServeSettings
from pipelines import serve_command


def _serve_args(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    serve_command.add_parser(parser.add_subparsers())
    return parser.parse_args(["serve", *argv])


def test_serve_takes_the_model_from_aip_storage_uri_and_the_rest_from_a_run_root(tmp_path: Path) -> None:
    root = tmp_path / "run"
    (root / "embeddings").mkdir(parents=True)
    sources = serve_command.model_sources(None, None, None, str(root), {})
    assert (sources.model, sources.partitions, sources.embeddings, sources.model_origin) == (
        str(root / "model"), str(root / "partitions"), None, "--run",
    )  # fmt: skip  # embeddings only where a published manifest is
    (root / "embeddings" / "manifest.json").write_text("{}")
    assert serve_command.model_sources(None, None, None, str(root), {}).embeddings == str(root / "embeddings")
    vertex = serve_command.model_sources("reg@blessed", "gs://b/parts", None, None, {"AIP_STORAGE_URI": "gs://b/model"})
    assert (vertex.model, vertex.model_origin) == ("gs://b/model", "AIP_STORAGE_URI")
    assert serve_command.model_sources("reg@v3", "p", "e", None, {}) == serve_command.ModelSources("reg@v3", "p", "e", "--model")
    with pytest.raises(GnnflowError, match="needs --model MODEL"):
        serve_command.model_sources(None, "p", None, None, {})
    with pytest.raises(GnnflowError, match="needs --partitions PARTITIONS"):
        serve_command.model_sources("m", None, None, None, {})


def test_serve_routes_and_limits_come_from_the_aip_variables_and_the_flags() -> None:
    settings = serve_command.serve_settings(
        _serve_args("--max-instances", "8", "--max-wait-ms", "0.5"), {"AIP_HEALTH_ROUTE": "/h", "AIP_PREDICT_ROUTE": "/p"}
    )
    assert settings == ServeSettings(health_route="/h", predict_route="/p", max_instances=8, max_wait_s=0.0005)
    assert serve_command.serve_settings(_serve_args(), {}) == ServeSettings()
    with pytest.raises(GnnflowError, match="AIP_PREDICT_ROUTE='predict': a route must start with /"):
        serve_command.serve_settings(_serve_args(), {"AIP_PREDICT_ROUTE": "predict"})
    with pytest.raises(GnnflowError, match="--max-instances must be at least 1"):
        serve_command.serve_settings(_serve_args("--max-instances", "0"), {})


def test_serve_listens_where_the_flags_say_else_on_aip_http_port_else_on_loopback_8080() -> None:
    assert serve_command.listen_address(None, None, {}) == ("127.0.0.1", 8080)
    assert serve_command.listen_address(None, None, {"AIP_HTTP_PORT": "9000"}) == ("0.0.0.0", 9000)
    assert serve_command.listen_address("127.0.0.2", 7000, {"AIP_HTTP_PORT": "9000"}) == ("127.0.0.2", 7000)
    with pytest.raises(GnnflowError, match="AIP_HTTP_PORT='eighty' is not a port number"):
        serve_command.listen_address(None, None, {"AIP_HTTP_PORT": "eighty"})
