"""An HTTP reverse proxy on loopback that fails the first few requests on purpose.

Retry logic is only trustworthy once it has met real failures: HTTP 503 / 429 answers and
connections dropped mid-request. `FlakyProxy` sits between a client and a real server
(the GCS emulator), serves a scripted list of failures, then forwards everything.

    with FlakyProxy(emulator.url, [503, "reset"]) as proxy:
        ...  # point the client at proxy.url
        assert proxy.failures_served == 2
"""

from __future__ import annotations

import http.client
import http.server
import io
import json
import socket
import struct
import sys
import threading
import urllib.parse
from collections.abc import Sequence
from types import TracebackType

RESET = "reset"
FORWARD = None

Failure = int | str | None

# Meaningful for one connection only (RFC 9110 section 7.6.1); never copied across.
_HOP_BY_HOP = frozenset(
    {
        "connection",
        "keep-alive",
        "proxy-authenticate",
        "proxy-authorization",
        "proxy-connection",
        "te",
        "trailer",
        "transfer-encoding",
        "upgrade",
    }
)
_UPSTREAM_TIMEOUT_S = 60.0
_IDLE_CONNECTION_TIMEOUT_S = 30.0


class FlakyProxy:
    """Forward requests to `target_url`, failing the first `len(failures)` of them as scripted.

    Each entry of `failures` is used up by one incoming request, in arrival order:
    an int is answered directly with that HTTP status and a small JSON error body;
    `"reset"` drops the connection without an answer (the peer sees a reset);
    `None` forwards that request normally, which lets a failure hit a later request.

    `Location` headers and JSON bodies that name the target are rewritten to name the
    proxy, so follow-up requests (resumable upload sessions, media links) come back here.
    """

    def __init__(self, target_url: str, failures: Sequence[Failure] = ()) -> None:
        parsed = urllib.parse.urlsplit(target_url)
        if parsed.scheme != "http" or not parsed.hostname:
            raise ValueError(f"FlakyProxy forwards to plain http:// URLs only, got {target_url!r}")
        for failure in failures:
            if not (failure is None or failure == RESET or (isinstance(failure, int) and 100 <= failure <= 599)):
                raise ValueError(f"a failure is an HTTP status, {RESET!r} or None, got {failure!r}")
        self.target_url = target_url.rstrip("/")
        self._target_host = parsed.hostname
        self._target_port = parsed.port or 80
        self._pending: list[Failure] = list(failures)
        self._lock = threading.Lock()
        self._requests_seen: list[tuple[str, str]] = []
        self._failures_served = 0
        self._server: _ProxyServer | None = None
        self._url: str | None = None  # kept after stop, for requests still finishing
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        """Base URL of the proxy; use it where the target's URL would go."""
        if self._url is None:
            raise RuntimeError("the proxy has not been started")
        return self._url

    @property
    def requests_seen(self) -> list[tuple[str, str]]:
        """(method, path with query) of every request received, failed ones included."""
        with self._lock:
            return list(self._requests_seen)

    @property
    def failures_served(self) -> int:
        """How many requests were answered with a scripted status or reset."""
        with self._lock:
            return self._failures_served

    def add_failures(self, failures: Sequence[Failure]) -> None:
        """Append more scripted failures, for the requests that arrive after the current ones."""
        with self._lock:
            self._pending.extend(failures)

    def start(self) -> None:
        """Listen on a free loopback port and serve in a background thread."""
        if self._server is not None:
            raise RuntimeError("the proxy is already running")
        self._server = _ProxyServer(self)
        host, port = self._server.server_address[:2]
        self._url = f"http://{host}:{port}"
        self._thread = threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.05}, name="flaky-proxy", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stop accepting, drop open client connections and join the serving thread."""
        server, self._server = self._server, None
        if server is None:
            return
        server.shutdown()
        server.close_open_connections()
        server.server_close()
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None

    def _next_failure(self, method: str, path: str) -> Failure:
        with self._lock:
            self._requests_seen.append((method, path))
            failure = self._pending.pop(0) if self._pending else FORWARD
            if failure is not FORWARD:
                self._failures_served += 1
            return failure

    def __enter__(self) -> FlakyProxy:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.stop()


class _ProxyServer(http.server.ThreadingHTTPServer):
    daemon_threads = True
    # Keep-alive connections would otherwise hold `server_close` until the client hangs up.
    block_on_close = False

    def __init__(self, proxy: FlakyProxy) -> None:
        self.proxy = proxy
        self._connections: set[socket.socket] = set()
        self._connections_lock = threading.Lock()
        super().__init__(("127.0.0.1", 0), _ProxyHandler)

    def process_request(  # type: ignore[override]
        self, request: socket.socket, client_address: tuple[str, int]
    ) -> None:
        with self._connections_lock:
            self._connections.add(request)
        super().process_request(request, client_address)

    def shutdown_request(self, request: socket.socket) -> None:  # type: ignore[override]
        with self._connections_lock:
            self._connections.discard(request)
        super().shutdown_request(request)

    def handle_error(self, request: object, client_address: object) -> None:
        """Ignore connections that break (clients give up, `stop` cuts them); report the rest."""
        if isinstance(sys.exc_info()[1], OSError):
            return
        super().handle_error(request, client_address)

    def close_open_connections(self) -> None:
        with self._connections_lock:
            connections, self._connections = self._connections, set()
        for connection in connections:
            try:
                connection.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass  # already closed by the peer


class _ProxyHandler(http.server.BaseHTTPRequestHandler):
    # HTTP/1.1 so clients keep connections alive, as they do with the real service.
    protocol_version = "HTTP/1.1"
    timeout = _IDLE_CONNECTION_TIMEOUT_S
    server: _ProxyServer

    def do_GET(self) -> None:
        self._handle()

    do_POST = do_PUT = do_PATCH = do_DELETE = do_HEAD = do_OPTIONS = do_GET

    def log_message(self, format: str, *args: object) -> None:
        """Silence the per-request log; tests read `requests_seen` instead."""

    def _handle(self) -> None:
        # The body is read even for failed requests so the connection stays in sync.
        body = self._read_body()
        failure = self.server.proxy._next_failure(self.command, self.path)
        if failure == RESET:
            self._reset_connection()
        elif isinstance(failure, int):
            self._answer_error(failure)
        else:
            self._forward(body)

    def _read_body(self) -> bytes | None:
        if "chunked" in self.headers.get("Transfer-Encoding", "").lower():
            return self._read_chunked()
        length = self.headers.get("Content-Length")
        return self.rfile.read(int(length)) if length is not None else None

    def _read_chunked(self) -> bytes:
        parts: list[bytes] = []
        while True:
            size = int(self.rfile.readline().split(b";", 1)[0].strip(), 16)
            if size == 0:
                # Skip trailer fields up to the blank line that ends the message.
                while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                    pass
                return b"".join(parts)
            parts.append(self.rfile.read(size))
            self.rfile.readline()  # the CRLF after each chunk

    def _reset_connection(self) -> None:
        # SO_LINGER with zero timeout makes close() send RST instead of a graceful FIN,
        # which is what a crashed server or a dropped load-balancer connection looks like.
        self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        self.close_connection = True
        # rfile and wfile hold references to the socket; it really closes (and resets)
        # only when the last one goes.
        self.rfile.close()
        self.wfile.close()
        self.connection.close()
        # The base class flushes wfile after every request; give it somewhere harmless.
        self.wfile = io.BytesIO()

    def _answer_error(self, status: int) -> None:
        message = http.client.responses.get(status, "Error")
        payload = json.dumps({"error": {"code": status, "message": f"{message} (injected by FlakyProxy)", "errors": []}}).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json; charset=UTF-8")
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(payload)

    def _forward(self, body: bytes | None) -> None:
        proxy = self.server.proxy
        headers = {name: value for name, value in self.headers.items() if name.lower() not in _HOP_BY_HOP}
        headers["Host"] = f"{proxy._target_host}:{proxy._target_port}"
        if body is not None:
            headers["Content-Length"] = str(len(body))
        upstream = http.client.HTTPConnection(proxy._target_host, proxy._target_port, timeout=_UPSTREAM_TIMEOUT_S)
        try:
            upstream.request(self.command, self.path, body=body, headers=headers)
            response = upstream.getresponse()
            payload = response.read()
            response_headers = response.getheaders()
            status, reason = response.status, response.reason
        except (OSError, http.client.HTTPException) as error:
            self._answer_upstream_failure(error)
            return
        finally:
            upstream.close()

        payload = self._rewrite_body(payload, response_headers)
        # send_response_only: the upstream's own Date and Server headers are copied below.
        self.send_response_only(status, reason)
        for name, value in response_headers:
            lowered = name.lower()
            if lowered in _HOP_BY_HOP or lowered == "content-length":
                continue
            if lowered == "location":
                value = value.replace(proxy.target_url, proxy.url)
            self.send_header(name, value)
        if self.command == "HEAD":
            upstream_length = dict((k.lower(), v) for k, v in response_headers).get("content-length")
            if upstream_length is not None:
                self.send_header("Content-Length", upstream_length)
        elif status >= 200 and status not in (204, 304):
            self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        if self.command != "HEAD" and payload:
            self.wfile.write(payload)

    def _rewrite_body(self, payload: bytes, response_headers: list[tuple[str, str]]) -> bytes:
        content_type = next((v for k, v in response_headers if k.lower() == "content-type"), "")
        is_media = "alt=media" in self.path
        if "application/json" not in content_type or is_media:
            return payload
        proxy = self.server.proxy
        return payload.replace(proxy.target_url.encode(), proxy.url.encode())

    def _answer_upstream_failure(self, error: Exception) -> None:
        payload = json.dumps({"error": {"code": 502, "message": f"FlakyProxy: upstream failed: {error}"}}).encode()
        self.send_response(502)
        self.send_header("Content-Type", "application/json; charset=UTF-8")
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)
