"""Typed storage locations: a local path or a ``gs://bucket/key`` object prefix.

Steps receive and pass URIs, never bare strings, so that the place an output lands is a
value with a type rather than a naming convention.
"""

from __future__ import annotations

import os
import posixpath
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import unquote, urlparse

from components.errors import GnnflowError


@dataclass(frozen=True)
class Uri:
    """Base of :class:`LocalUri` and :class:`GcsUri`; build one with :func:`parse_uri`."""

    def join(self, *parts: str) -> Uri:
        raise NotImplementedError

    @property
    def name(self) -> str:
        """The last path component (file or folder name)."""
        raise NotImplementedError


@dataclass(frozen=True)
class LocalUri(Uri):
    """An absolute path on this machine."""

    path: str

    def join(self, *parts: str) -> LocalUri:
        return LocalUri(os.path.join(self.path, *(p.strip("/") for p in parts)))

    @property
    def name(self) -> str:
        return os.path.basename(self.path.rstrip("/"))

    @property
    def parent(self) -> LocalUri:
        return LocalUri(os.path.dirname(self.path.rstrip("/")))

    def __str__(self) -> str:
        return self.path


@dataclass(frozen=True)
class GcsUri(Uri):
    """An object (or object prefix) ``gs://bucket/key`` in Google Cloud Storage."""

    bucket: str
    key: str = ""

    def join(self, *parts: str) -> GcsUri:
        key = posixpath.join(self.key, *(p.strip("/") for p in parts)) if parts else self.key
        return GcsUri(self.bucket, key.lstrip("/"))

    @property
    def name(self) -> str:
        return posixpath.basename(self.key.rstrip("/"))

    @property
    def parent(self) -> GcsUri:
        return GcsUri(self.bucket, posixpath.dirname(self.key.rstrip("/")))

    @property
    def prefix(self) -> str:
        """The key as a folder prefix (ending in ``/``), for listing what lies under it."""
        return self.key.rstrip("/") + "/" if self.key else ""

    def __str__(self) -> str:
        return f"gs://{self.bucket}/{self.key}"


def parse_uri(value: str | os.PathLike[str] | Uri) -> Uri:
    """Turns ``gs://b/k``, ``file:///p``, an absolute or a relative path into a typed URI.

    Relative paths are resolved against the working directory now, so that a URI keeps
    meaning the same place when a child process starts elsewhere.
    """
    if isinstance(value, Uri):
        return value
    text = os.fspath(value)
    if text.startswith("gs://"):
        parsed = urlparse(text)
        if not parsed.netloc:
            raise GnnflowError(f"invalid GCS URI {text!r}: no bucket name")
        return GcsUri(parsed.netloc, parsed.path.lstrip("/"))
    if text.startswith("file://"):
        return LocalUri(str(Path(unquote(urlparse(text).path)).absolute()))
    if "://" in text:
        raise GnnflowError(f"unsupported URI scheme in {text!r}: use a local path, file:// or gs://")
    return LocalUri(str(Path(text).expanduser().absolute()))


def relative_to(uri: Uri, root: Uri) -> str:
    """The part of ``uri`` below ``root``, with ``/`` separators."""
    if isinstance(uri, GcsUri) and isinstance(root, GcsUri) and uri.bucket == root.bucket:
        if uri.key.startswith(root.prefix):
            return uri.key[len(root.prefix) :]
    if isinstance(uri, LocalUri) and isinstance(root, LocalUri):
        rel = os.path.relpath(uri.path, root.path)
        if not rel.startswith(".."):
            return rel.replace(os.sep, "/")
    raise ValueError(f"{uri} is not under {root}")
