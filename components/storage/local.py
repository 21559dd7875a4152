"""Local paths with the same semantics as the GCS backend: whole files appear atomically."""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
from collections.abc import Iterator
from typing import BinaryIO

from components.errors import GnnflowError
from components.storage.uri import LocalUri


def _missing(uri: LocalUri) -> GnnflowError:
    return GnnflowError(f"{uri} does not exist")


def read_bytes(uri: LocalUri) -> bytes:
    try:
        with open(uri.path, "rb") as f:
            return f.read()
    except FileNotFoundError as exc:
        raise _missing(uri) from exc
    except IsADirectoryError as exc:
        raise GnnflowError(f"{uri} is a folder, expected a file") from exc


@contextlib.contextmanager
def open_write(uri: LocalUri) -> Iterator[BinaryIO]:
    """Writes beside the target and renames on success, so readers never see a partial file."""
    os.makedirs(os.path.dirname(uri.path) or ".", exist_ok=True)
    # Not mkstemp: its 0600 mode would survive the rename; 0666 here is narrowed by the umask.
    tmp = os.path.join(os.path.dirname(uri.path), f".{os.path.basename(uri.path)}.{secrets.token_hex(6)}.part")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
    try:
        with os.fdopen(fd, "wb") as f:
            yield f
        os.replace(tmp, uri.path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


def write_bytes(uri: LocalUri, data: bytes) -> None:
    with open_write(uri) as f:
        f.write(data)


def upload_file(local_path: str, uri: LocalUri) -> None:
    with open_write(uri) as dst, open(local_path, "rb") as src:
        shutil.copyfileobj(src, dst, 8 * 1024 * 1024)


def download_file(uri: LocalUri, local_path: str) -> None:
    try:
        shutil.copyfile(uri.path, local_path)
    except FileNotFoundError as exc:
        raise _missing(uri) from exc


def exists(uri: LocalUri) -> bool:
    return os.path.isfile(uri.path)


def size(uri: LocalUri) -> int:
    try:
        return os.path.getsize(uri.path)
    except FileNotFoundError as exc:
        raise _missing(uri) from exc


def version(uri: LocalUri) -> str:
    """Size and modification time: changes whenever the file is rewritten."""
    try:
        st = os.stat(uri.path)
    except FileNotFoundError as exc:
        raise _missing(uri) from exc
    return f"{st.st_size}-{st.st_mtime_ns}"


def versions_below(uri: LocalUri) -> dict[str, str]:
    """:func:`version` of every file below the folder ``uri``."""
    return {str(f): version(f) for f in list_files(uri)}


def list_files(uri: LocalUri) -> list[LocalUri]:
    """Every file under the folder ``uri``, sorted; temporary ``.part`` files are skipped."""
    found: list[LocalUri] = []
    for root, dirs, files in os.walk(uri.path):
        dirs.sort()
        found.extend(LocalUri(os.path.join(root, f)) for f in files if not f.endswith(".part"))
    return sorted(found, key=lambda u: u.path)


def delete(uri: LocalUri) -> None:
    with contextlib.suppress(FileNotFoundError):
        os.unlink(uri.path)


def rename(src: LocalUri, dst: LocalUri) -> None:
    os.makedirs(os.path.dirname(dst.path) or ".", exist_ok=True)
    try:
        os.replace(src.path, dst.path)
    except FileNotFoundError as exc:
        raise _missing(src) from exc


def delete_folder(uri: LocalUri) -> None:
    shutil.rmtree(uri.path, ignore_errors=True)


def open_read(uri: LocalUri) -> BinaryIO:
    try:
        return open(uri.path, "rb")
    except FileNotFoundError as exc:
        raise _missing(uri) from exc
    except IsADirectoryError as exc:
        raise GnnflowError(f"{uri} is a folder, expected a file") from exc
