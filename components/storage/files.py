"""One API over local paths, ``file://`` and ``gs://``: each call picks the backend by URI type."""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from collections.abc import Iterator
from typing import BinaryIO

from components.errors import GnnflowError
from components.storage import gcs, local
from components.storage.uri import GcsUri, LocalUri, Uri, parse_uri, relative_to


def _backend(uri: Uri):  # noqa: ANN202 - a module standing in for a protocol
    if isinstance(uri, GcsUri):
        return gcs
    if isinstance(uri, LocalUri):
        return local
    raise TypeError(f"not a storage URI: {uri!r}")


def read_bytes(uri: Uri | str) -> bytes:
    uri = parse_uri(uri)
    return _backend(uri).read_bytes(uri)


def read_text(uri: Uri | str) -> str:
    return read_bytes(uri).decode("utf-8")


def write_bytes(uri: Uri | str, data: bytes) -> None:
    """Writes one whole file; it appears complete or not at all."""
    uri = parse_uri(uri)
    _backend(uri).write_bytes(uri, data)


def write_text(uri: Uri | str, text: str) -> None:
    write_bytes(uri, text.encode("utf-8"))


def open_read(uri: Uri | str) -> BinaryIO:
    """A binary stream; on GCS it downloads in chunks rather than all at once."""
    uri = parse_uri(uri)
    return _backend(uri).open_read(uri)


@contextlib.contextmanager
def open_write(uri: Uri | str) -> Iterator[BinaryIO]:
    """A binary stream whose file is published only when the block exits without error."""
    uri = parse_uri(uri)
    with _backend(uri).open_write(uri) as f:
        yield f


def exists(uri: Uri | str) -> bool:
    """Whether ``uri`` names an existing file (not a folder)."""
    uri = parse_uri(uri)
    return _backend(uri).exists(uri)


def size(uri: Uri | str) -> int:
    uri = parse_uri(uri)
    return _backend(uri).size(uri)


def version(uri: Uri | str) -> str:
    """A token that changes whenever the file's content may have changed (cheap: no read)."""
    uri = parse_uri(uri)
    return _backend(uri).version(uri)


def versions_below(uri: Uri | str) -> dict[str, str]:
    """:func:`version` of every file below the folder (or prefix) ``uri``, keyed by URI."""
    uri = parse_uri(uri)
    return _backend(uri).versions_below(uri)


def list_files(uri: Uri | str) -> list[Uri]:
    """Every file below the folder (or object prefix) ``uri``, sorted; empty if there is none."""
    uri = parse_uri(uri)
    return _backend(uri).list_files(uri)


def expand_files(uri: Uri | str) -> list[Uri]:
    """``uri`` itself when it is a file, else the files below it; an error naming it if neither."""
    uri = parse_uri(uri)
    if exists(uri):
        return [uri]
    found = [f for f in list_files(uri) if not f.name.startswith(("_", "."))]
    if not found:
        raise GnnflowError(f"input {uri} does not exist (no file, and no files under it as a folder)")
    return found


def delete(uri: Uri | str) -> None:
    uri = parse_uri(uri)
    _backend(uri).delete(uri)


def delete_prefix(uri: Uri | str) -> int:
    """Deletes every file below ``uri``; returns how many there were."""
    uri = parse_uri(uri)
    files = list_files(uri)
    if isinstance(uri, LocalUri):
        local.delete_folder(uri)
    else:
        for f in files:
            gcs.delete(f)  # type: ignore[arg-type]
    return len(files)


def rename(src: Uri | str, dst: Uri | str) -> None:
    """Moves one file to ``dst`` (replacing it) without passing its bytes through this process:
    an atomic rename locally, a server-side copy and delete on GCS (same backend only)."""
    src, dst = parse_uri(src), parse_uri(dst)
    if isinstance(src, LocalUri) and isinstance(dst, LocalUri):
        local.rename(src, dst)
    elif isinstance(src, GcsUri) and isinstance(dst, GcsUri):
        gcs.copy(src, dst)
        gcs.delete(src)
    else:
        raise TypeError(f"cannot rename {src} to {dst}: not on the same backend")


def upload_file(local_path: str | os.PathLike[str], uri: Uri | str) -> None:
    uri = parse_uri(uri)
    _backend(uri).upload_file(os.fspath(local_path), uri)


def download_file(uri: Uri | str, local_path: str | os.PathLike[str]) -> None:
    uri = parse_uri(uri)
    os.makedirs(os.path.dirname(os.fspath(local_path)) or ".", exist_ok=True)
    _backend(uri).download_file(uri, os.fspath(local_path))


def copy_file(src: Uri | str, dst: Uri | str) -> None:
    src, dst = parse_uri(src), parse_uri(dst)
    if isinstance(src, GcsUri) and isinstance(dst, GcsUri):
        gcs.copy(src, dst)
    elif isinstance(src, LocalUri):
        upload_file(src.path, dst)
    elif isinstance(dst, LocalUri):
        download_file(src, dst.path)


def copy_tree(src: Uri | str, dst: Uri | str) -> int:
    """Copies every file below ``src`` to the same relative place below ``dst``, in any
    direction (local↔GCS, GCS→GCS server-side); returns the number of files."""
    src, dst = parse_uri(src), parse_uri(dst)
    files = list_files(src)
    for f in files:
        copy_file(f, dst.join(relative_to(f, src)))
    return len(files)


@contextlib.contextmanager
def local_copy(uri: Uri | str) -> Iterator[str]:
    """A local path holding ``uri``'s bytes: the file itself when local, else a temporary download."""
    uri = parse_uri(uri)
    if isinstance(uri, LocalUri):
        if not os.path.isfile(uri.path):
            raise GnnflowError(f"{uri} does not exist")
        yield uri.path
        return
    folder = tempfile.mkdtemp(prefix="gnnflow-")
    try:
        path = os.path.join(folder, uri.name or "object")
        download_file(uri, path)
        yield path
    finally:
        shutil.rmtree(folder, ignore_errors=True)
