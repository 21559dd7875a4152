"""``gs://`` through google-cloud-storage, with transient errors retried and permanent ones named.

The client honours ``STORAGE_EMULATOR_HOST`` (anonymous credentials then), which is how tests
and laptop runs talk to a fake-gcs-server on loopback instead of the real service. Transient
errors are retried until the service deadline (:mod:`components.services.deadline`), each
attempt with a bounded connect timeout; then the call fails with one line naming the URI and
the endpoint.
"""

from __future__ import annotations

import base64
import contextlib
import functools
import os
import tempfile
from collections.abc import Callable, Iterator
from typing import BinaryIO, TypeVar

from google.api_core import exceptions as api_exceptions
from google.api_core.retry import Retry
from google.cloud import storage as gcs  # type: ignore[attr-defined, unused-ignore]  # resolved or not, by mypy cache state
from google.cloud.storage.retry import DEFAULT_RETRY

from components.errors import GnnflowError
from components.services import deadline
from components.storage.uri import GcsUri

# Every write here overwrites whole objects with the same bytes on a retry, so retrying all
# of them (not only the calls the library deems idempotent) is safe. What is retried and how
# fast; each call gets it with the service deadline (:func:`_retry`).
RETRY = DEFAULT_RETRY.with_delay(initial=0.5, maximum=8.0, multiplier=2.0).with_timeout(None)
_CHUNK = 8 * 1024 * 1024
_READ_TIMEOUT_S = 60.0  # the library's own per-request timeout
PUBLIC_ENDPOINT = "https://storage.googleapis.com"

T = TypeVar("T")


@functools.lru_cache(maxsize=4)
def _client_for(emulator_host: str | None, project: str | None) -> gcs.Client:
    if emulator_host:
        from google.auth.credentials import AnonymousCredentials

        return gcs.Client(project=project or "local", credentials=AnonymousCredentials())
    return gcs.Client(project=project)


def client() -> gcs.Client:
    """The process's client; a new one when the emulator address changes (tests switch it)."""
    return _client_for(os.environ.get("STORAGE_EMULATOR_HOST"), os.environ.get("GOOGLE_CLOUD_PROJECT"))


def service() -> deadline.Service:
    """Cloud Storage as this process reaches it (the emulator's address, or the public API)."""
    return deadline.Service("Cloud Storage", os.environ.get("STORAGE_EMULATOR_HOST") or PUBLIC_ENDPOINT)


def _retry(uri: GcsUri | None = None) -> Retry:
    return deadline.retry(service(), str(uri) if uri else None, base=RETRY)


def _timeout() -> tuple[float, float]:
    """(connect, read) seconds of one request: a dropped connection cannot outlast the deadline by much."""
    return (deadline.connect_timeout_s(), _READ_TIMEOUT_S)


def _blob(uri: GcsUri) -> gcs.Blob:
    if not uri.key:
        raise GnnflowError(f"{uri} names a bucket, expected an object")
    return client().bucket(uri.bucket).blob(uri.key)


def _named(uri: GcsUri, call: Callable[[], T]) -> T:
    """Runs ``call``, turning permanent GCS failures into one-line errors naming ``uri``."""
    try:
        return call()
    except api_exceptions.NotFound as exc:
        raise GnnflowError(f"{uri} does not exist") from exc
    except api_exceptions.Forbidden as exc:
        raise GnnflowError(f"access denied to {uri}: {exc.message}") from exc
    except api_exceptions.Unauthorized as exc:
        raise GnnflowError(f"not authenticated for {uri}: {exc.message}") from exc
    except api_exceptions.RetryError as exc:  # the service deadline passed while retrying
        raise deadline.unreachable(service(), str(uri), exc) from exc
    except Exception as exc:
        if deadline.is_transient(exc):  # a transient error left over when the deadline passed
            raise deadline.unreachable(service(), str(uri), exc) from exc
        if isinstance(exc, api_exceptions.GoogleAPICallError):
            raise GnnflowError(f"GCS request for {uri} failed: {exc.code} {exc.message}") from exc
        if type(exc).__module__.startswith(("google", "requests", "urllib3")):
            raise GnnflowError(f"GCS request for {uri} failed: {deadline.first_line(exc)}") from exc
        raise


def read_bytes(uri: GcsUri, checksum: str | None = "auto") -> bytes:
    """``checksum=None``: no transport check, for callers that check the bytes themselves (integrity.py)."""
    return _named(uri, lambda: _blob(uri).download_as_bytes(retry=_retry(uri), timeout=_timeout(), checksum=checksum))


def write_bytes(uri: GcsUri, data: bytes) -> None:
    _named(uri, lambda: _blob(uri).upload_from_string(data, retry=_retry(uri), timeout=_timeout()))


def upload_file(local_path: str, uri: GcsUri) -> None:
    _named(uri, lambda: _blob(uri).upload_from_filename(local_path, retry=_retry(uri), timeout=_timeout()))


def download_file(uri: GcsUri, local_path: str) -> None:
    _named(uri, lambda: _blob(uri).download_to_filename(local_path, retry=_retry(uri), timeout=_timeout()))


def exists(uri: GcsUri) -> bool:
    if not uri.key:
        return False  # a bucket root is a folder, never a file
    return _named(uri, lambda: _blob(uri).exists(retry=_retry(uri), timeout=_timeout()))


def bucket_exists(bucket: str) -> bool:
    """Whether ``gs://bucket`` exists (and can be seen); an unanswered request fails naming it and the endpoint."""
    root = GcsUri(bucket, "")
    return _named(root, lambda: client().bucket(bucket).exists(retry=_retry(root), timeout=_timeout()))


def size(uri: GcsUri) -> int:
    def call() -> int:
        blob = client().bucket(uri.bucket).get_blob(uri.key, retry=_retry(uri), timeout=_timeout())
        if blob is None:
            raise GnnflowError(f"{uri} does not exist")
        return int(blob.size)

    return _named(uri, call)


def _metadata(uri: GcsUri) -> gcs.Blob:
    """The object's metadata (one request, no content); an error naming it when it does not exist."""

    def call() -> gcs.Blob:
        blob = client().bucket(uri.bucket).get_blob(uri.key, retry=_retry(uri), timeout=_timeout())
        if blob is None:
            raise GnnflowError(f"{uri} does not exist")
        return blob

    return _named(uri, call)


def version(uri: GcsUri) -> str:
    """Size, generation and CRC32C: a new upload at the same key gets a new generation."""
    blob = _metadata(uri)
    return f"{blob.size}-{blob.generation}-{blob.crc32c}"


def stored_crc32c(uri: GcsUri) -> str:
    """The CRC32C Cloud Storage keeps for the object, in hex as manifests hold it (a metadata read)."""
    return base64.b64decode(_metadata(uri).crc32c).hex()


def versions_below(uri: GcsUri) -> dict[str, str]:
    """:func:`version` of every object below ``uri``, from one listing instead of a request per object."""

    def call() -> dict[str, str]:
        blobs = client().list_blobs(uri.bucket, prefix=uri.prefix, retry=_retry(uri), timeout=_timeout())
        return {str(GcsUri(uri.bucket, b.name)): f"{b.size}-{b.generation}-{b.crc32c}" for b in blobs}

    return _named(uri, call)


def list_files(uri: GcsUri) -> list[GcsUri]:
    """Every object under ``uri`` taken as a folder, sorted by key."""

    def call() -> list[GcsUri]:
        blobs = client().list_blobs(uri.bucket, prefix=uri.prefix, retry=_retry(uri), timeout=_timeout())
        names = sorted(b.name for b in blobs if not b.name.endswith("/"))
        return [GcsUri(uri.bucket, name) for name in names]

    return _named(uri, call)


def delete(uri: GcsUri) -> None:
    def call() -> None:
        try:
            _blob(uri).delete(retry=_retry(uri), timeout=_timeout())
        except api_exceptions.NotFound:
            pass

    _named(uri, call)


def copy(src: GcsUri, dst: GcsUri) -> None:
    """Server-side copy: the bytes never pass through this machine."""

    def call() -> None:
        bucket = client().bucket(src.bucket)
        bucket.copy_blob(bucket.blob(src.key), client().bucket(dst.bucket), dst.key, retry=_retry(src), timeout=_timeout())

    _named(src, call)


def open_read(uri: GcsUri) -> BinaryIO:
    """A seekable stream that downloads in chunks, so a large object never sits in memory."""
    blob = _blob(uri)
    # BlobReader fetches lazily: load the metadata now so a missing object fails here, named.
    _named(uri, lambda: blob.reload(retry=_retry(uri), timeout=_timeout()))
    return blob.open("rb", chunk_size=_CHUNK, retry=_retry(uri), timeout=_timeout())


@contextlib.contextmanager
def open_write(uri: GcsUri) -> Iterator[BinaryIO]:
    """Spools to a local file and uploads on success: the object appears whole or not at all."""
    with tempfile.NamedTemporaryFile(prefix="gnnflow-upload-", suffix=".part") as spool:
        yield spool  # type: ignore[misc]
        spool.flush()
        upload_file(spool.name, uri)
