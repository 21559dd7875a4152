"""What the Vertex AI Model Registry cannot hold, kept on Cloud Storage beside each version's artifacts.

A Vertex version's ``artifactUri`` is a published train output's generation folder
(``gs://.../model/gen-.../``). Beside the generations, in the output root, gnnflow keeps::

    _registry/versions/<generation>.json
        the registration: metrics, data version, lineage (input table → fingerprint) and the
        resolved config, written before the upload (so no version exists without it)
    _registry/aliases/<model id>/<time>-<alias>-v<N>-<token>.json
        one alias move to version N of that model: alias, version, previous, reason, time,
        model resource name (one object per move: concurrent moves never overwrite each other)

Train's re-publication deletes only ``gen-*`` folders, so these survive it.
"""

from __future__ import annotations

import datetime as dt
import json
import secrets
from dataclasses import asdict
from typing import Any

from components import storage
from components.errors import GnnflowError
from components.registry.base import AliasChange
from components.storage import GcsUri

RECORDS = "_registry"


def now() -> str:
    """The current time, ISO 8601 in UTC (microseconds: moves within one second keep their order)."""
    return dt.datetime.now(dt.UTC).isoformat(timespec="microseconds")


def artifact_place(artifact_uri: str) -> tuple[GcsUri, str] | None:
    """A version's artifact folder → (the published output root, the generation); None when the
    artifacts are not a gnnflow generation folder on Cloud Storage (a version made elsewhere)."""
    if not artifact_uri.startswith("gs://"):
        return None
    folder = storage.parse_uri(artifact_uri.rstrip("/"))
    assert isinstance(folder, GcsUri)
    if not folder.name.startswith("gen-") or not folder.parent.key:
        return None
    return folder.parent, folder.name


def version_record_uri(root: GcsUri, generation: str) -> GcsUri:
    return root.join(RECORDS, "versions", f"{generation}.json")


def write_version_record(root: GcsUri, generation: str, record: dict[str, Any]) -> None:
    storage.write_text(version_record_uri(root, generation), json.dumps(record, indent=1, sort_keys=True))


def read_version_record(root: GcsUri, generation: str) -> dict[str, Any]:
    """The registration record, or {} when there is none (a version registered outside gnnflow)."""
    uri = version_record_uri(root, generation)
    if not storage.exists(uri):
        return {}
    try:
        record = json.loads(storage.read_text(uri))
    except ValueError as exc:
        raise GnnflowError(f"{uri} is not a valid registration record: {exc}") from exc
    if not isinstance(record, dict):
        raise GnnflowError(f"{uri} is not a valid registration record: expected a JSON object")
    return record


def _aliases_folder(root: GcsUri, model_id: str) -> GcsUri:
    return root.join(RECORDS, "aliases", model_id)


def write_alias_change(root: GcsUri, model: str, change: AliasChange) -> GcsUri:
    """Records one move of an alias under the target version's output root; returns where."""
    stamp = change.at.replace("-", "").replace(":", "").replace("+0000", "Z")
    model_id = model.rsplit("/", 1)[-1]
    uri = _aliases_folder(root, model_id).join(f"{stamp}-{change.alias}-v{change.version}-{secrets.token_hex(3)}.json")
    storage.write_text(uri, json.dumps({**asdict(change), "model": model}, sort_keys=True))
    return uri


def read_alias_changes(roots: list[GcsUri], model: str) -> list[AliasChange]:
    """Every recorded move of ``model``'s aliases found under ``roots``, oldest first."""
    model_id = model.rsplit("/", 1)[-1]
    seen: set[str] = set()
    changes: list[AliasChange] = []
    for root in roots:
        for uri in storage.list_files(_aliases_folder(root, model_id)):
            if str(uri) in seen or not str(uri).endswith(".json"):
                continue
            seen.add(str(uri))
            try:
                raw = json.loads(storage.read_text(uri))
                if raw.pop("model") != model:
                    continue
                changes.append(AliasChange(**raw))
            except (ValueError, KeyError, TypeError) as exc:
                raise GnnflowError(f"{uri} is not a valid alias history record: {exc}") from exc
    return sorted(changes, key=lambda change: change.at)
