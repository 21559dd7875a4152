"""A Vertex AI Model Registry model as gnnflow's model registry (``vertex://projects/P/locations/R/models/M``).

What lives where:

- **Versions** are the model's Vertex versions, numbered by Vertex (``1``, ``2``, ...: gnnflow's
  ``v1``, ``v2``). ``register`` uploads one with ``aiplatform.Model.upload``: the first creates the
  model with id ``M``, later ones pass ``parent_model``. Its ``artifact_uri`` is the published
  train output's generation folder on Cloud Storage (Vertex requires ``gs://``; a local model is
  refused), the serving container is the step image, the labels carry the data version and the
  generation, the version description the validation and test figures. Registering a model whose
  generation is already a version returns that version (a retried step does not add another).
- **Metrics, lineage, config**: ``versions()`` reads each version's ``metrics.json`` from its
  artifact folder, and data version, lineage and config from the registration record beside
  the generations (:mod:`.vertex_records`).
- **Aliases** are Vertex version aliases. ``set_alias`` makes one ``mergeVersionAliases`` call
  on the target version; Vertex takes the alias off the version that held it in the same call,
  so ``blessed`` moves atomically. ``blessed`` takes Vertex's ``default`` alias with it, so a
  deployment of the model without a version serves the blessed one. Each upload moves
  ``latest`` to the new version.
- **History**: Vertex keeps none. Each ``set_alias`` (gate, promote, rollback) writes one
  object with the move and its reason under the target version's output root
  (``_registry/aliases/``, after the move succeeded); ``history()`` gathers them from every
  version's root. What survives: the moves gnnflow made, as long as the output root of the
  version moved to exists. Not recorded: moves made in the console or with other tools, and the
  implied moves of ``latest`` (each upload) and ``default`` (with ``blessed``).
- A version's ``model_uri`` is its published train output; ``resolve`` refuses a version whose
  output was re-published since (its manifest names another generation, so the registered
  model is gone).
"""

from __future__ import annotations

import logging
import os
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from components import storage
from components.config.registry import BLESSED
from components.errors import GnnflowError
from components.registry import vertex_records as records
from components.registry.base import AliasChange, ModelVersion, parse_version
from components.registry.vertex_uri import (
    NEW_MODEL_ID,
    SERVICE_NAME,
    ModelMissing,
    VertexModelUri,
    init_sdk,
    model_client,
    parse_vertex_uri,
    request,
    timeout_s,
)
from components.storage import GcsUri

log = logging.getLogger("gnnflow.registry")

IMAGE_VARIABLE = "GNNFLOW_IMAGE"  # the step image, when the caller does not name one
METRICS_FILE = "metrics.json"  # train's (components.train.output.METRICS_FILE; train sits above the registry)
LATEST, DEFAULT = "latest", "default"
_ALIAS = re.compile(r"^[a-z][a-zA-Z0-9-]{0,126}[a-z0-9-]$")
_LABEL = re.compile(r"[^a-z0-9_-]")


@dataclass
class VertexRegistry:
    """The :class:`~components.registry.base.Registry` protocol on one Vertex AI model (see the module docstring)."""

    target: VertexModelUri
    image: str | None = None  # the serving container of new versions (default: $GNNFLOW_IMAGE)
    uri: str = field(init=False)  # the registry's ``vertex://`` URI

    def __post_init__(self) -> None:
        self.uri = self.target.uri

    @classmethod
    def open(cls, uri: str, *, create: bool = False, image: str | None = None) -> VertexRegistry:
        """The registry at ``uri``; the model must exist unless ``create`` (the first ``register`` makes it)."""
        target = parse_vertex_uri(uri)
        registry = cls(target, image)
        if registry._exists():
            return registry
        if not create:
            raise GnnflowError(
                f"registry {uri}: model {target.name!r} does not exist in {SERVICE_NAME} "
                f"(project {target.project}, region {target.region}); register a version first, or check the URI"
            )
        if not NEW_MODEL_ID.match(target.name):
            raise GnnflowError(
                f"registry {uri}: model {target.name!r} does not exist, and a new model's id must start with a "
                "letter (a number names a model Vertex AI created)"
            )
        return registry

    # ---------------------------------------------------------------------------- reading
    def versions(self) -> list[ModelVersion]:
        return [self._version(model) for model in self._listed()]

    def resolve(self, selector: str) -> ModelVersion:
        listed = self._listed()
        number = parse_version(selector, self.uri)
        if number is not None:
            found = [m for m in listed if m.version_id == str(number)]
        elif selector == LATEST:
            found = listed[-1:]
        else:
            found = [m for m in listed if selector in m.version_aliases]
        if not found:
            have = ", ".join(f"v{m.version_id}" for m in listed) or "none"
            what = f"version v{number}" if number is not None else f"alias {selector!r}"
            raise GnnflowError(f"{self.uri}@{selector}: no {what} in this registry (versions: {have})")
        version = self._version(found[0])
        _check_still_published(version, found[0].artifact_uri, f"{self.uri}@{selector}")
        return version

    def history(self) -> list[AliasChange]:
        roots = {str(p[0]): p[0] for m in self._listed() if (p := records.artifact_place(m.artifact_uri))}
        return records.read_alias_changes(list(roots.values()), self.target.resource_name)

    # ---------------------------------------------------------------------------- writing
    def register(
        self,
        model_uri: str,
        metrics: dict[str, Any],
        *,
        data_version: str,
        lineage: dict[str, str],
        config_yaml: str,
        aliases: Sequence[str] = (),
        image: str | None = None,
    ) -> ModelVersion:
        """Uploads the published train output at ``model_uri`` as a new version (see the module docstring)."""
        image = image or self.image or os.environ.get(IMAGE_VARIABLE, "").strip()
        if not image:
            raise GnnflowError(f"registry {self.uri}: registering needs the step image as the serving container (set {IMAGE_VARIABLE})")
        for alias in aliases:
            _check_alias(alias, self.uri)
        root = storage.parse_uri(model_uri)
        if not isinstance(root, GcsUri):
            raise GnnflowError(
                f"{model_uri}: {SERVICE_NAME} keeps models on Cloud Storage only; publish the model to a gs:// output "
                f"(output.root) to register it in {self.uri}, or use a folder registry"
            )
        generation = storage.open_published(root).manifest.generation
        artifact_uri = str(root.join(generation))
        listed = self._listed(missing_ok=True)
        for model in listed:
            if model.artifact_uri.rstrip("/") == artifact_uri:
                log.info("%s is already version v%s of %s; not uploading it again", artifact_uri, model.version_id, self.uri)
                return self._version(model)
        records.write_version_record(
            root,
            generation,
            {"model_uri": str(root), "generation": generation, "metrics": metrics, "data_version": data_version,
             "lineage": lineage, "config_yaml": config_yaml, "registered_at": records.now()},
        )  # fmt: skip
        holders = {a: _holder(listed, a) for a in aliases}
        uploaded = self._upload(artifact_uri, image, metrics, data_version, generation, parent=bool(listed), aliases=aliases)
        version = int(uploaded.version_id)
        log.info("registered %s as v%d of %s", artifact_uri, version, self.uri)
        for alias in aliases:
            self._record(AliasChange(alias, version, holders[alias], "set when registered", records.now()), root)
        return self._version(uploaded)

    def set_alias(self, alias: str, version: int, reason: str) -> AliasChange:
        _check_alias(alias, self.uri)
        listed = self._listed()
        target = next((m for m in listed if m.version_id == str(version)), None)
        if target is None:
            have = ", ".join(f"v{m.version_id}" for m in listed) or "none"
            raise GnnflowError(f"{self.uri}@v{version}: no such version in this registry (versions: {have})")
        previous = _holder(listed, alias)
        change = AliasChange(alias, version, previous, reason, records.now())
        moved = [alias, DEFAULT] if alias == BLESSED and DEFAULT not in target.version_aliases else [alias]
        client = model_client(self.target)
        request(
            self.target,
            f"moving alias {alias!r} of {self.uri} to v{version}",
            lambda: client.merge_version_aliases(name=self.target.versioned(version), version_aliases=moved, timeout=timeout_s()),
        )
        place = records.artifact_place(target.artifact_uri)
        if place is None:
            raise GnnflowError(
                f"{self.uri}: alias {alias!r} now points at v{version}, but the move is not in the history: the "
                f"version's artifacts ({target.artifact_uri or 'none'}) are not a gnnflow model on Cloud Storage"
            )
        self._record(change, place[0])
        log.info("%s: %s → v%d (was %s): %s", self.uri, alias, version, f"v{previous}" if previous else "none", reason)
        return change

    # ---------------------------------------------------------------------------- Vertex AI
    def _exists(self) -> bool:
        client = model_client(self.target)
        try:
            request(self.target, f"registry {self.uri}", lambda: client.get_model(name=self.target.resource_name, timeout=timeout_s()))
        except ModelMissing:
            return False
        return True

    def _listed(self, *, missing_ok: bool = False) -> list[Any]:
        """Every version of the model (the API's Model messages), oldest first; none of a model
        that does not exist yet when ``missing_ok``."""
        client = model_client(self.target)
        try:
            found = request(
                self.target,
                f"registry {self.uri}",
                lambda: list(client.list_model_versions(name=self.target.resource_name, timeout=timeout_s())),
            )
        except ModelMissing as exc:
            if missing_ok:
                return []
            raise GnnflowError(f"registry {self.uri}: the model does not exist (no version registered yet)") from exc
        return sorted(found, key=lambda model: int(model.version_id))

    def _upload(
        self,
        artifact_uri: str,
        image: str,
        metrics: dict[str, Any],
        data_version: str,
        generation: str,
        *,
        parent: bool,
        aliases: Sequence[str],
    ) -> Any:
        from google.cloud import aiplatform

        figures = ", ".join(f"{k}={v:.4g}" for k, v in sorted(metrics.items()) if k.startswith(("val_", "test_")) and _number(v))
        description = f"gnnflow model {artifact_uri}" + (f"; {figures}" if figures else "") + f"; data version {data_version or 'unknown'}"
        labels = {"gnnflow-generation": _label(generation), **({"gnnflow-data-version": _label(data_version)} if data_version else {})}
        init_sdk(self.target)
        uploaded = request(
            self.target,
            f"uploading {artifact_uri} to {self.uri}",
            lambda: aiplatform.Model.upload(
                serving_container_image_uri=image,
                artifact_uri=artifact_uri,
                model_id=None if parent else self.target.name,
                parent_model=self.target.resource_name if parent else None,
                display_name=self.target.name,
                is_default_version=False,  # `default` follows `blessed` (set_alias), not each upload
                version_aliases=[LATEST, *aliases],
                version_description=description,
                labels=labels,
                project=self.target.project,
                location=self.target.region,
                upload_request_timeout=timeout_s(),
            ),
            idempotent=False,  # a repeated upload would be another version
        )
        return uploaded.gca_resource

    def _record(self, change: AliasChange, root: GcsUri) -> None:
        try:
            records.write_alias_change(root, self.target.resource_name, change)
        except GnnflowError as exc:
            raise GnnflowError(
                f"{self.uri}: alias {change.alias!r} now points at v{change.version}, but recording the move failed: {exc}"
            ) from exc

    def _version(self, model: Any) -> ModelVersion:
        """A Vertex version as gnnflow's :class:`ModelVersion` (reading its metrics and registration record)."""
        place = records.artifact_place(model.artifact_uri)
        record = records.read_version_record(*place) if place else {}
        metrics: dict[str, Any] = {}
        if place:
            metrics_uri = storage.parse_uri(model.artifact_uri.rstrip("/")).join(METRICS_FILE)
            if storage.exists(metrics_uri):
                metrics = _json_object(storage.read_text(metrics_uri), str(metrics_uri))
            else:
                log.warning("%s: v%s's %s is gone (the model was re-published or deleted)", self.uri, model.version_id, metrics_uri)
        root = str(place[0]) if place else model.artifact_uri
        return ModelVersion(
            version=int(model.version_id),
            model_uri=root,
            metrics=metrics,
            created=model.version_create_time.isoformat() if model.version_create_time else "",
            aliases=tuple(sorted(model.version_aliases)),
            source_model_uri=root,
            data_version=str(record.get("data_version") or model.labels.get("gnnflow-data-version", "")),
            lineage=dict(record.get("lineage") or {}),
            config_yaml=str(record.get("config_yaml") or ""),
        )


def _check_alias(alias: str, registry: str) -> None:
    if not _ALIAS.match(alias) or alias in (LATEST, DEFAULT):
        raise GnnflowError(
            f"{registry}: alias {alias!r} cannot be set: a Vertex AI alias is lower-case letters, digits and '-', starting "
            f"with a letter (2 to 128 characters), and {LATEST!r} and {DEFAULT!r} move on their own"
        )


def _check_still_published(version: ModelVersion, artifact_uri: str, reference: str) -> None:
    place = records.artifact_place(artifact_uri)
    if place is None:
        raise GnnflowError(f"{reference}: the version's artifacts ({artifact_uri or 'none'}) are not a gnnflow model on Cloud Storage")
    root, generation = place
    published = storage.open_published(root).manifest.generation
    if published != generation:
        raise GnnflowError(
            f"{reference}: v{version.version}'s model ({generation}) is no longer published at {root}, which now holds "
            f"{published} (train re-published that output); register the new model, or pick another version"
        )


def _holder(listed: Sequence[Any], alias: str) -> int | None:
    return next((int(m.version_id) for m in listed if alias in m.version_aliases), None)


def _label(value: str) -> str:
    """A Vertex label value: lower-case letters, digits, ``_`` and ``-``, at most 63 characters."""
    return _LABEL.sub("_", value.lower())[:63]


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _json_object(text: str, source: str) -> dict[str, Any]:
    import json

    try:
        value = json.loads(text)
    except ValueError as exc:
        raise GnnflowError(f"{source} is not valid JSON: {exc}") from exc
    if not isinstance(value, dict):
        raise GnnflowError(f"{source}: expected a JSON object")
    return value
