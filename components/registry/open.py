"""Opening a registry by its URI, and resolving ``REGISTRY@SELECTOR`` references to a model URI.

``vertex://projects/P/locations/R/models/NAME`` opens a Vertex AI Model Registry model
(:mod:`.vertex`); anything else (a local folder, ``file://``, ``gs://``) is a folder registry
(:mod:`.store`).
"""

from __future__ import annotations

import logging

from components import storage
from components.registry.base import VERTEX_SCHEME, Registry, split_reference
from components.registry.store import ALIASES_FILE, FolderRegistry, check_location

log = logging.getLogger("gnnflow.registry")


def open_registry(uri: str, *, create: bool) -> Registry:
    """The registry at ``uri``; ``create``: make an empty one where there is none (a train
    registering its first version). Without it, a registry that does not exist is a one-line
    error naming the URI."""
    if uri.startswith(VERTEX_SCHEME):
        from components.registry.vertex import VertexRegistry  # aiplatform loads only for Vertex registries

        return VertexRegistry.open(uri, create=create)
    return FolderRegistry.open(uri, create=create)


def resolve_model_reference(text: str) -> str:
    """The published model URI that ``text`` names: ``REGISTRY@blessed`` (any alias), ``REGISTRY@vN``
    or ``REGISTRY@latest`` resolve through the registry; a plain URI comes back unchanged."""
    reference = split_reference(text)
    if reference is None:
        return text
    registry_uri, selector = reference
    version = open_registry(registry_uri, create=False).resolve(selector)
    log.info("%s is %s: %s", text, version.name, version.model_uri)
    return version.model_uri


def check_registry_location(uri: str) -> None:
    """Before a run: the folder registry at ``uri`` exists, or can be created there (its bucket
    exists; the folder is writable, and empty when it is not a registry yet). Nothing is
    written. Vertex AI registries are checked when they are opened."""
    if uri.startswith(VERTEX_SCHEME):
        return
    root = storage.parse_uri(uri.rstrip("/") or uri)
    if not storage.exists(root.join(ALIASES_FILE)):
        check_location(root)
