"""BigQuery clients that follow the emulator convention, as ``STORAGE_EMULATOR_HOST`` does for GCS.

``BIGQUERY_EMULATOR_HOST`` (REST, with scheme: ``http://127.0.0.1:9050``) and
``BIGQUERY_STORAGE_EMULATOR_HOST`` (the Storage Read API's gRPC ``host:port``, plaintext) point
the clients at a local server with anonymous credentials; unset, they reach Google's
endpoints with the environment's default credentials.
"""

from __future__ import annotations

import functools
import os

from google.api_core.client_options import ClientOptions
from google.auth.credentials import AnonymousCredentials
from google.cloud import bigquery
from google.cloud.bigquery_storage_v1 import BigQueryReadClient
from google.cloud.bigquery_storage_v1.services.big_query_read.transports import BigQueryReadGrpcTransport

REST_EMULATOR_VARIABLE = "BIGQUERY_EMULATOR_HOST"
STORAGE_EMULATOR_VARIABLE = "BIGQUERY_STORAGE_EMULATOR_HOST"


@functools.lru_cache(maxsize=8)
def _bigquery_client(project: str, emulator_url: str | None) -> bigquery.Client:
    if emulator_url:
        return bigquery.Client(
            project=project,
            credentials=AnonymousCredentials(),
            client_options=ClientOptions(api_endpoint=emulator_url),
        )
    return bigquery.Client(project=project)


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
