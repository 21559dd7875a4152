"""``python -m pipelines.trigger``: serve the trigger on ``$PORT`` (default 8080), as Cloud Run expects.

POST any path with a Pub/Sub push envelope, a CloudEvent or a plain JSON payload; GET
``/healthz`` answers 200. The target is read from the environment once, at start: a
misconfigured trigger exits 2 with the missing variables named instead of failing every
message.
"""

from __future__ import annotations

import json
import logging
import os
import sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from components.errors import GnnflowError
from components.runtime.runlog import configure
from pipelines.trigger.handler import TriggerSettings, respond

log = logging.getLogger("gnnflow.trigger")


def make_server(settings: TriggerSettings, port: int, host: str = "0.0.0.0") -> ThreadingHTTPServer:
    """A threaded HTTP server answering deliveries with ``respond``; ``port`` 0 picks a free one."""

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def _send(self, status: int, reply: dict) -> None:
            data = json.dumps(reply).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_POST(self) -> None:  # noqa: N802 - the base class's naming
            body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            try:
                status, reply = respond(body, dict(self.headers.items()), settings)
            except Exception:  # noqa: BLE001 - a bug: keep serving, answer 500, log the traceback
                log.exception("unexpected error handling a delivery")
                status, reply = 500, {"error": "internal error (see the trigger's log)"}
            self._send(status, reply)

        def do_GET(self) -> None:  # noqa: N802
            if self.path.rstrip("/") == "/healthz":
                self._send(200, {"status": "ok"})
            else:
                self._send(404, {"error": "POST a message; GET /healthz"})

        def log_message(self, format: str, *args: object) -> None:  # noqa: A002
            log.info("%s %s", self.address_string(), format % args)

    return ThreadingHTTPServer((host, port), Handler)


def main() -> int:
    configure()
    try:
        settings = TriggerSettings.from_environment()
    except GnnflowError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    server = make_server(settings, int(os.environ.get("PORT", "8080")))
    log.info("gnnflow trigger listening on port %d, submitting to %s", server.server_address[1], settings.target)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
