"""components.storage: one file API over local paths and gs:// (against the real GCS emulator),
retry and error naming on GCS failures (publication: test_publish.py)."""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from pathlib import Path

import google_crc32c
import pytest
from google.cloud.storage.retry import DEFAULT_RETRY

from components.errors import GnnflowError
from components.storage import (
    GcsUri,
    LocalUri,
    Uri,
    copy_tree,
    delete,
    delete_prefix,
    exists,
    expand_files,
    gcs,
    list_files,
    local_copy,
    open_read,
    open_write,
    parse_uri,
    read_bytes,
    read_text,
    relative_to,
    size,
    write_bytes,
    write_text,
)
from tests.flaky_http_proxy import Failure, FlakyProxy
from tests.gcs_emulator import storage_emulator_host

MakeProxy = Callable[[Sequence[Failure]], FlakyProxy]


@pytest.fixture(autouse=True)
def fast_retry(monkeypatch: pytest.MonkeyPatch) -> None:
    """The library's retry decisions with short waits and a 5 s deadline."""
    monkeypatch.setattr(gcs, "RETRY", DEFAULT_RETRY.with_delay(initial=0.01, maximum=0.1).with_timeout(5))


@pytest.fixture
def gcs_root(gcs_bucket: str) -> GcsUri:
    uri = parse_uri(f"gs://{gcs_bucket}/root")
    assert isinstance(uri, GcsUri)
    return uri


def _names(uris: list[Uri], under: Uri) -> list[str]:
    return [relative_to(u, under) for u in uris]


def _crc(data: bytes) -> str:
    return f"{google_crc32c.value(data):08x}"


# ------------------------------------------------------------------------------- URIs


def test_parse_gcs_uri() -> None:
    uri = parse_uri("gs://bucket/a/b/c.csv")
    assert uri == GcsUri("bucket", "a/b/c.csv")
    assert str(uri) == "gs://bucket/a/b/c.csv"
    assert uri.name == "c.csv"
    assert uri.parent == GcsUri("bucket", "a/b")
    assert uri.prefix == "a/b/c.csv/"
    assert parse_uri("gs://bucket") == GcsUri("bucket", "")
    assert GcsUri("bucket").prefix == ""
    assert parse_uri(uri) is uri


def test_gcs_join() -> None:
    assert GcsUri("b", "a").join("x", "y.txt") == GcsUri("b", "a/x/y.txt")
    assert GcsUri("b", "a/").join("/x/", "y") == GcsUri("b", "a/x/y")
    assert GcsUri("b").join("x") == GcsUri("b", "x")
    assert GcsUri("b", "a").join() == GcsUri("b", "a")
    assert GcsUri("b", "a/b/").name == "b"


def test_parse_file_uri_and_paths(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert parse_uri("file:///x") == LocalUri("/x")
    assert parse_uri("file:///tmp/a%20b/c") == LocalUri("/tmp/a b/c")
    assert parse_uri("/abs/path") == LocalUri("/abs/path")
    assert parse_uri(Path("/abs/path")) == LocalUri("/abs/path")
    monkeypatch.chdir(tmp_path)
    relative = parse_uri("data/nodes.csv")
    assert relative == LocalUri(str(tmp_path / "data" / "nodes.csv"))
    assert os.path.isabs(str(relative))


def test_local_join_name_parent() -> None:
    uri = LocalUri("/a/b")
    assert uri.join("c", "/d.txt") == LocalUri("/a/b/c/d.txt")
    assert uri.join("c/").name == "c"
    assert LocalUri("/a/b/").name == "b"
    assert uri.parent == LocalUri("/a")
    assert str(uri) == "/a/b"


@pytest.mark.parametrize("text", ["s3://bucket/key", "http://host/x", "hdfs:///x"])
def test_unsupported_scheme(text: str) -> None:
    with pytest.raises(GnnflowError, match="unsupported URI scheme") as info:
        parse_uri(text)
    assert text in str(info.value)


def test_gcs_uri_without_bucket() -> None:
    with pytest.raises(GnnflowError, match="no bucket name"):
        parse_uri("gs:///key")


def test_relative_to() -> None:
    assert relative_to(GcsUri("b", "r/x/y"), GcsUri("b", "r")) == "x/y"
    assert relative_to(GcsUri("b", "x/y"), GcsUri("b")) == "x/y"
    assert relative_to(LocalUri("/r/x/y"), LocalUri("/r")) == "x/y"
    with pytest.raises(ValueError):
        relative_to(GcsUri("b", "other/x"), GcsUri("b", "r"))
    with pytest.raises(ValueError):
        relative_to(GcsUri("b", "r2/x"), GcsUri("b", "r"))
    with pytest.raises(ValueError):
        relative_to(LocalUri("/elsewhere/x"), LocalUri("/r"))
    with pytest.raises(ValueError):
        relative_to(GcsUri("b", "r/x"), LocalUri("/r"))


# ------------------------------------------------------------------ files, both backends


def test_bytes_and_text_round_trip(root: Uri) -> None:
    payload = bytes(range(256)) * 3
    write_bytes(root.join("sub/data.bin"), payload)
    write_text(str(root.join("note.txt")), "héllo\nwörld")  # a string URI works too
    assert read_bytes(root.join("sub/data.bin")) == payload
    assert read_text(root.join("note.txt")) == "héllo\nwörld"
    assert read_bytes(root.join("note.txt")) == "héllo\nwörld".encode()
    write_bytes(root.join("sub/data.bin"), b"replaced")
    assert read_bytes(root.join("sub/data.bin")) == b"replaced"
    write_bytes(root.join("empty"), b"")
    assert read_bytes(root.join("empty")) == b""


def test_exists_and_size(root: Uri) -> None:
    write_bytes(root.join("dir/f.bin"), b"x" * 1234)
    assert exists(root.join("dir/f.bin"))
    assert not exists(root.join("dir/missing.bin"))
    assert not exists(root.join("dir"))  # a folder is not a file
    assert size(root.join("dir/f.bin")) == 1234
    with pytest.raises(GnnflowError) as info:
        size(root.join("dir/missing.bin"))
    assert str(root.join("dir/missing.bin")) in str(info.value)


def test_list_files_sorted_recursive(root: Uri) -> None:
    for name in ["b.txt", "a/z.txt", "a/b/c.txt", "c/d/e.txt", "a.txt"]:
        write_bytes(root.join(name), name.encode())
    # A sibling whose name shares the prefix is not below the folder.
    write_bytes(root.parent.join(root.name + "2", "x.txt"), b"sibling")
    found = list_files(root)
    assert all(type(u) is type(root) for u in found)
    assert _names(found, root) == ["a.txt", "a/b/c.txt", "a/z.txt", "b.txt", "c/d/e.txt"]
    assert _names(list_files(root.join("a")), root.join("a")) == ["b/c.txt", "z.txt"]
    assert list_files(root.join("missing")) == []


def test_expand_files(root: Uri) -> None:
    write_bytes(root.join("single.csv"), b"a,b\n")
    assert expand_files(root.join("single.csv")) == [root.join("single.csv")]
    folder = root.join("table")
    for name in ["part-0002.csv", "part-0000.csv", "part-0001.csv", "_SUCCESS", ".hidden", "nested/part-9.csv"]:
        write_bytes(folder.join(name), b"1\n")
    assert _names(expand_files(folder), folder) == [
        "nested/part-9.csv",
        "part-0000.csv",
        "part-0001.csv",
        "part-0002.csv",
    ]
    missing = root.join("nothing", "here")
    with pytest.raises(GnnflowError, match="does not exist") as info:
        expand_files(missing)
    assert str(missing) in str(info.value)
    # A folder holding only marker files counts as empty.
    write_bytes(root.join("markers/_SUCCESS"), b"")
    with pytest.raises(GnnflowError) as info:
        expand_files(root.join("markers"))
    assert str(root.join("markers")) in str(info.value)


def test_gcs_bucket_root_is_a_folder(gcs_bucket: str) -> None:
    bucket_root = parse_uri(f"gs://{gcs_bucket}")
    write_bytes(bucket_root.join("t/b.csv"), b"2")
    write_bytes(bucket_root.join("a.csv"), b"1")
    assert not exists(bucket_root)
    assert expand_files(f"gs://{gcs_bucket}/") == [bucket_root.join("a.csv"), bucket_root.join("t/b.csv")]
    with pytest.raises(GnnflowError, match="names a bucket") as info:
        read_bytes(bucket_root)
    assert f"gs://{gcs_bucket}/" in str(info.value)


def test_local_files_get_the_umask_mode(tmp_path: Path) -> None:
    mask = os.umask(0o022)
    try:
        write_bytes(tmp_path / "plain.bin", b"x")
        with open_write(tmp_path / "streamed.bin") as f:
            f.write(b"y")
    finally:
        os.umask(mask)
    for name in ["plain.bin", "streamed.bin"]:
        assert (tmp_path / name).stat().st_mode & 0o777 == 0o644


def test_delete_and_delete_prefix(root: Uri) -> None:
    write_bytes(root.join("keep.txt"), b"k")
    write_bytes(root.join("f.txt"), b"f")
    delete(root.join("f.txt"))
    assert not exists(root.join("f.txt"))
    delete(root.join("f.txt"))  # deleting what is gone is not an error
    for name in ["x/1", "x/2", "x/y/3"]:
        write_bytes(root.join(name), b"-")
    assert delete_prefix(root.join("x")) == 3
    assert list_files(root.join("x")) == []
    assert not exists(root.join("x/y/3"))
    assert delete_prefix(root.join("x")) == 0
    assert _names(list_files(root), root) == ["keep.txt"]


def test_only_transient_gcs_errors_are_retried() -> None:
    from google.api_core import exceptions

    from components.storage.gcs import RETRY

    assert not RETRY._predicate(exceptions.NotFound("missing")), "a 404 fails at once"
    assert not RETRY._predicate(exceptions.Forbidden("denied"))
    assert RETRY._predicate(exceptions.ServiceUnavailable("busy")) and RETRY._predicate(exceptions.TooManyRequests("slow"))


def test_read_missing_names_the_full_uri_without_retrying(root: Uri) -> None:
    missing = root.join("deep/er/missing.bin")
    with pytest.raises(GnnflowError) as info:
        read_bytes(missing)
    assert str(missing) in str(info.value)
    assert "does not exist" in str(info.value)
    with pytest.raises(GnnflowError) as info:
        open_read(missing)
    assert str(missing) in str(info.value)


def test_open_read_streams_a_large_object(root: Uri) -> None:
    payload = os.urandom(20 * 1024 * 1024 + 123)
    write_bytes(root.join("big.bin"), payload)
    assert size(root.join("big.bin")) == len(payload)
    pieces = []
    with open_read(root.join("big.bin")) as stream:
        while piece := stream.read(3 * 1024 * 1024):
            pieces.append(piece)
        assert stream.read(10) == b""
        stream.seek(len(payload) - 100)
        assert stream.read() == payload[-100:]
    assert len(pieces) == 7
    assert b"".join(pieces) == payload


def test_open_write_publishes_only_on_success(root: Uri) -> None:
    target = root.join("out/written.bin")
    with open_write(target) as f:
        f.write(b"part one, ")
        f.write(b"part two")
    assert read_bytes(target) == b"part one, part two"

    failed = root.join("out/failed.bin")
    with pytest.raises(RuntimeError, match="boom"):
        with open_write(failed) as f:
            f.write(b"half")
            raise RuntimeError("boom")
    assert not exists(failed)
    # Nothing else (no temporary file) was left beside it, and the earlier file is untouched.
    assert _names(list_files(root.join("out")), root.join("out")) == ["written.bin"]
    if isinstance(root, LocalUri):
        assert sorted(os.listdir(root.join("out").path)) == ["written.bin"]

    # A failed overwrite leaves the previous content.
    with pytest.raises(RuntimeError):
        with open_write(target) as f:
            f.write(b"new")
            raise RuntimeError("boom")
    assert read_bytes(target) == b"part one, part two"


def test_local_copy(root: Uri) -> None:
    write_bytes(root.join("d/file.parquet"), b"PAR1 payload")
    with local_copy(root.join("d/file.parquet")) as path:
        assert os.path.isfile(path)
        assert Path(path).read_bytes() == b"PAR1 payload"
        assert os.path.basename(path) == "file.parquet"
    if isinstance(root, LocalUri):
        assert path == root.join("d/file.parquet").path
        assert os.path.exists(path)  # the original is never removed
    else:
        assert not os.path.exists(path)  # the temporary download is cleaned up
    missing = root.join("d/missing.parquet")
    with pytest.raises(GnnflowError) as info:
        with local_copy(missing):
            pass
    assert str(missing) in str(info.value)


_TREE = {"a.txt": b"alpha", "sub/b.bin": bytes(range(256)), "sub/deeper/c.txt": b"gamma" * 1000}


def _write_tree(under: Uri) -> None:
    for name, data in _TREE.items():
        write_bytes(under.join(name), data)


def _assert_tree(under: Uri) -> None:
    assert _names(list_files(under), under) == sorted(_TREE)
    for name, data in _TREE.items():
        assert read_bytes(under.join(name)) == data


def test_copy_tree_local_to_gcs_and_back(tmp_path: Path, gcs_root: GcsUri) -> None:
    src = parse_uri(tmp_path / "src")
    _write_tree(src)
    assert copy_tree(src, gcs_root.join("copied")) == 3
    _assert_tree(gcs_root.join("copied"))
    back = parse_uri(tmp_path / "back")
    assert copy_tree(gcs_root.join("copied"), back) == 3
    _assert_tree(back)
    assert copy_tree(gcs_root.join("missing"), parse_uri(tmp_path / "none")) == 0
    assert not (tmp_path / "none").exists()


def test_copy_tree_gcs_to_gcs_is_server_side(gcs_root: GcsUri, gcs_bucket: str, flaky_gcs: MakeProxy) -> None:
    _write_tree(gcs_root.join("src"))
    proxy = flaky_gcs([])
    with storage_emulator_host(proxy.url):
        assert copy_tree(gcs_root.join("src"), gcs_root.join("dst")) == 3
    # The bytes never came down (no media GET) nor went up (no upload): only copy calls.
    seen = proxy.requests_seen
    assert not any("alt=media" in path or path.startswith("/upload/") for _, path in seen)
    assert sum(1 for method, path in seen if method == "POST" and ("/copyTo/" in path or "/rewriteTo/" in path)) == 3
    _assert_tree(gcs_root.join("dst"))
    _assert_tree(gcs_root.join("src"))


def test_gcs_open_read_downloads_in_chunks(gcs_root: GcsUri, flaky_gcs: MakeProxy) -> None:
    payload = os.urandom(20 * 1024 * 1024)
    write_bytes(gcs_root.join("big.bin"), payload)
    proxy = flaky_gcs([])
    with storage_emulator_host(proxy.url):
        with open_read(gcs_root.join("big.bin")) as stream:
            assert stream.read(1024 * 1024) == payload[: 1024 * 1024]
            media_gets = [p for m, p in proxy.requests_seen if m == "GET" and "alt=media" in p]
            assert len(media_gets) == 1  # one 8 MiB chunk so far, not the whole object
            assert stream.read() == payload[1024 * 1024 :]


# -------------------------------------------------------------------- GCS failure paths


def test_transient_errors_are_retried(gcs_root: GcsUri, flaky_gcs: MakeProxy) -> None:
    uri = gcs_root.join("retried.bin")
    proxy = flaky_gcs([503, 429, "reset"])
    with storage_emulator_host(proxy.url):
        write_bytes(uri, b"payload survives")
        assert proxy.failures_served == 3
        assert read_bytes(uri) == b"payload survives"
    assert proxy.failures_served == 3
    # Three failed tries, then the upload and the download themselves.
    assert len(proxy.requests_seen) == 5


def test_transient_errors_on_read_are_retried(gcs_root: GcsUri, flaky_gcs: MakeProxy) -> None:
    uri = gcs_root.join("retried.bin")
    write_bytes(uri, b"payload")
    proxy = flaky_gcs([503, "reset", 429])
    with storage_emulator_host(proxy.url):
        assert read_bytes(uri) == b"payload"
        assert exists(uri)
        assert list_files(gcs_root) == [uri]
    assert proxy.failures_served == 3


def test_permanent_403_is_named_and_not_retried(gcs_root: GcsUri, flaky_gcs: MakeProxy) -> None:
    uri = gcs_root.join("secret.bin")
    write_bytes(uri, b"payload")
    proxy = flaky_gcs([403])
    with storage_emulator_host(proxy.url), pytest.raises(GnnflowError) as info:
        read_bytes(uri)
    message = str(info.value)
    assert "access denied" in message
    assert str(uri) in message
    assert proxy.failures_served == 1
    assert len(proxy.requests_seen) == 1


def test_missing_object_is_one_request(gcs_root: GcsUri, flaky_gcs: MakeProxy) -> None:
    missing = gcs_root.join("missing.bin")
    proxy = flaky_gcs([])
    with storage_emulator_host(proxy.url), pytest.raises(GnnflowError, match="does not exist") as info:
        read_bytes(missing)
    assert str(missing) in str(info.value)
    assert len(proxy.requests_seen) == 1


def test_retries_give_up_with_a_named_error(gcs_root: GcsUri, flaky_gcs: MakeProxy, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(gcs, "RETRY", DEFAULT_RETRY.with_delay(initial=0.01, maximum=0.05).with_timeout(0.5))
    uri = gcs_root.join("never.bin")
    proxy = flaky_gcs([503] * 1000)
    with storage_emulator_host(proxy.url), pytest.raises(GnnflowError) as info:
        write_bytes(uri, b"payload")
    assert str(uri) in str(info.value)
    assert proxy.failures_served > 1
    assert not exists(uri)
