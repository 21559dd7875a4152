"""Reading a config: YAML text or a file (local or gs://), strict about keys, plus dotted overrides."""

from __future__ import annotations

import json
import os

import yaml
from pydantic import ValidationError

from components import storage
from components.config.run import GnnflowConfig
from components.errors import GnnflowError
from components.services import deadline as service_deadline


def _format_error(source: str, error: ValidationError) -> str:
    lines = [f"invalid config {source}:"]
    for e in error.errors():
        key = "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in e["loc"]).lstrip(".")
        what = "unknown key" if e["type"] == "extra_forbidden" else e["msg"]
        lines.append(f"  key '{key}': {what}" if key else f"  {what}")
    return "\n".join(lines)


def _resolve_relative_uris(raw: dict, base_folder: str | None) -> None:
    if base_folder is None or not isinstance(raw.get("graph"), dict):
        return
    for section in ("nodes", "edges"):
        for table in raw["graph"].get(section) or []:
            if isinstance(table, dict) and isinstance(table.get("uri"), str):
                uri = table["uri"]
                if "://" not in uri and not os.path.isabs(os.path.expanduser(uri)):
                    table["uri"] = os.path.join(base_folder, uri)


class _DuplicateKeyError(yaml.constructor.ConstructorError):
    pass


class _StrictLoader(yaml.SafeLoader):
    """A safe loader that refuses a key given twice in one mapping (where plain YAML loading
    keeps the last value silently: ``epochs: 50`` then ``epochs: 7``)."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict:
        seen: dict[object, int] = {}
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=True)
            line = key_node.start_mark.line + 1
            if key in seen:
                raise _DuplicateKeyError(None, None, f"key {key!r} appears twice in one section (lines {seen[key]} and {line})")
            seen[key] = line
        return super().construct_mapping(node, deep=deep)


def parse_config(text: str, source: str, base_folder: str | None = None) -> GnnflowConfig:
    """Validates YAML text; ``source`` names it in errors."""
    try:
        raw = yaml.load(text, Loader=_StrictLoader)  # noqa: S506 - a SafeLoader subclass
    except _DuplicateKeyError as exc:
        raise GnnflowError(f"config {source}: {exc.problem}") from None
    except yaml.YAMLError as exc:
        raise GnnflowError(f"config {source} is not valid YAML: {exc}") from exc
    if not isinstance(raw, dict):
        raise GnnflowError(f"config {source} must be a YAML mapping, got {type(raw).__name__}")
    _resolve_relative_uris(raw, base_folder)
    try:
        return _adopted(GnnflowConfig.model_validate(raw))
    except ValidationError as exc:
        raise GnnflowError(_format_error(source, exc)) from None


def _adopted(config: GnnflowConfig) -> GnnflowConfig:
    """``config``, whose service deadline now bounds this process's retries of cloud services."""
    service_deadline.configure(config.resources.service_deadline_s)
    return config


def load_config(uri: storage.Uri | str) -> GnnflowConfig:
    """Reads and validates a config file from a local path or ``gs://``."""
    uri = storage.parse_uri(uri)
    base = os.path.dirname(uri.path) if isinstance(uri, storage.LocalUri) else None
    return parse_config(storage.read_text(uri), str(uri), base)


def apply_overrides(config: GnnflowConfig, overrides: dict[str, object], source: str = "overrides") -> GnnflowConfig:
    """``config`` with dotted keys replaced (``{"training.epochs": 5, "resources.world_size": 4}``).

    The result is validated like a file, so a bad override is an error naming its key.
    """
    raw = config.model_dump(mode="json")
    for dotted, value in overrides.items():
        node = raw
        *parents, leaf = dotted.split(".")
        for part in parents:
            child = node.get(part) if isinstance(node, dict) else None
            if not isinstance(child, dict):
                raise GnnflowError(f"{source}: key '{dotted}' does not name a config field ('{part}' is not a section)")
            node = child
        if not isinstance(node, dict) or leaf not in node:
            raise GnnflowError(f"{source}: key '{dotted}' does not name a config field")
        node[leaf] = value
    try:
        return _adopted(GnnflowConfig.model_validate(raw))
    except ValidationError as exc:
        raise GnnflowError(_format_error(source, exc)) from None


def parse_overrides(text: str | None, source: str = "overrides") -> dict[str, object]:
    """A JSON object of dotted keys (the form pipeline parameters and ``--set`` take)."""
    if not text:
        return {}
    try:
        value = json.loads(text)
    except ValueError as exc:
        raise GnnflowError(f"{source} is not valid JSON: {exc}") from exc
    if not isinstance(value, dict):
        raise GnnflowError(f"{source} must be a JSON object of dotted keys, got {type(value).__name__}")
    return value


def resolve_config(config: str, overrides: str | dict[str, object] | None = None) -> GnnflowConfig:
    """The config a pipeline parameter names: YAML text, or the URI of a YAML file, plus overrides.

    Pipelines pass the YAML text so that KFP's cache key changes whenever the config does; a
    URI is read at run time (cached runs then key on the URI alone).
    """
    text = config.strip()
    is_uri = "\n" not in text and (text.startswith(("gs://", "file://", "/", "./")) or text.endswith((".yaml", ".yml")))
    resolved = load_config(text) if is_uri else parse_config(text, "the config parameter")
    extra = parse_overrides(overrides) if isinstance(overrides, str) or overrides is None else overrides
    return apply_overrides(resolved, extra) if extra else resolved
