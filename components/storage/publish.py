"""Atomic publication of a step's output.

A step writes everything into a fresh *generation* folder under its output URI, then writes
``manifest.json`` at the output root, last. The manifest names the generation and lists every
file with its size and CRC32C; readers go through it and refuse an output without one, and every
file read through it is checked against its size and CRC32C (:mod:`.integrity`). So:

- a reader never sees half an output (the manifest is one small object, written whole), nor a
  damaged file (the step fails naming it);
- a failed re-run leaves the previous published output intact (it never touched it);
- a successful re-run replaces the previous output cleanly (old generations are deleted
  only after the new manifest is in place).
"""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import secrets
from collections.abc import Iterator, Mapping
from dataclasses import asdict, dataclass, field
from typing import Any, BinaryIO, cast

import google_crc32c

from components.errors import GnnflowError
from components.storage import files
from components.storage.integrity import Expected, FileEntry, VerifyingReader, read_verified
from components.storage.uri import Uri, parse_uri, relative_to

MANIFEST_NAME = "manifest.json"
FORMAT_VERSION = 1


@dataclass(frozen=True)
class Manifest:
    """What a published output holds; written last, read first."""

    step: str
    generation: str
    created_at: str
    files: dict[str, FileEntry]
    counts: dict[str, int] = field(default_factory=dict)
    metadata: dict[str, Any] = field(default_factory=dict)
    format_version: int = FORMAT_VERSION

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=2, sort_keys=True)

    @staticmethod
    def from_json(text: str, source: str) -> Manifest:
        try:
            raw = json.loads(text)
            raw["files"] = {k: FileEntry(**v) for k, v in raw["files"].items()}
            return Manifest(**raw)
        except (ValueError, KeyError, TypeError) as exc:
            raise GnnflowError(f"{source} is not a valid gnnflow manifest: {exc}") from exc


@dataclass(frozen=True)
class PublishedOutput:
    """A step output that has been published: its root URI and its manifest."""

    root: Uri
    manifest: Manifest

    def uri(self, relative_path: str) -> Uri:
        """Where a file listed in the manifest lives."""
        if relative_path not in self.manifest.files:
            raise GnnflowError(f"{self.root} has no file {relative_path!r} in its manifest")
        return self.root.join(self.manifest.generation, relative_path)

    def expected(self, relative_path: str) -> Expected:
        """What the manifest says ``relative_path`` holds, for checking it as it is read."""
        return Expected(
            self.manifest.files[relative_path],
            f"its manifest {self.root.join(MANIFEST_NAME)}",
            f"re-run step '{self.manifest.step}' to publish {self.root} again",
        )

    def read_bytes(self, relative_path: str) -> bytes:
        """The whole file, checked against its manifest entry (an error naming it when damaged)."""
        return read_verified(self.uri(relative_path), self.expected(relative_path))

    def open_read(self, relative_path: str) -> BinaryIO:
        """A stream of the file, checked against its manifest entry by the time it has been read to
        the end (see :class:`VerifyingReader`); for consumers that read it in order."""
        uri = self.uri(relative_path)
        return cast(BinaryIO, VerifyingReader(files.open_read(uri), uri, self.expected(relative_path)))

    def read_json(self, relative_path: str) -> Any:
        return json.loads(self.read_bytes(relative_path))

    def files_under(self, folder: str) -> list[str]:
        """Relative paths of the listed files below ``folder``, sorted."""
        prefix = folder.rstrip("/") + "/"
        return sorted(p for p in self.manifest.files if p.startswith(prefix))


def open_published(output: Uri | str, *, step: str | None = None) -> PublishedOutput:
    """Reads an output's manifest; an error naming the URI if the output was never published."""
    root = parse_uri(output)
    manifest_uri = root.join(MANIFEST_NAME)
    if not files.exists(manifest_uri):
        raise GnnflowError(
            f"{root} is not a published output: {MANIFEST_NAME} is missing (the step that writes it never ran or did not finish)"
        )
    manifest = Manifest.from_json(files.read_text(manifest_uri), str(manifest_uri))
    if step is not None and manifest.step != step:
        raise GnnflowError(f"{root} holds the output of step {manifest.step!r}, expected {step!r}")
    return PublishedOutput(root, manifest)


class _ChecksummingWriter:
    """Passes writes through while counting bytes and updating a CRC32C."""

    def __init__(self, inner: BinaryIO) -> None:
        self._inner = inner
        self._crc = google_crc32c.Checksum()
        self.size = 0

    def write(self, data: bytes) -> int:
        self._crc.update(data)
        self.size += len(data)
        return self._inner.write(data)

    def entry(self) -> FileEntry:
        return FileEntry(self.size, self._crc.hexdigest().decode())


def new_generation() -> str:
    """A fresh generation folder name: sortable by time, unique across concurrent writers."""
    return f"gen-{dt.datetime.now(dt.UTC):%Y%m%dT%H%M%S}-{secrets.token_hex(3)}"


class OutputStaging:
    """A generation folder being filled; see :func:`staged_output`."""

    def __init__(self, output: Uri, step: str, generation: str | None = None) -> None:
        self.output = output
        self.step = step
        self.generation = generation or new_generation()
        self.root = output.join(self.generation)
        self.entries: dict[str, FileEntry] = {}
        self.published: PublishedOutput | None = None

    def uri(self, relative_path: str) -> Uri:
        return self.root.join(relative_path)

    def write_bytes(self, relative_path: str, data: bytes) -> None:
        files.write_bytes(self.uri(relative_path), data)
        self.entries[relative_path] = FileEntry.of(data)

    def write_json(self, relative_path: str, obj: Any) -> None:
        self.write_bytes(relative_path, json.dumps(obj, indent=2, sort_keys=True).encode())

    @contextlib.contextmanager
    def open_write(self, relative_path: str) -> Iterator[_ChecksummingWriter]:
        with files.open_write(self.uri(relative_path)) as raw:
            writer = _ChecksummingWriter(raw)
            yield writer
        self.entries[relative_path] = writer.entry()

    def add_entries(self, entries: Mapping[str, FileEntry]) -> None:
        """Records files that other processes wrote into this generation."""
        self.entries.update(entries)

    def publish(self, counts: Mapping[str, int] | None = None, metadata: Mapping[str, Any] | None = None) -> PublishedOutput:
        manifest = Manifest(
            step=self.step,
            generation=self.generation,
            created_at=dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
            files=dict(sorted(self.entries.items())),
            counts=dict(counts or {}),
            metadata=dict(metadata or {}),
        )
        files.write_text(self.output.join(MANIFEST_NAME), manifest.to_json())
        self.published = PublishedOutput(self.output, manifest)
        _delete_other_generations(self.output, keep=self.generation)
        return self.published

    def abort(self) -> None:
        files.delete_prefix(self.root)


def _delete_other_generations(output: Uri, keep: str) -> None:
    stale = {relative_to(f, output).split("/", 1)[0] for f in files.list_files(output)}
    for top in sorted(stale):
        if top.startswith("gen-") and top != keep:
            files.delete_prefix(output.join(top))


@contextlib.contextmanager
def staged_output(output: Uri | str, step: str) -> Iterator[OutputStaging]:
    """Stages a new generation of ``output``; call ``publish`` inside the block to commit it.

    If the block raises (or ends without publishing), the staged files are deleted and the
    previously published output, if any, stays as it was.
    """
    staging = OutputStaging(parse_uri(output), step)
    try:
        yield staging
    except BaseException:
        with contextlib.suppress(Exception):
            staging.abort()
        raise
    if staging.published is None:
        staging.abort()
