"""The GCS test harness itself: the real storage client works against the emulator, and
its retries survive the failures a FlakyProxy injects."""

from __future__ import annotations

import os
import urllib.request
from collections.abc import Callable, Sequence

import pytest
import requests
from google.api_core import exceptions as api_exceptions
from google.cloud import storage
from google.cloud.storage.retry import DEFAULT_RETRY

from tests.flaky_http_proxy import Failure, FlakyProxy
from tests.gcs_emulator import GcsEmulator, anonymous_storage_client, storage_emulator_host

MakeProxy = Callable[[Sequence[Failure]], FlakyProxy]

# The library's retry predicate with short waits: the same decisions, without the
# default one-second first back-off slowing the suite down.
FAST_RETRY = DEFAULT_RETRY.with_delay(initial=0.01, multiplier=2.0, maximum=0.1)
_CHUNK = 256 * 1024  # the smallest chunk size GCS accepts


def test_fixture_points_the_client_at_the_emulator(gcs_emulator: GcsEmulator) -> None:
    assert os.environ["STORAGE_EMULATOR_HOST"] == gcs_emulator.url
    assert gcs_emulator.url.startswith("http://127.0.0.1:")
    assert os.environ["GCE_METADATA_HOST"] == "127.0.0.1:9"


def test_upload_download_and_list(gcs_bucket: str) -> None:
    client = anonymous_storage_client()
    bucket = client.bucket(gcs_bucket)
    bucket.blob("dir/a.txt").upload_from_string(b"alpha")
    bucket.blob("dir/b.bin").upload_from_string(bytes(range(256)) * 10)
    bucket.blob("other/c.txt").upload_from_string("gamma", content_type="text/plain")

    assert bucket.blob("dir/a.txt").download_as_bytes() == b"alpha"
    assert bucket.blob("dir/b.bin").download_as_bytes() == bytes(range(256)) * 10
    assert sorted(b.name for b in client.list_blobs(gcs_bucket, prefix="dir/")) == ["dir/a.txt", "dir/b.bin"]
    assert sorted(b.name for b in client.list_blobs(gcs_bucket)) == ["dir/a.txt", "dir/b.bin", "other/c.txt"]
    assert bucket.get_blob("dir/b.bin").size == 2560
    assert bucket.get_blob("missing") is None


def test_buckets_are_fresh_per_test(gcs_bucket: str) -> None:
    assert list(anonymous_storage_client().list_blobs(gcs_bucket)) == []


def test_resumable_upload(gcs_bucket: str) -> None:
    payload = os.urandom(3 * 256 * 1024 + 17)
    blob = anonymous_storage_client().bucket(gcs_bucket).blob("big.bin")
    _upload_resumable(blob, payload)
    assert blob.download_as_bytes() == payload


def _upload_resumable(blob: storage.Blob, payload: bytes, retry: object = DEFAULT_RETRY) -> None:
    """Upload in 256 KiB chunks of one resumable session (PUTs with Content-Range).

    `upload_from_string` would pick a single multipart request for anything under 8 MiB.
    """
    with blob.open("wb", chunk_size=_CHUNK, retry=retry) as writer:
        writer.write(payload)


def test_many_small_uploads_do_not_stall_the_server(gcs_bucket: str) -> None:
    # The package's own wrapper blocks after a few hundred requests (unread log pipe).
    bucket = anonymous_storage_client().bucket(gcs_bucket)
    for index in range(500):
        bucket.blob(f"many/{index:04d}").upload_from_string(str(index))
    names = [blob.name for blob in anonymous_storage_client().list_blobs(gcs_bucket, prefix="many/")]
    assert len(names) == 500
    assert bucket.blob("many/0499").download_as_bytes() == b"499"


def test_proxy_without_failures_is_transparent(gcs_bucket: str, flaky_gcs: MakeProxy) -> None:
    proxy = flaky_gcs([])
    with storage_emulator_host(proxy.url):
        bucket = anonymous_storage_client().bucket(gcs_bucket)
        bucket.blob("x").upload_from_string(b"through the proxy")
        assert bucket.get_blob("x").download_as_bytes() == b"through the proxy"
    assert proxy.failures_served == 0
    seen = proxy.requests_seen
    assert seen[0] == ("POST", f"/upload/storage/v1/b/{gcs_bucket}/o?uploadType=multipart")
    # The media link in the object's metadata is rewritten, so the download came through too.
    assert any(method == "GET" and "alt=media" in path for method, path in seen)


def test_proxy_carries_resumable_uploads(gcs_bucket: str, flaky_gcs: MakeProxy) -> None:
    payload = os.urandom(2 * _CHUNK + 5)
    proxy = flaky_gcs([])
    with storage_emulator_host(proxy.url):
        _upload_resumable(anonymous_storage_client().bucket(gcs_bucket).blob("resumable.bin"), payload)
    # The session URL the emulator hands out is rewritten, so every chunk came through.
    chunk_puts = [path for method, path in proxy.requests_seen if method == "PUT"]
    assert len(chunk_puts) == 3
    assert all("upload_id=" in path for path in chunk_puts)
    assert anonymous_storage_client().bucket(gcs_bucket).blob("resumable.bin").download_as_bytes() == payload


def test_proxy_forwards_chunked_request_bodies(gcs_bucket: str, flaky_gcs: MakeProxy) -> None:
    proxy = flaky_gcs([])
    # A generator body makes requests send Transfer-Encoding: chunked.
    response = requests.post(
        f"{proxy.url}/upload/storage/v1/b/{gcs_bucket}/o?uploadType=media&name=chunked.txt",
        data=(part for part in [b"first,", b"second"]),
        timeout=10,
    )
    assert response.status_code == 200
    assert anonymous_storage_client().bucket(gcs_bucket).blob("chunked.txt").download_as_bytes() == b"first,second"


def test_upload_and_download_survive_503s(gcs_bucket: str, flaky_gcs: MakeProxy) -> None:
    proxy = flaky_gcs([503, 503])
    with storage_emulator_host(proxy.url):
        blob = anonymous_storage_client().bucket(gcs_bucket).blob("retried")
        blob.upload_from_string(b"payload", retry=FAST_RETRY)
        proxy.add_failures([503, 429])
        assert blob.download_as_bytes(retry=FAST_RETRY) == b"payload"
    assert proxy.failures_served == 4


def test_default_retry_survives_two_503s_on_upload(gcs_bucket: str, flaky_gcs: MakeProxy) -> None:
    proxy = flaky_gcs([503, 503])
    with storage_emulator_host(proxy.url):
        bucket = anonymous_storage_client().bucket(gcs_bucket)
        bucket.blob("retried").upload_from_string(b"payload", retry=DEFAULT_RETRY)
        assert bucket.blob("retried").download_as_bytes() == b"payload"
    assert proxy.failures_served == 2


def test_connection_reset_is_survived_with_retry(gcs_bucket: str, flaky_gcs: MakeProxy) -> None:
    proxy = flaky_gcs(["reset"])
    with storage_emulator_host(proxy.url):
        bucket = anonymous_storage_client().bucket(gcs_bucket)
        bucket.blob("after-reset").upload_from_string(b"payload", retry=FAST_RETRY)
        proxy.add_failures(["reset"])
        assert bucket.blob("after-reset").download_as_bytes(retry=FAST_RETRY) == b"payload"
    assert proxy.failures_served == 2


def test_resumable_chunk_failure_is_retried(gcs_bucket: str, flaky_gcs: MakeProxy) -> None:
    payload = os.urandom(2 * _CHUNK + 5)
    # Let the session start, then fail the first chunk once and the second one twice.
    proxy = flaky_gcs([None, 503, None, "reset", 503])
    with storage_emulator_host(proxy.url):
        _upload_resumable(anonymous_storage_client().bucket(gcs_bucket).blob("chunked.bin"), payload, FAST_RETRY)
    assert proxy.failures_served == 3
    assert anonymous_storage_client().bucket(gcs_bucket).blob("chunked.bin").download_as_bytes() == payload


def test_without_retry_an_upload_failure_surfaces(gcs_bucket: str, flaky_gcs: MakeProxy) -> None:
    # Proves the injected failures are real errors to the client, not something the
    # proxy or the transport quietly absorbs.
    proxy = flaky_gcs([503])
    with storage_emulator_host(proxy.url):
        blob = anonymous_storage_client().bucket(gcs_bucket).blob("not-retried")
        with pytest.raises(api_exceptions.ServiceUnavailable, match="injected by FlakyProxy"):
            blob.upload_from_string(b"payload", retry=None)
    assert proxy.failures_served == 1


def test_reset_reaches_the_client_as_a_connection_error(gcs_bucket: str, flaky_gcs: MakeProxy) -> None:
    proxy = flaky_gcs(["reset"])
    with storage_emulator_host(proxy.url):
        blob = anonymous_storage_client().bucket(gcs_bucket).blob("not-retried")
        with pytest.raises(requests.exceptions.ConnectionError):
            blob.upload_from_string(b"payload", retry=None)
    assert proxy.failures_served == 1


def test_proxy_rejects_unknown_failures(gcs_emulator: GcsEmulator) -> None:
    with pytest.raises(ValueError):
        FlakyProxy(gcs_emulator.url, ["explode"])


def test_emulator_stops_and_frees_its_port() -> None:
    emulator = GcsEmulator()
    with emulator:
        url = emulator.url
        emulator.create_bucket("standalone")
    with pytest.raises(RuntimeError):
        _ = emulator.url
    with pytest.raises(OSError):
        urllib.request.urlopen(f"{url}/storage/v1/b", timeout=2)
