"""Where gnnflow's Google Cloud API clients send their requests, and with which credentials.

An endpoint is what a generated client takes as ``client_options.api_endpoint``: a host (the
regional Vertex AI host by default) or a URL. An ``http://`` endpoint is an emulator or a request
recorder on this machine: it gets anonymous credentials, since gnnflow never sends credentials
over plain HTTP; any other gets None, the application default credentials."""

from __future__ import annotations

from typing import Any


def vertex_endpoint(region: str, override: str | None = None) -> str:
    """``override`` when given, else Vertex AI's regional host."""
    return override or f"{region}-aiplatform.googleapis.com"


def endpoint_url(endpoint: str) -> str:
    """The endpoint as a URL (a bare host is reached over HTTPS)."""
    return endpoint if "://" in endpoint else f"https://{endpoint}"


def is_plain_http(endpoint: str) -> bool:
    return endpoint.startswith("http://")


def credentials_for(endpoint: str) -> Any:
    """Anonymous credentials for a plain-HTTP endpoint; None (application default) otherwise."""
    if is_plain_http(endpoint):
        from google.auth.credentials import AnonymousCredentials

        return AnonymousCredentials()
    return None
