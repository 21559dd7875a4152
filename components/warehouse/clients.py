"""BigQuery clients that follow the emulator convention, as ``STORAGE_EMULATOR_HOST`` does for GCS.

``BIGQUERY_EMULATOR_HOST`` (REST, with scheme: ``http://127.0.0.1:9050``) and
``BIGQUERY_STORAGE_EMULATOR_HOST`` (the Storage Read API's gRPC ``host:port``, plaintext) point
the clients at a local server with anonymous credentials; unset, they reach Google's
endpoints with the environment's default credentials.

Both are bounded by the service deadline (:mod:`components.services.deadline`): every REST call
of the client retries transient failures only until then (the library's own budget is 600 s per
call) with a bounded connect timeout, and ends in one line naming the ``bq://`` table or dataset
and the endpoint; the Storage Read calls take :func:`read_retry` (see ``reading.py``).
"""

from __future__ import annotations

import functools
import os
import re
from typing import Any

from google.api_core import exceptions as api_exceptions
from google.api_core.client_options import ClientOptions
from google.api_core.retry import Retry
from google.auth.credentials import AnonymousCredentials
from google.cloud import bigquery
from google.cloud.bigquery_storage_v1 import BigQueryReadClient
from google.cloud.bigquery_storage_v1.services.big_query_read.transports import BigQueryReadGrpcTransport
from requests.adapters import HTTPAdapter

from components.services import deadline

REST_EMULATOR_VARIABLE = "BIGQUERY_EMULATOR_HOST"
STORAGE_EMULATOR_VARIABLE = "BIGQUERY_STORAGE_EMULATOR_HOST"
REST_ENDPOINT = "https://bigquery.googleapis.com"
STORAGE_READ_ENDPOINT = "bigquerystorage.googleapis.com:443"
_RESOURCE = re.compile(r"/projects/(?P<project>[^/]+)(?:/datasets/(?P<dataset>[^/]+))?(?:/tables/(?P<table>[^/?]+))?")


def rest_service() -> deadline.Service:
    """The BigQuery REST API as this process reaches it."""
    return deadline.Service("BigQuery", os.environ.get(REST_EMULATOR_VARIABLE) or REST_ENDPOINT)


def read_service() -> deadline.Service:
    """The BigQuery Storage Read API (gRPC) as this process reaches it."""
    return deadline.Service("the BigQuery Storage Read API", os.environ.get(STORAGE_EMULATOR_VARIABLE) or STORAGE_READ_ENDPOINT)


def _subject(path: str) -> str:
    """What a REST path is about, as users write it: ``bq://project.dataset.table`` (or less)."""
    match = _RESOURCE.search(path)
    if not match:
        return f"BigQuery request {path}"
    return "bq://" + ".".join(part for part in (match["project"], match["dataset"], match["table"]) if part)


class _ConnectBound(HTTPAdapter):
    """Gives every request a connect timeout (the library sends none by default: a dropped
    connection would wait for the kernel), leaving the read timeout as the caller set it."""

    def send(self, request: Any, stream: bool = False, timeout: Any = None, **kwargs: Any) -> Any:
        if not isinstance(timeout, tuple):
            timeout = (min(timeout, deadline.connect_timeout_s()) if timeout else deadline.connect_timeout_s(), timeout)
        return super().send(request, stream=stream, timeout=timeout, **kwargs)


class _DeadlineClient(bigquery.Client):
    """A client whose REST calls retry only until the service deadline, then fail naming what they were about."""

    def _call_api(
        self, retry: Any, span_name: Any = None, span_attributes: Any = None, job_ref: Any = None, headers: Any = None, **kwargs: Any
    ) -> Any:
        service, subject = rest_service(), _subject(str(kwargs.get("path", "")))
        bounded = deadline.retry(service, subject, base=retry) if retry is not None else None
        try:
            return super()._call_api(bounded, span_name, span_attributes, job_ref, headers, **kwargs)
        except api_exceptions.RetryError as exc:
            raise deadline.unreachable(service, subject, exc) from exc
        except Exception as exc:
            if deadline.is_transient(exc) and not isinstance(exc, api_exceptions.GoogleAPICallError):
                raise deadline.unreachable(service, subject, exc) from exc
            raise


@functools.lru_cache(maxsize=8)
def _bigquery_client(project: str, emulator_url: str | None) -> bigquery.Client:
    if emulator_url:
        client = _DeadlineClient(
            project=project,
            credentials=AnonymousCredentials(),
            client_options=ClientOptions(api_endpoint=emulator_url),
        )
    else:
        client = _DeadlineClient(project=project)
    adapter = _ConnectBound()
    client._http.mount("http://", adapter)
    client._http.mount("https://", adapter)
    return client


def bigquery_client(project: str) -> bigquery.Client:
    """A REST client billing ``project``; a new one when the emulator address changes (tests switch it)."""
    return _bigquery_client(project, os.environ.get(REST_EMULATOR_VARIABLE) or None)


@functools.lru_cache(maxsize=4)
def _read_client(emulator_host: str | None) -> BigQueryReadClient:
    if emulator_host:
        import grpc

        # A local emulator is never behind the environment's proxy (grpc_proxy would apply); and
        # like the client's own channel to Google, no cap on a message's size (a wide table's
        # record batch is larger than gRPC's default 4 MiB).
        options = [("grpc.enable_http_proxy", 0), ("grpc.max_receive_message_length", -1), ("grpc.max_send_message_length", -1)]
        channel = grpc.insecure_channel(emulator_host, options=options)
        return BigQueryReadClient(transport=BigQueryReadGrpcTransport(channel=channel))
    return BigQueryReadClient()


def read_client() -> BigQueryReadClient:
    """A Storage Read API client (gRPC)."""
    return _read_client(os.environ.get(STORAGE_EMULATOR_VARIABLE) or None)


def read_retry(subject: str) -> Retry:
    """The retry of one Storage Read call (the library's: 600 s to start a session, a day per
    stream), bounded by the service deadline."""
    transient = (api_exceptions.ServiceUnavailable, api_exceptions.DeadlineExceeded)
    return deadline.retry(read_service(), subject, predicate=lambda exc: isinstance(exc, transient))
