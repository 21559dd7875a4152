"""A prediction request's JSON body → typed instances, checked against the model's schema.

The body is Vertex AI Prediction's ``{"instances": [...], "parameters": {...}}``. Every check that
needs only the schema happens here, before the request reaches the model, so a bad request costs
no model time and its error names the instance index and the field; what only the model knows
(an unknown node id) comes back from :meth:`Predictor.predict` as an ``InstanceError``.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass

from components.errors import GnnflowError
from components.serving.predictor import ExistingNode, Instance, NewEdge, NewNode, ServingSchema

MAX_BODY_BYTES = 1_572_864  # Vertex AI's limit on an online prediction request: 1.5 MB
DEFAULT_MAX_INSTANCES = 64
DEFAULT_K = 10
MAX_K = 1000
_DIRECTIONS = ("out", "in")
_TOP_KEYS = ("instances", "parameters")
_PARAMETERS = ("k",)


class RequestError(GnnflowError):
    """A request the server refuses: ``status`` (400), and where: the instance index and the field
    (``features.age``, ``edges[2].node_id``, ``parameters.k``), None when the whole body is wrong."""

    def __init__(self, message: str, *, instance: int | None = None, field: str | None = None, status: int = 400) -> None:
        where = ", ".join(part for part in (f"instance {instance}" if instance is not None else "", field or "") if part)
        super().__init__(f"{where}: {message}" if where else message)
        self.message, self.instance, self.field, self.status = message, instance, field, status

    def body(self) -> dict[str, object]:
        """The JSON error the client gets."""
        return {"error": {"message": str(self), "instance": self.instance, "field": self.field}}


@dataclass(frozen=True)
class ParsedRequest:
    """What a valid body asks for: the instances, in order, and the top-k of link prediction."""

    instances: tuple[Instance, ...]
    k: int


def payload_too_large(size: int, limit: int = MAX_BODY_BYTES) -> RequestError:
    """Vertex AI answers a body over its limit with 400 INVALID_ARGUMENT, and so does this server."""
    return RequestError(f"request payload size exceeds the limit: {limit} bytes (got {size}{'+' if size > limit else ''})")


def _reject_constant(name: str) -> float:
    raise ValueError(f"{name} is not a JSON number")


def parse_request(body: bytes, schema: ServingSchema, max_instances: int = DEFAULT_MAX_INSTANCES) -> ParsedRequest:
    """The instances and ``k`` of ``body``, or a :class:`RequestError` naming what is wrong."""
    try:
        document = json.loads(body, parse_constant=_reject_constant)
    except (ValueError, UnicodeDecodeError) as exc:
        raise RequestError(f"the body is not valid JSON ({exc})") from None
    if not isinstance(document, dict):
        raise RequestError(f'the body must be a JSON object {{"instances": [...], "parameters": {{...}}}}, got {_kind(document)}')
    for key in document:
        if key not in _TOP_KEYS:
            raise RequestError(f"unknown field (a request holds {' and '.join(_TOP_KEYS)})", field=key)
    if "instances" not in document:
        raise RequestError("missing field", field="instances")
    raw = document["instances"]
    if not isinstance(raw, list):
        raise RequestError(f"expected a list of instances, got {_kind(raw)}", field="instances")
    if not raw:
        raise RequestError("no instances: give at least one", field="instances")
    if len(raw) > max_instances:
        raise RequestError(f"{len(raw)} instances, more than the limit of {max_instances} per request", field="instances")
    k = _parse_parameters(document.get("parameters", {}))
    return ParsedRequest(tuple(_parse_instance(item, index, schema) for index, item in enumerate(raw)), k)


def _parse_parameters(parameters: object) -> int:
    if not isinstance(parameters, dict):
        raise RequestError(f"expected an object, got {_kind(parameters)}", field="parameters")
    for key in parameters:
        if key not in _PARAMETERS:
            raise RequestError(f"unknown parameter (known: {', '.join(_PARAMETERS)})", field=f"parameters.{key}")
    k = parameters.get("k", DEFAULT_K)
    if not _is_int(k) or not 1 <= k <= MAX_K:
        raise RequestError(f"expected an integer from 1 to {MAX_K}, got {json.dumps(k)}", field="parameters.k")
    return int(k)


def _parse_instance(item: object, index: int, schema: ServingSchema) -> Instance:
    if not isinstance(item, dict):
        raise RequestError(f"expected an object, got {_kind(item)}", instance=index)
    node_type = _type_name(item, "node_type", schema.node_types, schema.default_node_type, index, "node_type")
    is_new = "features" in item or "edges" in item
    allowed = ("node_type", "features", "edges") if is_new else ("node_type", "node_id")
    for key in item:
        if key not in allowed:
            why = "an existing node has node_id only; a new node has features and edges" if key in ("node_id", "features", "edges") else ""
            raise RequestError(f"unknown field{f' ({why})' if why else ''}", instance=index, field=key)
    if not is_new:
        if "node_id" not in item:
            raise RequestError(
                "missing field: an existing node needs node_id (a new node: features and edges)", instance=index, field="node_id"
            )
        return ExistingNode(node_type, _node_id(item["node_id"], index, "node_id"))
    features = _features(item.get("features", {}), schema.feature_columns.get(node_type, {}), index, node_type)
    raw_edges = item.get("edges", [])
    if not isinstance(raw_edges, list):
        raise RequestError(f"expected a list of edges, got {_kind(raw_edges)}", instance=index, field="edges")
    edges = tuple(_edge(edge, index, f"edges[{position}]", schema) for position, edge in enumerate(raw_edges))
    return NewNode(node_type, features, edges)


def _features(raw: object, columns: Mapping[str, str], index: int, node_type: str) -> dict[str, object]:
    """The raw values, each of a column the model reads and of its kind. A missing column or a
    null is left to the model, which alone knows whether its transforms fill missing values."""
    if not isinstance(raw, dict):
        raise RequestError(f"expected an object of raw column values, got {_kind(raw)}", instance=index, field="features")
    for column, value in raw.items():
        kind, cls = columns.get(column), type(value)
        # The common cases first, cheaply (a wide table sends a hundred columns per instance).
        if (kind == "number" and (cls is int or cls is float) and math.isfinite(value)) or (kind == "category" and cls is str):
            continue
        field = f"features.{column}"
        if kind is None:
            known = _listing(sorted(columns))
            raise RequestError(
                f"the model reads no feature column {column!r} of node type {node_type!r} (it reads: {known})", instance=index, field=field
            )
        if value is None:
            continue
        if kind == "number" and not (_is_number(value) and math.isfinite(value)):
            raise RequestError(f"expected a number, got {json.dumps(value)}", instance=index, field=field)
        if kind == "category" and not (isinstance(value, str) or _is_int(value)):
            raise RequestError(f"expected a category (a string or an integer), got {json.dumps(value)}", instance=index, field=field)
    return dict(raw)


def _edge(raw: object, index: int, where: str, schema: ServingSchema) -> NewEdge:
    if not isinstance(raw, dict):
        raise RequestError(f"expected an edge object, got {_kind(raw)}", instance=index, field=where)
    for key in raw:
        if key not in ("edge_type", "node_id", "direction"):
            raise RequestError("unknown field (an edge has edge_type, node_id and direction)", instance=index, field=f"{where}.{key}")
    edge_type = _type_name(raw, "edge_type", schema.edge_types, schema.default_edge_type, index, f"{where}.edge_type")
    if "node_id" not in raw:
        raise RequestError("missing field", instance=index, field=f"{where}.node_id")
    node_id = _node_id(raw["node_id"], index, f"{where}.node_id")
    if "direction" not in raw:
        raise RequestError(
            'missing field: "out" (new node → node_id) or "in" (node_id → new node)', instance=index, field=f"{where}.direction"
        )
    direction = raw["direction"]
    if direction not in _DIRECTIONS:
        raise RequestError(f'expected "out" or "in", got {json.dumps(direction)}', instance=index, field=f"{where}.direction")
    return NewEdge(edge_type, node_id, direction)


def _type_name(raw: Mapping[str, object], key: str, known: tuple[str, ...], default: str | None, index: int, field: str) -> str:
    """A node or edge type: given, or the schema's default on a graph with only one."""
    if key not in raw:
        if default is None:
            raise RequestError(f"missing field: the graph has several ({', '.join(known)})", instance=index, field=field)
        return default
    value = raw[key]
    if not isinstance(value, str):
        raise RequestError(f"expected a string, got {json.dumps(value)}", instance=index, field=field)
    if value not in known:
        raise RequestError(f"unknown {key.replace('_', ' ')} {value!r} (known: {', '.join(known)})", instance=index, field=field)
    return value


def _node_id(value: object, index: int, field: str) -> str:
    """An original node id as the tables hold it; integers are accepted and compared as text."""
    if isinstance(value, str) and value:
        return value
    if _is_int(value):
        return str(value)
    raise RequestError(f"expected a node id (a non-empty string or an integer), got {json.dumps(value)}", instance=index, field=field)


def _listing(names: list[str], shown: int = 12) -> str:
    """``a, b, c`` (and how many more): a wide table's column list stays readable in an error."""
    if not names:
        return "none"
    more = f" and {len(names) - shown} more" if len(names) > shown else ""
    return ", ".join(names[:shown]) + more


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _kind(value: object) -> str:
    names = {dict: "an object", list: "a list", str: "a string", bool: "a boolean", int: "a number", float: "a number", type(None): "null"}
    return names.get(type(value), type(value).__name__)
