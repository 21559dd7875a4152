"""Running the app under uvicorn: the listening socket, graceful shutdown on SIGTERM, exit 0.

On SIGTERM uvicorn closes the listening socket (new connections are refused), lets the requests
in flight finish (up to ``graceful_timeout_s``), runs the app's shutdown and returns. After that
uvicorn raises the captured signal again so that the default action ends the process; this
server answers that second SIGTERM with a no-op handler instead, so the process exits 0: the
shutdown was the clean one that Vertex AI (and Kubernetes) asked for.
"""

from __future__ import annotations

import logging
import signal
import socket
import threading

import uvicorn
from starlette.applications import Starlette

from components.errors import GnnflowError
from components.serving.app import ModelSlot

log = logging.getLogger("gnnflow.serve")

DEFAULT_GRACEFUL_TIMEOUT_S = 30


def bind(host: str, port: int) -> socket.socket:
    """A listening TCP socket on ``host:port`` (port 0: a free one), or a one-line error."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        raise GnnflowError(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from None
    sock.listen(2048)
    sock.set_inheritable(True)
    return sock


def make_server(app: Starlette, *, graceful_timeout_s: int = DEFAULT_GRACEFUL_TIMEOUT_S, access_log: bool = False) -> uvicorn.Server:
    """A uvicorn server for ``app`` that leaves logging to gnnflow's set-up (its loggers propagate)."""
    config = uvicorn.Config(
        app, lifespan="on", log_config=None, access_log=access_log, timeout_graceful_shutdown=graceful_timeout_s,
        server_header=False,
    )  # fmt: skip
    return uvicorn.Server(config)


def run_until_stopped(server: uvicorn.Server, sock: socket.socket, slot: ModelSlot) -> None:
    """Serves on ``sock`` until SIGTERM / SIGINT, or until the model fails to load (raised here
    as a :class:`GnnflowError`: a server that can never be healthy says why and exits). Call it
    from the main thread, where signals arrive."""

    def stop(_: BaseException) -> None:
        server.should_exit = True

    slot.on_failure = stop
    in_main = threading.current_thread() is threading.main_thread()
    previous = signal.signal(signal.SIGTERM, _after_graceful_shutdown) if in_main else None
    try:
        server.run(sockets=[sock])
    finally:
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)
    if slot.error is not None:
        error = slot.error
        raise error if isinstance(error, GnnflowError) else GnnflowError(f"loading the model failed: {error}") from error
    log.info("server stopped")


def _after_graceful_shutdown(signum: int, _frame: object) -> None:
    """Receives the SIGTERM that uvicorn raises again after it shut down gracefully (see the
    module docstring); doing nothing lets the process exit 0."""
