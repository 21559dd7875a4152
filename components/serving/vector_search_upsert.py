"""New nodes' embeddings into a Vertex AI Vector Search index, as they are served (streaming update).

``upsert_embeddings(index, [(id, vector, restricts), ...])`` sends the points with
``aiplatform.MatchingEngineIndex.upsert_datapoints`` (the index must have been created with
``index_update_method=STREAM_UPDATE``: a batch-updated index refuses it). Each point's restricts
(``{"node_type": "paper"}``) become one allow-list per namespace, so queries can be filtered on
them. An upsert replaces a point with the same id, so repeating a request is harmless: it is
retried on transient failures until the service deadline (``GNNFLOW_SERVICE_DEADLINE_S``), and
the whole call is given up on at that deadline even where a connection hangs.

Requests go to ``REGION-aiplatform.googleapis.com`` with the application default credentials,
or to ``api_endpoint``; an ``http://`` one (a recorder in tests) gets anonymous credentials.
"""

from __future__ import annotations

import logging
import math
import re
from collections.abc import Sequence
from typing import Any

from components.errors import GnnflowError
from components.services import deadline
from components.services.endpoints import credentials_for, endpoint_url, vertex_endpoint

log = logging.getLogger("gnnflow.serving")

SERVICE_NAME = "Vertex AI Vector Search"
MAX_POINTS_PER_REQUEST = 1000  # Vector Search's limit on the datapoints of one upsert request
_INDEX = re.compile(r"^projects/(?P<project>[^/]+)/locations/(?P<region>[a-z]+-[a-z0-9-]+)/indexes/[0-9A-Za-z_-]+$")

Datapoint = tuple[str, list[float], dict[str, str]]


def upsert_embeddings(index: str, datapoints: Sequence[Datapoint], *, api_endpoint: str | None = None) -> int:
    """Upserts ``datapoints`` (id, feature vector, restricts) into ``index``
    (``projects/P/locations/R/indexes/ID``); returns how many were sent.

    Raises:
        GnnflowError: a malformed index name or datapoint (naming it), a refusal by the service,
            or no answer within the service deadline (one line naming the index and endpoint).
    """
    match = _INDEX.match(index)
    if not match:
        raise GnnflowError(f"Vector Search index {index!r}: expected projects/PROJECT/locations/REGION/indexes/ID")
    points = _checked(index, datapoints)
    if not points:
        return 0
    endpoint = vertex_endpoint(match["region"], api_endpoint)
    service = deadline.Service(SERVICE_NAME, endpoint_url(endpoint))
    target = _open_index(index, match["project"], match["region"], endpoint)
    for start in range(0, len(points), MAX_POINTS_PER_REQUEST):
        chunk = points[start : start + MAX_POINTS_PER_REQUEST]
        subject = f"upserting {len(chunk)} datapoints into {index}"
        _bounded(service, subject, lambda chunk=chunk: target.upsert_datapoints(datapoints=_datapoints(chunk)))
    log.info("upserted %d datapoints into %s", len(points), index)
    return len(points)


def _checked(index: str, datapoints: Sequence[Datapoint]) -> list[Datapoint]:
    """The datapoints, after checking ids, vectors (one length, finite) and restricts."""
    dimensions: int | None = None
    for position, (point_id, vector, restricts) in enumerate(datapoints):
        where = f"datapoint {position} ({point_id!r}) for {index}"
        if not isinstance(point_id, str) or not point_id:
            raise GnnflowError(f"{where}: the id must be a non-empty string")
        if not vector or not all(isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x) for x in vector):
            raise GnnflowError(f"{where}: the feature vector must be a non-empty list of finite numbers")
        if dimensions is not None and len(vector) != dimensions:
            raise GnnflowError(f"{where}: {len(vector)} dimensions, but the first datapoint has {dimensions}")
        dimensions = len(vector)
        if not all(isinstance(k, str) and k and isinstance(v, str) for k, v in restricts.items()):
            raise GnnflowError(f"{where}: restricts must map a namespace to a string value")
    return list(datapoints)


def _datapoints(points: Sequence[Datapoint]) -> list[Any]:
    from google.cloud.aiplatform_v1.types import IndexDatapoint

    return [
        IndexDatapoint(
            datapoint_id=point_id,
            feature_vector=[float(x) for x in vector],
            restricts=[IndexDatapoint.Restriction(namespace=k, allow_list=[v]) for k, v in sorted(restricts.items())],
        )
        for point_id, vector, restricts in points
    ]


def _open_index(index: str, project: str, region: str, endpoint: str) -> Any:
    """The SDK's index object (it reads the index once), over REST."""
    from google.cloud import aiplatform

    aiplatform.init(project=project, location=region, credentials=credentials_for(endpoint), api_endpoint=endpoint, api_transport="rest")
    service = deadline.Service(SERVICE_NAME, endpoint_url(endpoint))
    return _bounded(service, f"Vector Search index {index}", lambda: aiplatform.MatchingEngineIndex(index_name=index))


def _bounded(service: deadline.Service, subject: str, fn: Any) -> Any:
    """``fn()`` retried on transient failures and given up on at the service deadline, even when
    a connection hangs (the SDK's upsert takes no timeout); a refusal is one line."""
    from google.api_core import exceptions as api_exceptions

    try:
        return deadline.call_within(service, subject, lambda: deadline.call(service, subject, fn))
    except api_exceptions.GoogleAPICallError as exc:
        message = getattr(exc, "message", None) or str(exc)
        raise GnnflowError(f"{subject}: {service.name} at {service.endpoint} refused: {exc.code} {message}") from exc
