"""What the serving tests share: a small real run to serve (the demo graph, one worker, trained for
two epochs, embedded exactly), requests built from its raw tables, the in-process server on a
loopback port, and ``gnnflow serve`` as a subprocess."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx
import pandas as pd
from starlette.applications import Starlette

from components import storage
from components.config.source import apply_overrides
from components.serving.app import ModelSlot, ServeSettings, create_app
from components.serving.predictor import Predictor
from components.serving.server import bind, make_server

RUN_NODES = 600
_URL_LINE = re.compile(r"serving on (http://\S+):")


def build_small_run(root: Path, task: str = "node_classification") -> Path:
    """The demo graph of ``RUN_NODES`` nodes through preprocess … infer (exact) under ``root``, for
    ``task`` (link prediction: on the citation edges, with infer's ANN index)."""
    from pipelines.local_run import demo_config, run_pipeline

    uri = storage.parse_uri(root)
    config = demo_config(uri, num_nodes=RUN_NODES)
    settings: dict[str, object] = {
        "task.type": task,
        "resources.world_size": 1,
        "training.epochs": 2,
        "training.early_stopping_patience": None,
    }
    if task == "link_prediction":  # what init-config proposes for it: the demo's node-classification proposal trains full-graph appnp
        settings |= {"model.type": "graphsage", "model.num_layers": 2, "training.mode": "sampled", "training.weight_decay_scope": "all"}
    config = apply_overrides(config, settings, "test")
    run_pipeline(config, uri, "exact")
    return root


def load_run(root: Path) -> Predictor:
    return Predictor.load(str(root / "model"), str(root / "partitions"), str(root / "embeddings"))


def raw_nodes(root: Path) -> pd.DataFrame:
    """The demo's node table as the user wrote it: ``node_id``, ``label``, ``w0``…``w63``, ``score``, ``venue``."""
    return pd.read_csv(root / "demo_data" / "nodes.csv.gz", dtype={"node_id": str})


def new_node(row: pd.Series, neighbours: list[str], *, typed: bool = True) -> dict[str, object]:
    """A new-node instance with ``row``'s raw features, citing ``neighbours``."""
    features: dict[str, object] = {column: (row[column].item() if hasattr(row[column], "item") else row[column]) for column in row.index}
    for column in ("node_id", "label", "split"):
        features.pop(column, None)
    edges: list[dict[str, object]] = [{"node_id": n, "direction": "out"} for n in neighbours]
    if typed:
        edges = [{"edge_type": "cites", **edge} for edge in edges]
        return {"node_type": "paper", "features": features, "edges": edges}
    return {"features": features, "edges": edges}


@dataclass
class RunningServer:
    url: str
    slot: ModelSlot
    settings: ServeSettings
    app: Starlette

    def post(self, body: object, **kwargs: object) -> httpx.Response:
        return httpx.post(self.url + self.settings.predict_route, json=body, timeout=60, **kwargs)  # type: ignore[arg-type]

    def health(self) -> httpx.Response:
        return httpx.get(self.url + self.settings.health_route, timeout=30)


@contextmanager
def server_in_thread(load: Callable[[], Predictor], settings: ServeSettings | None = None) -> Iterator[RunningServer]:
    """The real app under uvicorn on a free loopback port, in a thread of this process."""
    settings = settings or ServeSettings()
    slot = ModelSlot(load)
    app = create_app(settings, slot)
    server = make_server(app, graceful_timeout_s=10)
    sock = bind("127.0.0.1", 0)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, name="uvicorn", daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        assert thread.is_alive() and time.monotonic() < deadline, "the server did not start"
        time.sleep(0.01)
    try:
        yield RunningServer(f"http://127.0.0.1:{sock.getsockname()[1]}", slot, settings, app)
    finally:
        server.should_exit = True
        thread.join(30)
        sock.close()


def wait_healthy(running: RunningServer, timeout_s: float = 120) -> None:
    deadline = time.monotonic() + timeout_s
    while running.health().status_code != 200:
        assert running.slot.error is None, f"loading failed: {running.slot.error}"
        assert time.monotonic() < deadline, "the model did not load in time"
        time.sleep(0.05)


@dataclass
class ServeProcess:
    process: subprocess.Popen[str]
    url: str
    log: list[str]


@contextmanager
def serve_process(args: list[str], environment: dict[str, str] | None = None) -> Iterator[ServeProcess]:
    """``gnnflow serve ARGS`` as a subprocess (port 0 or AIP_HTTP_PORT=0: its log names the port);
    killed at the end if it still runs."""
    env = {**os.environ, **(environment or {})}
    process = subprocess.Popen(
        [sys.executable, "-m", "pipelines.cli", "serve", *args],
        stderr=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        text=True,
        env=env,
    )
    log: list[str] = []
    url: list[str] = []
    found = threading.Event()

    def read() -> None:
        assert process.stderr is not None
        for line in process.stderr:
            log.append(line.rstrip("\n"))
            if not url and (match := _URL_LINE.search(line)):
                url.append(match.group(1))
                found.set()
        found.set()

    threading.Thread(target=read, name="serve-log", daemon=True).start()
    try:
        found.wait(120)
        yield ServeProcess(process, url[0] if url else "", log)
    finally:
        if process.poll() is None:
            process.kill()
        process.wait(30)
