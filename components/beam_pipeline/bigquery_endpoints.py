"""Beam's BigQuery IO pointed at a local BigQuery emulator, when the emulator variables say so.

Beam 2.77's ``ReadFromBigQuery`` has no endpoint option: it builds its clients itself, deep
inside its sources (an apitools REST client for table metadata and clean-up, a
``google.cloud.bigquery.Client``, and a Storage Read ``BigQueryReadClient`` per split and per
stream), each reaching Google's endpoints with the environment's default credentials. The rest
of gnnflow follows the emulator convention of :mod:`components.warehouse.clients`
(``BIGQUERY_EMULATOR_HOST``, ``BIGQUERY_STORAGE_EMULATOR_HOST``); this module makes Beam follow
it too, by replacing those client constructors in Beam's own modules (never in the client
libraries, which other code of this process uses) with ones that honour the variables.

With the variables unset, :func:`follow_emulator_variables` puts Beam's own constructors back,
so a run against real BigQuery goes exactly the way Beam intends. The replacements live in the
process that calls it: with the in-process runner that is the Beam worker too; SDK worker
processes (``direct_running_mode: multi_processing``) import this module as a Beam plugin
(:func:`worker_plugins`), which applies it at import.
"""

from __future__ import annotations

import os
import threading
import types
from typing import Any

from components.warehouse.clients import REST_EMULATOR_VARIABLE, STORAGE_EMULATOR_VARIABLE

_lock = threading.Lock()
_originals: dict[str, Any] = {}  # what Beam had before we replaced it, to put back


def _read_client_factory(original: type) -> Any:
    """``bq_storage.BigQueryReadClient`` as Beam calls it (no arguments): the emulator's
    plaintext channel while the variable is set, else Beam's own client."""

    def make(*args: Any, **kwargs: Any) -> Any:
        if os.environ.get(STORAGE_EMULATOR_VARIABLE) and not args and not kwargs:
            from components.warehouse.clients import read_client

            return read_client()
        return original(*args, **kwargs)

    return make


def _rest_client_factory(original: type) -> Any:
    """``google.cloud.bigquery.Client`` as Beam's BigQueryWrapper builds it: the emulator with
    anonymous credentials while the variable is set (the library already reads the endpoint
    variable, but would still look for default credentials)."""

    def make(*args: Any, **kwargs: Any) -> Any:
        url = os.environ.get(REST_EMULATOR_VARIABLE)
        if not url or args:
            return original(*args, **kwargs)
        from google.api_core.client_options import ClientOptions
        from google.auth.credentials import AnonymousCredentials

        kwargs.setdefault("project", os.environ.get("GOOGLE_CLOUD_PROJECT") or "emulator")
        return original(credentials=AnonymousCredentials(), client_options=ClientOptions(api_endpoint=url), **kwargs)

    return make


def _module_proxy(module: types.ModuleType, **replaced: Any) -> types.SimpleNamespace:
    """A stand-in for ``module`` in one of Beam's namespaces: its attributes, some replaced."""
    proxy = types.SimpleNamespace(**{name: getattr(module, name) for name in dir(module) if not name.startswith("__")})
    for name, value in replaced.items():
        setattr(proxy, name, value)
    return proxy


def worker_plugins() -> list[str]:
    """The ``beam_plugins`` option of a local run: this module while the emulator variable is
    set (each SDK worker process imports its plugins at start), else none."""
    return [__name__] if os.environ.get(REST_EMULATOR_VARIABLE) else []


def follow_emulator_variables() -> bool:
    """Points Beam's BigQuery clients at the emulator if ``BIGQUERY_EMULATOR_HOST`` is set, or
    gives Beam back its own clients if it is not. Idempotent; returns whether it redirected."""
    from apache_beam.internal.gcp import auth
    from apache_beam.io.gcp import bigquery as beam_bigquery
    from apache_beam.io.gcp import bigquery_tools
    from apache_beam.io.gcp.internal.clients.bigquery import bigquery_v2_client

    url = os.environ.get(REST_EMULATOR_VARIABLE)
    with _lock:
        if not url:
            _restore(auth, beam_bigquery, bigquery_tools, bigquery_v2_client)
            return False
        _redirect(url, auth, beam_bigquery, bigquery_tools, bigquery_v2_client)
        return True


def _redirect(url: str, auth: Any, beam_bigquery: Any, bigquery_tools: Any, bigquery_v2_client: Any) -> None:
    if not _originals:
        _originals.update(
            base_url=bigquery_v2_client.BigqueryV2.BASE_URL,
            bq_storage=beam_bigquery.bq_storage,
            gcp_bigquery=bigquery_tools.gcp_bigquery,
            credentials=(auth._Credentials._credentials, auth._Credentials._credentials_init),
        )
        storage_module, rest_module = _originals["bq_storage"], _originals["gcp_bigquery"]
        beam_bigquery.bq_storage = _module_proxy(storage_module, BigQueryReadClient=_read_client_factory(storage_module.BigQueryReadClient))
        bigquery_tools.gcp_bigquery = _module_proxy(rest_module, Client=_rest_client_factory(rest_module.Client))
    # Table metadata (tables.get) and the temp-table clean-up go through Beam's apitools client.
    bigquery_v2_client.BigqueryV2.BASE_URL = url.rstrip("/") + "/bigquery/v2/"
    # Without this, Beam retries google.auth.default() for ~25 s, then talks to the emulator anyway.
    from google.auth.credentials import AnonymousCredentials

    auth._Credentials._credentials = auth._ApitoolsCredentialsAdapter(AnonymousCredentials())
    auth._Credentials._credentials_init = True


def _restore(auth: Any, beam_bigquery: Any, bigquery_tools: Any, bigquery_v2_client: Any) -> None:
    if not _originals:
        return
    bigquery_v2_client.BigqueryV2.BASE_URL = _originals["base_url"]
    beam_bigquery.bq_storage = _originals["bq_storage"]
    bigquery_tools.gcp_bigquery = _originals["gcp_bigquery"]
    auth._Credentials._credentials, auth._Credentials._credentials_init = _originals["credentials"]
    _originals.clear()


# Imported as a Beam plugin by an SDK worker process: apply the emulator variables there too.
if os.environ.get(REST_EMULATOR_VARIABLE):
    follow_emulator_variables()
