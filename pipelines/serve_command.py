"""``gnnflow serve``: one HTTP server on Vertex AI Prediction's custom-container contract.

``gnnflow serve --model MODEL --partitions PARTITIONS [--embeddings EMBEDDINGS]`` (or ``--run ROOT``
for a local run root: ROOT/model, ROOT/partitions, ROOT/embeddings) serves embeddings, classes
and top-k candidates for existing and new nodes. MODEL may be a registry reference
(``REGISTRY@blessed``, ``REGISTRY@vN``). On Vertex AI the environment decides: the port is
``$AIP_HTTP_PORT``, the routes ``$AIP_HEALTH_ROUTE`` and ``$AIP_PREDICT_ROUTE``, and the model
``$AIP_STORAGE_URI`` (where Vertex copied the model's artifacts) instead of --model.
"""

from __future__ import annotations

import argparse
import logging
import os
from collections.abc import Mapping
from dataclasses import dataclass

from components import storage
from components.errors import GnnflowError
from components.registry.open import resolve_model_reference
from components.serving.app import ModelSlot, ServeSettings, create_app
from components.serving.predictor import Predictor
from components.serving.requests import DEFAULT_MAX_INSTANCES, MAX_BODY_BYTES
from components.serving.server import DEFAULT_GRACEFUL_TIMEOUT_S, bind, make_server, run_until_stopped

log = logging.getLogger("gnnflow.serve")

DEFAULT_PORT = 8080


@dataclass(frozen=True)
class ModelSources:
    """Where the server loads from; ``model`` may still be a registry reference."""

    model: str
    partitions: str
    embeddings: str | None
    model_origin: str  # how the model was chosen, for the log: --model, --run, AIP_STORAGE_URI


def add_parser(commands: argparse._SubParsersAction) -> None:
    """Adds ``serve`` to the ``gnnflow`` parser."""
    serve = commands.add_parser(
        "serve", help="serve a trained model over HTTP (Vertex AI Prediction's container contract)", description=__doc__
    )
    serve.add_argument("--model", help="the published model (a URI, or REGISTRY@blessed / REGISTRY@vN); $AIP_STORAGE_URI wins when set")
    serve.add_argument("--partitions", help="the published partitions the model was trained on (the stored graph)")
    serve.add_argument("--embeddings", help="infer's published embeddings (their ANN index gives link prediction's candidates)")
    serve.add_argument(
        "--run", metavar="ROOT", help="a local run root: ROOT/model, ROOT/partitions and ROOT/embeddings (the flags above override)"
    )
    serve.add_argument(
        "--host", help="the address to listen on (default: 0.0.0.0 under Vertex AI, where $AIP_HTTP_PORT is set; else 127.0.0.1)"
    )
    serve.add_argument("--port", type=int, help=f"the port (default: $AIP_HTTP_PORT, else {DEFAULT_PORT}; 0 picks a free one)")
    serve.add_argument(
        "--max-instances", type=int, default=DEFAULT_MAX_INSTANCES, help=f"instances per request (default {DEFAULT_MAX_INSTANCES})"
    )
    serve.add_argument("--max-batch", type=int, default=64, help="instances per model call, gathered from concurrent requests (default 64)")
    serve.add_argument(
        "--max-wait-ms", type=float, default=0.0,
        help="how long a request may wait for others to batch with (default 0: those that arrive during a predict share the next)",
    )  # fmt: skip
    serve.add_argument("--cache-dir", help="where gs:// inputs are copied to (default: a temporary folder)")
    serve.add_argument(
        "--graceful-timeout", type=int, default=DEFAULT_GRACEFUL_TIMEOUT_S,
        help=f"on SIGTERM, seconds the requests in flight get to finish (default {DEFAULT_GRACEFUL_TIMEOUT_S})",
    )  # fmt: skip
    serve.add_argument("--access-log", action="store_true", help="log every request")
    serve.set_defaults(handler=run_serve)


def run_serve(args: argparse.Namespace) -> None:
    """Binds the port, starts loading the model in the background and serves until SIGTERM."""
    environment = os.environ
    sources = model_sources(args.model, args.partitions, args.embeddings, args.run, environment)
    settings = serve_settings(args, environment)
    host, port = listen_address(args.host, args.port, environment)
    sock = bind(host, port)
    url = f"http://{host if ':' not in host else f'[{host}]'}:{sock.getsockname()[1]}"
    log.info(
        "model: %s (%s); partitions: %s; embeddings: %s",
        sources.model,
        sources.model_origin,
        sources.partitions,
        sources.embeddings or "none",
    )
    log.info(
        "serving on %s: GET %s (503 while the model loads, then 200), POST %s (%d instances per request at most)",
        url, settings.health_route, settings.predict_route, settings.max_instances,
    )  # fmt: skip
    slot = ModelSlot(lambda: load_predictor(sources, args.cache_dir))
    server = make_server(create_app(settings, slot), graceful_timeout_s=args.graceful_timeout, access_log=args.access_log)
    run_until_stopped(server, sock, slot)


def model_sources(
    model: str | None, partitions: str | None, embeddings: str | None, run_root: str | None, environment: Mapping[str, str]
) -> ModelSources:
    """What to load, from the flags, a run root and ``AIP_STORAGE_URI``."""
    origin = "--model"
    if run_root is not None:
        root = storage.parse_uri(run_root)
        if model is None:
            model, origin = str(root.join("model")), "--run"
        partitions = partitions or str(root.join("partitions"))
        if embeddings is None and storage.exists(root.join("embeddings", storage.MANIFEST_NAME)):
            embeddings = str(root.join("embeddings"))
    vertex_model = environment.get("AIP_STORAGE_URI")
    if vertex_model:
        if model is not None and model != vertex_model:
            log.warning("AIP_STORAGE_URI is set: serving %s, not %s (%s)", vertex_model, model, origin)
        model, origin = vertex_model, "AIP_STORAGE_URI"
    if model is None:
        raise GnnflowError("gnnflow serve needs --model MODEL (or --run ROOT, or AIP_STORAGE_URI set by Vertex AI)")
    if partitions is None:
        raise GnnflowError("gnnflow serve needs --partitions PARTITIONS (the stored graph new nodes attach to), or --run ROOT")
    return ModelSources(model, partitions, embeddings, origin)


def serve_settings(args: argparse.Namespace, environment: Mapping[str, str]) -> ServeSettings:
    """Routes from the Vertex AI variables (or their defaults) and the limits from the flags."""
    routes = {name: environment.get(variable) or default for name, variable, default in _ROUTES}
    for name, variable, _ in _ROUTES:
        if not routes[name].startswith("/"):
            raise GnnflowError(f"{variable}={routes[name]!r}: a route must start with /")
    if routes["health"] == routes["predict"]:
        raise GnnflowError(f"the health and predict routes are both {routes['health']!r}: they must differ")
    for flag, value, low in (
        ("--max-instances", args.max_instances, 1),
        ("--max-batch", args.max_batch, 1),
        ("--max-wait-ms", args.max_wait_ms, 0),
    ):
        if value < low:
            raise GnnflowError(f"{flag} must be at least {low}, got {value}")
    return ServeSettings(
        health_route=routes["health"], predict_route=routes["predict"], max_instances=args.max_instances,
        max_body_bytes=MAX_BODY_BYTES, max_batch=args.max_batch, max_wait_s=args.max_wait_ms / 1000,
    )  # fmt: skip


_ROUTES = (("health", "AIP_HEALTH_ROUTE", "/health"), ("predict", "AIP_PREDICT_ROUTE", "/predict"))


def load_predictor(sources: ModelSources, cache_dir: str | None) -> Predictor:
    """Runs in the loader thread: a registry reference is resolved here too, so the port is open
    (Vertex's liveness probe passes) however long that takes."""
    model = resolve_model_reference(sources.model)
    log.info("loading the model from %s", model)
    return Predictor.load(model, sources.partitions, sources.embeddings, cache_dir)


def listen_address(host: str | None, port: int | None, environment: Mapping[str, str]) -> tuple[str, int]:
    """The flags where given; else Vertex AI's: all interfaces on ``$AIP_HTTP_PORT``; else loopback on 8080."""
    text = environment.get("AIP_HTTP_PORT")
    if text is not None and (not text.isdigit() or int(text) > 65535):  # 0 (a free port) serves tests
        raise GnnflowError(f"AIP_HTTP_PORT={text!r} is not a port number")
    default_host = "0.0.0.0" if text is not None else "127.0.0.1"
    return host or default_host, port if port is not None else int(text or DEFAULT_PORT)
