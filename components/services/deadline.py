"""How long a step keeps trying a cloud service that does not answer, and the one line it fails with.

Every client gnnflow drives (Cloud Storage, BigQuery REST and Storage Read, Vertex AI, KFP,
Dataflow) retries what may pass (a refused or dropped connection, 408, 429, 500, 502, 503, 504)
with exponential backoff, but only until one deadline: ``resources.service_deadline_s`` of the
config read last, or ``GNNFLOW_SERVICE_DEADLINE_S``, which wins and applies before any config
is read (reading the config itself from ``gs://``). The libraries' own budgets are far longer
(BigQuery 600 s per call, a Storage Read stream a day, Beam's Dataflow client about ten
minutes) and say nothing while they wait; here the first failure is logged as a warning naming
the endpoint, and the last one becomes a :class:`ServiceUnreachable`: one line naming what was
being read or written (``gs://...``, ``bq://...``, a job) and the endpoint that did not answer.

The deadline bounds the retrying; one attempt may add its connect timeout
(:func:`connect_timeout_s`, at most 20 s) on top, since a retry is only decided between attempts.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from google.api_core import exceptions as api_exceptions
from google.api_core.retry import Retry

from components.errors import GnnflowError

log = logging.getLogger("gnnflow.services")

ENV_VARIABLE = "GNNFLOW_SERVICE_DEADLINE_S"
# The config's default (components.config.resources.DEFAULT_SERVICE_DEADLINE_S; a test keeps them
# equal): this module sits below the config, which reads its file through Cloud Storage.
FALLBACK_DEADLINE_S = 180.0
_CONNECT_TIMEOUT_CAP_S = 20.0  # a dropped (not refused) connection: long enough for a slow handshake
_WARN_EVERY_S = 30.0  # while retrying, how often the step says it still waits
_RETRYABLE_STATUS = {408, 429, 500, 502, 503, 504}

T = TypeVar("T")
_configured: float | None = None


def configure(seconds: float | None) -> None:
    """Makes ``seconds`` (a config's ``resources.service_deadline_s``) the deadline of this process;
    None forgets it. ``GNNFLOW_SERVICE_DEADLINE_S`` still wins."""
    global _configured
    _configured = seconds


def deadline_s() -> float:
    """The deadline now: the environment variable, else the config read last, else the default."""
    text = os.environ.get(ENV_VARIABLE, "").strip()
    if text:
        try:
            value = float(text)
        except ValueError:
            value = -1.0
        if not value > 0:
            raise GnnflowError(f"{ENV_VARIABLE}={text!r}: expected a number of seconds greater than 0")
        return value
    return _configured if _configured is not None else FALLBACK_DEADLINE_S


def connect_timeout_s() -> float:
    """How long one attempt may wait for a connection (bounds the overrun past the deadline)."""
    return min(deadline_s(), _CONNECT_TIMEOUT_CAP_S)


@dataclass(frozen=True)
class Service:
    """A service as a user would look for it: its name and the endpoint this process talks to."""

    name: str  # "Cloud Storage", "BigQuery", "the BigQuery Storage Read API", ...
    endpoint: str  # an emulator's URL or the real API host


class ServiceUnreachable(GnnflowError):
    """A service did not answer within the deadline; the message names the subject and endpoint."""


def _status(exc: BaseException) -> int | None:
    for name in ("code", "status", "status_code"):
        value = getattr(exc, name, None)
        if isinstance(value, int):
            return value
    return None


def _connection_types() -> tuple[type[BaseException], ...]:
    import requests
    import urllib3.exceptions
    from google.auth import exceptions as auth_exceptions

    return (
        ConnectionError,  # refused, reset (the built-in family: ConnectionRefusedError, ...)
        TimeoutError,
        requests.exceptions.ConnectionError,
        requests.exceptions.Timeout,
        requests.exceptions.ChunkedEncodingError,
        urllib3.exceptions.HTTPError,  # MaxRetryError, NewConnectionError, ProtocolError
        auth_exceptions.TransportError,
    )


def is_connect_failure(exc: BaseException) -> bool:
    """The request never reached the service (refused, unresolvable, no route): repeating it is
    safe even for a call that creates something."""
    import requests
    import urllib3.exceptions

    if isinstance(exc, api_exceptions.RetryError) and exc.cause is not None:
        return is_connect_failure(exc.cause)
    if isinstance(exc, requests.exceptions.SSLError):
        return False
    connect = (
        ConnectionRefusedError,
        requests.exceptions.ConnectTimeout,
        urllib3.exceptions.NewConnectionError,
        urllib3.exceptions.ConnectTimeoutError,
    )
    if isinstance(exc, connect):
        return True
    if isinstance(exc, requests.exceptions.ConnectionError):
        inner = exc.args[0] if exc.args else None
        return isinstance(inner, urllib3.exceptions.MaxRetryError) and isinstance(inner.reason, connect)
    if isinstance(exc, urllib3.exceptions.MaxRetryError):
        return isinstance(exc.reason, connect)
    return isinstance(exc, api_exceptions.ServiceUnavailable) and _grpc_unavailable(exc)


def _grpc_unavailable(exc: api_exceptions.GoogleAPICallError) -> bool:
    """A gRPC UNAVAILABLE raised before any connection (``failed to connect``)."""
    text = str(exc).lower()
    return "failed to connect" in text or "connection refused" in text


def is_transient(exc: BaseException) -> bool:
    """What may pass on its own: no connection, a timeout, or 408/429/5xx (not 501)."""
    import requests

    if isinstance(exc, ServiceUnreachable):
        return False  # an inner call already spent the deadline
    if isinstance(exc, api_exceptions.RetryError):
        return False  # a library's own retries gave up: its budget is spent
    if isinstance(exc, requests.exceptions.SSLError):
        return False
    if isinstance(exc, _connection_types()):
        return True
    if isinstance(exc, (api_exceptions.ServiceUnavailable, api_exceptions.DeadlineExceeded, api_exceptions.TooManyRequests)):
        return True
    return _status(exc) in _RETRYABLE_STATUS


class _Warner:
    """``on_error`` of one call: a warning at the first failure, then every ``_WARN_EVERY_S``."""

    def __init__(self, service: Service, subject: str | None, deadline: float) -> None:
        self.service, self.subject, self.deadline = service, subject, deadline
        self.start = time.monotonic()
        self.failures = 0
        self.last_warned: float | None = None

    def __call__(self, exc: Exception) -> None:
        self.failures += 1
        now = time.monotonic()
        if self.last_warned is not None and now - self.last_warned < _WARN_EVERY_S:
            return
        self.last_warned = now
        about = f" ({self.subject})" if self.subject else ""
        left = max(0.0, self.deadline - (now - self.start))
        log.warning(
            "%s at %s did not answer%s: %s; retrying for up to %.0f s more (resources.service_deadline_s / %s)",
            self.service.name, self.service.endpoint, about, first_line(exc), left, ENV_VARIABLE,
        )  # fmt: skip


def retry(
    service: Service, subject: str | None = None, *, base: Retry | None = None, predicate: Callable[[BaseException], bool] | None = None
) -> Retry:
    """A ``google.api_core`` retry for one call to ``service``: ``base``'s predicate and backoff
    (or :func:`is_transient`, 0.5 s doubling to 8 s), retrying until the deadline (or ``base``'s
    own timeout, if shorter), warning as it goes."""
    deadline = deadline_s()
    own = getattr(base, "_timeout", None)
    if isinstance(own, (int, float)) and own > 0:
        deadline = min(deadline, float(own))
    chosen = predicate or (getattr(base, "_predicate", None) if base is not None else None) or is_transient
    return Retry(
        predicate=chosen,
        initial=min(getattr(base, "_initial", 0.5), 1.0),
        maximum=min(getattr(base, "_maximum", 8.0), 8.0),
        multiplier=getattr(base, "_multiplier", 2.0),
        timeout=deadline,
        on_error=_Warner(service, subject, deadline),
    )


def first_line(exc: BaseException, limit: int = 240) -> str:
    """An exception as one short line (the last line of a multi-line message: its cause)."""
    import urllib3.exceptions

    if isinstance(exc, api_exceptions.RetryError) and exc.cause is not None:
        exc = exc.cause
    inner = exc.args[0] if exc.args else None  # requests wraps urllib3's error, which wraps the socket's
    if isinstance(inner, urllib3.exceptions.MaxRetryError) and inner.reason is not None:
        exc = inner.reason
    text = getattr(exc, "message", None) or str(exc)
    if "Failed to establish a new connection: " in str(text):
        text = str(text).rsplit("Failed to establish a new connection: ", 1)[1]
    lines = [line.strip() for line in str(text).splitlines() if line.strip()]
    line = f"{type(exc).__name__}: {lines[-1]}" if lines else type(exc).__name__
    return line if len(line) <= limit else line[: limit - 3] + "..."


def unreachable(
    service: Service, subject: str, exc: BaseException | None = None, *, then: str = "", waited_s: float | None = None
) -> ServiceUnreachable:
    """The one-line error for ``subject`` after ``service`` did not answer within the deadline
    (or ``waited_s``); ``then`` says what it leaves behind and what to do."""
    cause = f" (last error: {first_line(exc)})" if exc is not None else ""
    extra = f"; {then}" if then else ""
    waited = deadline_s() if waited_s is None else waited_s
    return ServiceUnreachable(
        f"{subject}: {service.name} at {service.endpoint} did not answer within {waited:g} s{cause}{extra} "
        f"(wait longer: resources.service_deadline_s or {ENV_VARIABLE})"
    )


def gave_up(exc: BaseException) -> bool:
    """Whether ``exc`` is a retry running out of time, or a transient failure left after it."""
    return isinstance(exc, api_exceptions.RetryError) or is_transient(exc)


def call(service: Service, subject: str, fn: Callable[[], T], *, idempotent: bool = True) -> T:
    """``fn()``, retried on transient failures until the deadline (only on failures to connect
    when it is not ``idempotent``); then a :class:`ServiceUnreachable` naming ``subject``."""
    predicate = is_transient if idempotent else is_connect_failure
    try:
        return retry(service, subject, predicate=predicate)(fn)()
    except api_exceptions.RetryError as exc:
        raise unreachable(service, subject, exc) from exc
    except Exception as exc:
        if predicate(exc) or isinstance(exc, api_exceptions.RetryError):
            raise unreachable(service, subject, exc) from exc
        raise


def call_within(service: Service, subject: str, fn: Callable[[], T], *, then: str = "", limit_s: float | None = None) -> T:
    """``fn()`` (a library call with retries of its own that take no deadline, such as Beam's),
    given up on once the deadline (or the shorter ``limit_s``) passes: it runs on in a daemon
    thread, and the caller gets a :class:`ServiceUnreachable` naming ``subject`` and, with
    ``then``, what it may have left behind."""
    outcome: dict[str, Any] = {}

    def run() -> None:
        try:
            outcome["value"] = fn()
        except BaseException as exc:  # noqa: BLE001  # handed to the caller
            outcome["error"] = exc

    worker = threading.Thread(target=run, daemon=True, name=f"service-call-{service.name}")
    worker.start()
    waited = deadline_s() if limit_s is None else min(limit_s, deadline_s())
    worker.join(timeout=waited)
    if worker.is_alive():
        raise unreachable(service, subject, then=then, waited_s=waited)
    if "error" in outcome:
        raise outcome["error"]
    return outcome["value"]
