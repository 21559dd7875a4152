"""The registry in a folder on this machine or under a ``gs://`` prefix.

Layout under the registry's URI::

    aliases.json                {alias: version number}; its presence makes the folder a registry
    history.jsonl               one AliasChange per line, in the order the moves were recorded
    versions/v<N>/version.json  the version's record (a ModelVersion without its aliases)
    versions/v<N>/model/        the registry's own copy of the published train output (manifest,
                                generation folder, checksums), so it outlives the run that trained it

Several writers may share a registry (two trains finishing together, a promote during a run):
a version number is claimed by creating its ``version.json`` only if absent, so no two writers get
the same one, and ``aliases.json`` / ``history.jsonl`` change only by compare-and-swap, so no move
is lost (:mod:`components.storage.conditional`). A version counts once its model copy is
published; a claim whose copy never finished is skipped (and its number never reused).
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import os
import re
import secrets
import shutil
from dataclasses import asdict, replace
from typing import Any

from components import storage
from components.errors import GnnflowError
from components.registry.base import AliasChange, ModelVersion, parse_version
from components.storage import gcs
from components.storage.publish import MANIFEST_NAME

log = logging.getLogger("gnnflow.registry")

ALIASES_FILE = "aliases.json"
HISTORY_FILE = "history.jsonl"
VERSIONS_FOLDER = "versions"
VERSION_FILE = "version.json"
MODEL_FOLDER = "model"
LATEST = "latest"
CLAIM_ATTEMPTS = 1000  # version numbers tried before giving up (each failure is another writer's claim)
_ALIAS = re.compile(r"^[A-Za-z][A-Za-z0-9_-]*$")
_VERSION_FOLDER = re.compile(r"^v([1-9][0-9]*)$")
_SOURCE_GENERATION = "source_generation"  # in the model copy's manifest metadata
_CLAIM_KEY = "claim"  # a random token in version.json: tells this writer's claim from an identical one


def now() -> str:
    """The current time, ISO 8601 in UTC, to the microsecond."""
    return dt.datetime.now(dt.UTC).isoformat(timespec="microseconds")


def check_alias(alias: str, registry: str) -> None:
    """An alias is a name (letters, digits, ``-``, ``_``) that cannot be read as a version or ``latest``."""
    if not _ALIAS.match(alias) or alias == LATEST or re.match(r"^v[0-9]+$", alias):
        raise GnnflowError(f"{registry}: {alias!r} cannot be an alias (a name of letters, digits, '-' and '_', not 'latest' nor vN)")


def describe_versions(versions: list[ModelVersion]) -> str:
    """``v1, v2, v5`` or ``none yet``, for errors that list what there is."""
    return ", ".join(v.name for v in versions) if versions else "none yet"


def check_location(root: storage.Uri) -> None:
    """That a registry can be created at ``root``: its bucket exists (gs://), it is not a file, and
    it is empty or already a registry (a registry is never made inside another output)."""
    where = f"model registry {root}"
    if isinstance(root, storage.GcsUri):
        if not gcs.bucket_exists(root.bucket):
            raise GnnflowError(f"{where} cannot be created: bucket gs://{root.bucket} does not exist")
    else:
        assert isinstance(root, storage.LocalUri)
        _check_local_folder(root.path, where)
    if storage.exists(root.join(ALIASES_FILE)):
        return
    found = storage.list_files(root)
    if found:
        raise GnnflowError(f"{where} cannot be created: it already holds other files (e.g. {found[0]}) but no {ALIASES_FILE}")


def _check_local_folder(path: str, where: str) -> None:
    """The folder exists and is writable, or its nearest existing ancestor is a writable folder."""
    existing = path
    while not os.path.exists(existing):
        existing = os.path.dirname(existing)
    if not os.path.isdir(existing):
        raise GnnflowError(f"{where} cannot be created: {existing} is a file")
    if not os.access(existing, os.W_OK | os.X_OK):
        raise GnnflowError(f"{where} cannot be created: {existing} is not writable")


class FolderRegistry:
    """A registry stored under a local folder or a ``gs://`` prefix (see the module docstring)."""

    def __init__(self, root: storage.Uri) -> None:
        self.root = root
        self.uri = str(root)  # what errors and references name it by

    @classmethod
    def open(cls, uri: str, *, create: bool) -> FolderRegistry:
        """The registry at ``uri``; with ``create``, a new empty one when there is none yet."""
        root = storage.parse_uri(uri.rstrip("/") or uri)
        registry = cls(root)
        if storage.exists(root.join(ALIASES_FILE)):
            return registry
        if not create:
            if isinstance(root, storage.GcsUri) and not gcs.bucket_exists(root.bucket):
                raise GnnflowError(f"model registry {root} does not exist: there is no bucket gs://{root.bucket}")
            raise GnnflowError(f"model registry {root} does not exist: no {ALIASES_FILE} there (check the URI, or register a model first)")
        check_location(root)
        try:
            if storage.create_exclusive(root.join(ALIASES_FILE), b"{}\n"):
                log.info("created model registry %s", root)
        except OSError as exc:  # a local folder that cannot be written after all
            raise GnnflowError(f"model registry {root} cannot be created: {exc.strerror} ({exc.filename})") from exc
        return registry

    # ---------------------------------------------------------------- versions

    def register(
        self, model_uri: str, metrics: dict[str, Any], *, data_version: str, lineage: dict[str, str], config_yaml: str
    ) -> ModelVersion:
        """Claims the next free version number, then copies the published model at ``model_uri``
        into ``versions/v<N>/model`` (each file checked against its manifest as it is read).

        Registering the same published generation again (a retried task) returns the version it
        already is, instead of adding another."""
        source = storage.open_published(model_uri)
        existing = self._registered(source)
        if existing is not None:
            log.info("%s (generation %s) is already %s of %s", source.root, source.manifest.generation, existing.name, self.uri)
            return existing
        number = self._next_number()
        for _ in range(CLAIM_ATTEMPTS):
            record = ModelVersion(
                version=number,
                model_uri=str(self._version_root(number).join(MODEL_FOLDER)),
                metrics=dict(metrics),
                created=now(),
                source_model_uri=str(source.root),
                data_version=data_version,
                lineage=dict(lineage),
                config_yaml=config_yaml,
            )
            if storage.create_exclusive(self._version_root(number).join(VERSION_FILE), _record_bytes(record)):
                break
            number += 1  # another writer claimed it first
        else:
            raise GnnflowError(f"model registry {self.uri}: no free version number after {CLAIM_ATTEMPTS} tries")
        try:
            self._copy_model(source, storage.parse_uri(record.model_uri))
        except BaseException:
            # No half-registered version: the claim goes too (its number may be taken again).
            storage.delete_prefix(self._version_root(number))
            raise
        log.info("registered %s as %s in %s", source.root, record.name, self.uri)
        return record

    def versions(self) -> list[ModelVersion]:
        aliases = self._aliases()
        by_version: dict[int, list[str]] = {}
        for alias, number in sorted(aliases.items()):
            by_version.setdefault(number, []).append(alias)
        found = []
        for number in self._complete_numbers():
            record = self._read_record(number)
            found.append(replace(record, aliases=tuple(by_version.get(number, ()))))
        return found

    def resolve(self, selector: str) -> ModelVersion:
        versions = self.versions()
        reference = f"{self.uri}@{selector}"
        if selector == LATEST:
            if not versions:
                raise GnnflowError(f"{reference}: the registry holds no versions yet")
            return versions[-1]
        number = parse_version(selector, self.uri)
        if number is not None:
            for version in versions:
                if version.version == number:
                    return version
            raise GnnflowError(f"{reference}: no such version (the registry holds {describe_versions(versions)})")
        check_alias(selector, self.uri)
        for version in versions:
            if selector in version.aliases:
                return version
        set_aliases = ", ".join(sorted(self._aliases())) or "none"
        raise GnnflowError(f"{reference}: no version has the alias {selector!r} yet (aliases set: {set_aliases})")

    # ---------------------------------------------------------------- aliases

    def set_alias(self, alias: str, version: int, reason: str) -> AliasChange:
        check_alias(alias, self.uri)
        if version not in self._complete_numbers():
            raise GnnflowError(f"{self.uri}@v{version}: no such version (the registry holds {describe_versions(self.versions())})")
        previous: list[int | None] = []

        def move(current: bytes | None) -> bytes:
            aliases = _parse_aliases(current, self._aliases_uri())
            previous[:] = [aliases.get(alias)]  # of the round that wins: the last call
            aliases[alias] = version
            return (json.dumps(aliases, indent=2, sort_keys=True) + "\n").encode()

        storage.update_atomically(self._aliases_uri(), move)
        change = AliasChange(alias=alias, version=version, previous=previous[0], reason=reason, at=now())
        line = (json.dumps(asdict(change), sort_keys=True) + "\n").encode()
        storage.update_atomically(self.root.join(HISTORY_FILE), lambda current: (current or b"") + line)
        log.info(
            "%s: %s -> v%d (was %s): %s", self.uri, alias, version, "unset" if change.previous is None else f"v{change.previous}", reason
        )
        return change

    def history(self) -> list[AliasChange]:
        uri = self.root.join(HISTORY_FILE)
        found = storage.read_with_version(uri)
        if found is None:
            return []
        changes = []
        for number, line in enumerate(found[0].decode().splitlines(), start=1):
            if not line.strip():
                continue
            try:
                changes.append(AliasChange(**json.loads(line)))
            except (ValueError, TypeError) as exc:
                raise GnnflowError(f"{uri} line {number} is not an alias change: {exc}") from exc
        return changes

    # ---------------------------------------------------------------- internals

    def _aliases_uri(self) -> storage.Uri:
        return self.root.join(ALIASES_FILE)

    def _aliases(self) -> dict[str, int]:
        found = storage.read_with_version(self._aliases_uri())
        return _parse_aliases(None if found is None else found[0], self._aliases_uri())

    def _version_root(self, number: int) -> storage.Uri:
        return self.root.join(VERSIONS_FOLDER, f"v{number}")

    def _listing(self) -> tuple[set[int], set[int]]:
        """(numbers claimed, numbers whose model copy is published), from one listing."""
        folder = self.root.join(VERSIONS_FOLDER)
        claimed, published = set(), set()
        for uri in storage.list_files(folder):
            parts = storage.relative_to(uri, folder).split("/")
            match = _VERSION_FOLDER.match(parts[0])
            if match is None:
                continue
            number = int(match.group(1))
            if parts[1:] == [VERSION_FILE]:
                claimed.add(number)
            elif parts[1:] == [MODEL_FOLDER, MANIFEST_NAME]:
                published.add(number)
        return claimed, published

    def _complete_numbers(self) -> list[int]:
        claimed, published = self._listing()
        return sorted(claimed & published)

    def _next_number(self) -> int:
        claimed, _ = self._listing()
        return max(claimed, default=0) + 1

    def _read_record(self, number: int) -> ModelVersion:
        uri = self._version_root(number).join(VERSION_FILE)
        try:
            raw = json.loads(storage.read_bytes(uri))
            raw.pop(_CLAIM_KEY, None)
            return ModelVersion(**raw)
        except (ValueError, TypeError) as exc:
            raise GnnflowError(f"{uri} is not a model version record: {exc}") from exc

    def _registered(self, source: storage.PublishedOutput) -> ModelVersion | None:
        """The version whose model copy was made from this very generation of ``source``, if any."""
        for version in self.versions():
            if version.source_model_uri != str(source.root):
                continue
            copy = storage.open_published(version.model_uri)
            if copy.manifest.metadata.get(_SOURCE_GENERATION) == source.manifest.generation:
                return version
        return None

    def _copy_model(self, source: storage.PublishedOutput, target: storage.Uri) -> None:
        with storage.staged_output(target, source.manifest.step) as staging:
            for path in source.manifest.files:
                with source.open_read(path) as src, staging.open_write(path) as dst:
                    shutil.copyfileobj(src, dst, 8 * 1024 * 1024)
            metadata = {**source.manifest.metadata, "registered_from": str(source.root), _SOURCE_GENERATION: source.manifest.generation}
            staging.publish(counts=source.manifest.counts, metadata=metadata)


def _record_bytes(record: ModelVersion) -> bytes:
    """version.json: the record without its aliases (they live in aliases.json), and a claim token."""
    fields = asdict(record)
    fields.pop("aliases")
    fields[_CLAIM_KEY] = secrets.token_hex(8)
    return (json.dumps(fields, indent=2, sort_keys=True) + "\n").encode()


def _parse_aliases(data: bytes | None, uri: storage.Uri) -> dict[str, int]:
    if data is None:
        return {}
    try:
        raw = json.loads(data)
        if not isinstance(raw, dict) or not all(isinstance(v, int) for v in raw.values()):
            raise ValueError("expected {alias: version number}")
        return {str(k): int(v) for k, v in raw.items()}
    except ValueError as exc:
        raise GnnflowError(f"{uri} is not an alias table: {exc}") from exc
