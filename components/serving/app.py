"""The ASGI app on Vertex AI Prediction's custom-container contract: a health route that answers
503 until the model is loaded, then 200, and a predict route that takes
``{"instances": [...], "parameters": {...}}`` and answers ``{"predictions": [...]}``.

The model loads in a background thread once the app starts, so the server listens (Vertex's TCP
liveness probe passes) while it loads. A bad request is a 400 with a JSON error naming the
instance and the field; an unexpected failure is a 500 with a JSON error; neither stops the server.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from components.serving.batching import DEFAULT_MAX_BATCH, DEFAULT_MAX_WAIT_S, MicroBatcher
from components.serving.predictor import Instance, InstanceError, Prediction, Predictor
from components.serving.requests import DEFAULT_MAX_INSTANCES, MAX_BODY_BYTES, RequestError, parse_request, payload_too_large

log = logging.getLogger("gnnflow.serve")

_DRAIN_FACTOR = 8  # an oversized body is read (and dropped) up to this many limits, so the client gets its 400, not a reset


@dataclass(frozen=True)
class ServeSettings:
    """Routes and limits (the routes from ``AIP_HEALTH_ROUTE`` / ``AIP_PREDICT_ROUTE`` on Vertex AI)."""

    health_route: str = "/health"
    predict_route: str = "/predict"
    max_instances: int = DEFAULT_MAX_INSTANCES  # per request
    max_body_bytes: int = MAX_BODY_BYTES
    max_batch: int = DEFAULT_MAX_BATCH  # instances per predict call
    max_wait_s: float = DEFAULT_MAX_WAIT_S


class ModelSlot:
    """The predictor, once a background thread has loaded it; ``on_failure`` hears a failed load
    (the server sets it, to stop: a server that can never be healthy should say why and exit)."""

    def __init__(self, load: Callable[[], Predictor]) -> None:
        self._load = load
        self.on_failure: Callable[[BaseException], None] | None = None
        self.predictor: Predictor | None = None
        self.error: BaseException | None = None
        self.loaded = threading.Event()

    def start(self) -> None:
        threading.Thread(target=self._run, name="model-loader", daemon=True).start()

    def _run(self) -> None:
        started = time.perf_counter()
        try:
            predictor = self._load()
        except BaseException as exc:
            self.error = exc
            self.loaded.set()
            log.error("loading the model failed: %s", exc)
            if self.on_failure is not None:
                self.on_failure(exc)
            return
        self.predictor = predictor
        self.loaded.set()
        schema = predictor.schema
        log.info(
            "model loaded in %.1f s (%s, node types %s): health answers 200 now",
            time.perf_counter() - started, schema.task_type, ", ".join(schema.node_types),
        )  # fmt: skip

    def predict(self, instances: Sequence[Instance], k: int) -> list[Prediction]:
        if self.predictor is None:
            raise RuntimeError("predict before the model was loaded")
        return self.predictor.predict(instances, k=k)


def create_app(settings: ServeSettings, slot: ModelSlot) -> Starlette:
    """The app; its lifespan starts the model's loading and the micro-batcher."""
    batcher: MicroBatcher[Instance, Prediction] = MicroBatcher(slot.predict, settings.max_batch, settings.max_wait_s)

    @asynccontextmanager
    async def lifespan(_: Starlette) -> AsyncIterator[None]:
        batcher.start()
        slot.start()
        yield
        await batcher.close()
        stats = batcher.stats
        log.info("stopped: answered %d requests (%d instances) in %d model calls", stats.requests, stats.instances, stats.batches)

    async def health(_: Request) -> Response:
        if slot.predictor is None:
            return JSONResponse({"status": "loading" if slot.error is None else "failed"}, status_code=503)
        return JSONResponse({"status": "ready"})

    async def predict(request: Request) -> Response:
        predictor = slot.predictor
        if predictor is None:
            return _error(503, "the model is still loading: send requests once the health route answers 200")
        try:
            body = await _read_body(request, settings.max_body_bytes)
            parsed = parse_request(body, predictor.schema, settings.max_instances)
            predictions = await batcher.submit(parsed.instances, parsed.k)
        except RequestError as exc:
            return JSONResponse(exc.body(), status_code=exc.status)
        except InstanceError as exc:
            return _error(400, str(exc), exc.index, exc.field)
        except Exception as exc:
            log.exception("predict failed")
            return _error(500, f"internal error: {type(exc).__name__}: {exc}")
        return Response(json.dumps({"predictions": [_prediction_json(p) for p in predictions]}), media_type="application/json")

    async def http_error(_: Request, exc: Exception) -> Response:
        assert isinstance(exc, HTTPException)
        return _error(exc.status_code, f"{exc.detail}: the routes are GET {settings.health_route} and POST {settings.predict_route}")

    routes = [Route(settings.health_route, health, methods=["GET"]), Route(settings.predict_route, predict, methods=["POST"])]
    app = Starlette(routes=routes, lifespan=lifespan, exception_handlers={HTTPException: http_error})
    app.state.batcher = batcher  # its stats: how many requests shared each model call
    return app


async def _read_body(request: Request, limit: int) -> bytes:
    """The body, or a 400 (as Vertex AI answers) when it is over ``limit`` bytes, whether its
    Content-Length says so or its stream does. The rest of an oversized body is read and dropped,
    up to a bound, so that a client still sending gets the answer (closing a connection with
    unread data resets it)."""
    declared = request.headers.get("content-length", "")
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size <= limit:
            chunks.append(chunk)
        elif size > _DRAIN_FACTOR * limit:
            break
    if size > limit or (declared.isdigit() and int(declared) > limit):
        raise payload_too_large(max(size, int(declared) if declared.isdigit() else 0), limit)
    return b"".join(chunks)


def _prediction_json(prediction: Prediction) -> dict[str, object]:
    answer: dict[str, object] = {"embedding": prediction.embedding}
    if prediction.label is not None or prediction.probabilities is not None:
        answer["label"] = prediction.label
        answer["probabilities"] = prediction.probabilities
    if prediction.candidates is not None:
        answer["candidates"] = prediction.candidates
    return answer


def _error(status: int, message: str, instance: int | None = None, field: str | None = None) -> Response:
    return JSONResponse({"error": {"message": message, "instance": instance, "field": field}}, status_code=status)
