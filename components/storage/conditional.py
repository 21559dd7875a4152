"""Conditional writes: create a file only if it is absent, replace it only if nobody changed it
since it was read. What lets several processes share one small record (a registry's next version
number, its aliases) with no server of their own.

On ``gs://`` these are Cloud Storage preconditions (``ifGenerationMatch``: 0 for "absent", else
the generation that was read; the version token is the generation). Locally, a new file appears
by a hard link of a complete temporary file (which fails if the name is taken), and a replace
holds an exclusive ``flock`` on a lock file beside the target while it compares and renames (the
version token is a hash of the content). The lock works between processes on one machine's file
system, not across machines on a network file system.

A request whose reply is lost is retried, and the retry then finds its own write there: so a
write whose precondition fails reads the file back, and reports success if it holds exactly the
bytes this call wrote (on both backends, so they answer alike). Callers that must tell their own
write from another's therefore write bytes no other writer would (a random token among them).
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import random
import secrets
import time
from collections.abc import Callable, Iterator

from google.api_core import exceptions as api_exceptions

from components.errors import GnnflowError
from components.storage import gcs, local
from components.storage.uri import GcsUri, LocalUri, Uri, parse_uri

UPDATE_ATTEMPTS = 100  # compare-and-swap rounds before :func:`update_atomically` gives up


def create_exclusive(uri: Uri | str, data: bytes) -> bool:
    """Writes ``data`` to ``uri`` only if no file is there. True if this call created it (or the
    file already held exactly ``data``), False if another file was there (left untouched). The
    file appears whole or not at all."""
    uri = parse_uri(uri)
    if isinstance(uri, GcsUri):
        return _gcs_write(uri, data, generation=0)
    assert isinstance(uri, LocalUri)
    return _local_create(uri, data)


def read_with_version(uri: Uri | str) -> tuple[bytes, str] | None:
    """The file's bytes and a token of exactly that content's version; None if there is no file."""
    uri = parse_uri(uri)
    if isinstance(uri, GcsUri):
        return _gcs_read(uri)
    assert isinstance(uri, LocalUri)
    try:
        with open(uri.path, "rb") as f:
            data = f.read()
    except FileNotFoundError:
        return None
    return data, _content_token(data)


def write_if_version(uri: Uri | str, data: bytes, expected: str | None) -> bool:
    """Replaces the file with ``data`` only if its version is still ``expected`` (a token from
    :func:`read_with_version`; None: only if there is still no file). False when it changed
    (unless it already holds exactly ``data``)."""
    uri = parse_uri(uri)
    if isinstance(uri, GcsUri):
        return _gcs_write(uri, data, generation=0 if expected is None else int(expected))
    assert isinstance(uri, LocalUri)
    if expected is None:
        return _local_create(uri, data)
    with _locked(uri):
        current = read_with_version(uri)
        if current is None or current[1] != expected:
            return current is not None and current[0] == data
        local.write_bytes(uri, data)
        return True


def update_atomically(uri: Uri | str, change: Callable[[bytes | None], bytes]) -> bytes:
    """Read-modify-write that loses no concurrent change: ``change`` gets the current bytes (None
    if there is no file) and returns the new ones; it is called again on fresh bytes whenever
    another writer got in first. Returns what was written."""
    uri = parse_uri(uri)
    for attempt in range(UPDATE_ATTEMPTS):
        current = read_with_version(uri)
        data = change(None if current is None else current[0])
        if write_if_version(uri, data, None if current is None else current[1]):
            return data
        time.sleep(random.uniform(0, min(0.2, 0.005 * (attempt + 1))))  # writers collide less once spread out
    raise GnnflowError(f"could not update {uri}: other writers changed it {UPDATE_ATTEMPTS} times in a row")


def _content_token(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def _local_create(uri: LocalUri, data: bytes) -> bool:
    folder = os.path.dirname(uri.path) or "."
    os.makedirs(folder, exist_ok=True)
    spool = os.path.join(folder, f".{os.path.basename(uri.path)}.{secrets.token_hex(6)}.part")
    try:
        with open(spool, "xb") as f:
            f.write(data)
        try:
            os.link(spool, uri.path)  # atomic, and refuses an existing name: the content is complete when it appears
        except FileExistsError:
            current = read_with_version(uri)
            return current is not None and current[0] == data
        return True
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(spool)


@contextlib.contextmanager
def _locked(uri: LocalUri) -> Iterator[None]:
    """Holds an exclusive lock on ``.<name>.lock`` beside ``uri`` (it blocks other processes and
    other threads alike: each open of the lock file is its own lock holder)."""
    folder = os.path.dirname(uri.path) or "."
    os.makedirs(folder, exist_ok=True)
    fd = os.open(os.path.join(folder, f".{os.path.basename(uri.path)}.lock"), os.O_RDWR | os.O_CREAT, 0o666)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # closing releases the lock


def _gcs_write(uri: GcsUri, data: bytes, generation: int) -> bool:
    def call() -> bool:
        blob = gcs._blob(uri)
        try:
            blob.upload_from_string(data, if_generation_match=generation, retry=gcs._retry(uri), timeout=gcs._timeout())
        except api_exceptions.PreconditionFailed:
            return _gcs_holds(uri, data)
        return True

    return gcs._named(uri, call)


def _gcs_holds(uri: GcsUri, data: bytes) -> bool:
    """Whether the object holds exactly ``data`` (an earlier attempt of the same write, whose reply was lost)."""
    current = _gcs_read(uri)
    return current is not None and current[0] == data


def _gcs_read(uri: GcsUri) -> tuple[bytes, str] | None:
    def call() -> tuple[bytes, str] | None:
        bucket = gcs.client().bucket(uri.bucket)
        for _ in range(UPDATE_ATTEMPTS):
            blob = bucket.get_blob(uri.key, retry=gcs._retry(uri), timeout=gcs._timeout())
            if blob is None:
                return None
            try:
                # Pinned to the generation whose metadata was read, so the bytes and the token agree.
                data = blob.download_as_bytes(if_generation_match=blob.generation, retry=gcs._retry(uri), timeout=gcs._timeout())
            except (api_exceptions.PreconditionFailed, api_exceptions.NotFound):
                continue  # replaced or deleted in between: read the new one
            return data, str(blob.generation)
        raise GnnflowError(f"could not read {uri}: other writers replaced it {UPDATE_ATTEMPTS} times while it was read")

    return gcs._named(uri, call)
