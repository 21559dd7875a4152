"""What a trigger message carries, and how to find it inside the envelopes that deliver it."""

from __future__ import annotations

import base64
import binascii
import json
import re
from collections.abc import Mapping
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from components.config import parse_overrides
from components.errors import GnnflowError


class TriggerError(GnnflowError):
    """The request or its payload is malformed: answered 400, nothing submitted."""


class TriggerPayload(BaseModel):
    """One run: which config, which overrides, and how it is named."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    config_uri: str = Field(min_length=1, description="The config YAML (gs://); read and validated at every message.")
    overrides: dict[str, Any] = Field(default_factory=dict, description='Dotted config keys, e.g. {"training.epochs": 20}.')
    display_name: str | None = Field(None, description="Name shown in the console (default: gnnflow-<timestamp>).")
    labels: dict[str, str] = Field(default_factory=dict, description="Vertex AI labels of the run.")
    infer_mode: Literal["auto", "sampled", "exact"] = Field(
        "auto", description="How the infer step computes embeddings (auto: exact when training.mode is full_graph, else sampled)."
    )
    enable_caching: bool | None = Field(None, description="Force step caching on or off (default: the compiled setting).")
    from_model: str | None = Field(
        None,
        min_length=1,
        description="Inference-only run with this model: a published model URI or REGISTRY@blessed / REGISTRY@vN "
        "(GNNFLOW_PACKAGE, if set, must be the pipeline compiled with --from-model).",
    )

    @field_validator("overrides", mode="before")
    @classmethod
    def _json_text(cls, value: Any) -> Any:
        # Scheduler jobs are often written by hand: accept the overrides as JSON text too.
        return parse_overrides(value, "field 'overrides'") if isinstance(value, str) else value


def parse_payload(payload: Any) -> TriggerPayload:
    """Validates a decoded payload; the error names the field."""
    if not isinstance(payload, dict):
        raise TriggerError(f"bad payload: expected a JSON object, got {type(payload).__name__}")
    try:
        return TriggerPayload.model_validate(payload)
    except ValidationError as exc:
        problems = []
        for error in exc.errors():
            field = ".".join(str(p) for p in error["loc"]) or "payload"
            what = "unknown field" if error["type"] == "extra_forbidden" else error["msg"]
            problems.append(f"field '{field}': {what}")
        raise TriggerError("bad payload: " + "; ".join(problems)) from None
    except GnnflowError as exc:
        raise TriggerError(f"bad payload: {exc}") from None


def payload_from_request(body: bytes, headers: Mapping[str, str]) -> tuple[Any, str | None]:
    """The payload inside a request body, and the id of the message that carried it.

    Understands a Pub/Sub push envelope (``{"message": {"data": base64, "messageId": ...}}``),
    a CloudEvent in structured mode (``{"specversion": ..., "data": ...}``) or binary mode
    (``ce-*`` headers, as Eventarc delivers Pub/Sub messages), and a plain JSON payload.
    """
    headers = {k.lower(): v for k, v in headers.items()}
    try:
        document = json.loads(body or b"null")
    except ValueError as exc:
        raise TriggerError(f"bad request: the body is not JSON ({exc})") from None
    message_id = None
    if "ce-specversion" in headers:
        message_id, data = headers.get("ce-id"), document
    elif isinstance(document, dict) and "specversion" in document:
        message_id = document.get("id")
        data = document.get("data")
        if data is None and "data_base64" in document:
            data = _json_from_base64(document["data_base64"], "CloudEvent data_base64")
    else:
        data = document
    if isinstance(data, dict) and isinstance(data.get("message"), dict):
        message = data["message"]
        message_id = message.get("messageId") or message.get("message_id") or message_id
        if not message.get("data"):
            raise TriggerError("bad request: the Pub/Sub message has no data (publish the payload as the message body)")
        data = _json_from_base64(message["data"], "Pub/Sub message.data")
    return data, message_id


def _json_from_base64(text: Any, what: str) -> Any:
    try:
        return json.loads(base64.b64decode(text, validate=True))
    except (binascii.Error, TypeError, ValueError) as exc:
        raise TriggerError(f"bad request: {what} is not base64-encoded JSON ({exc})") from None


def job_id_for(message_id: str | None) -> str | None:
    """A job id derived from the message id, so a redelivered message submits nothing new."""
    if not message_id:
        return None
    return ("gnnflow-msg-" + re.sub(r"[^a-z0-9-]+", "-", str(message_id).lower()).strip("-"))[:128]
