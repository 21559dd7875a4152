"""components.storage publication: a step's output appears whole (manifest last) or not at all,
on local paths and gs:// (the real GCS emulator)."""

from __future__ import annotations

import json
import os

import google_crc32c
import pytest

from components.errors import GnnflowError
from components.storage import (
    Uri,
    exists,
    files,
    list_files,
    open_published,
    read_bytes,
    read_text,
    relative_to,
    staged_output,
    write_bytes,
    write_text,
)
from components.storage.publish import MANIFEST_NAME


def _names(uris: list[Uri], under: Uri) -> list[str]:
    return [relative_to(u, under) for u in uris]


def _crc(data: bytes) -> str:
    return f"{google_crc32c.value(data):08x}"


def _record_writes(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Call-through spy on the file API publish.py writes with: the order of written URIs."""
    written: list[str] = []
    original_write_bytes, original_open_write = files.write_bytes, files.open_write

    def write_bytes_spy(uri: Uri | str, data: bytes) -> None:
        original_write_bytes(uri, data)
        written.append(str(uri))

    def open_write_spy(uri: Uri | str):  # noqa: ANN202
        written.append(str(uri))
        return original_open_write(uri)

    monkeypatch.setattr(files, "write_bytes", write_bytes_spy)
    monkeypatch.setattr(files, "open_write", open_write_spy)
    return written


def test_publish_writes_manifest_last(root: Uri, monkeypatch: pytest.MonkeyPatch) -> None:
    output = root.join("preprocessed")
    written = _record_writes(monkeypatch)
    big = os.urandom(100_000)
    with staged_output(output, "preprocess") as staging:
        staging.write_bytes("nodes/part-0.bin", b"node bytes")
        staging.write_json("stats.json", {"mean": 1.5})
        with staging.open_write("edges/part-0.bin") as f:
            f.write(big[:50_000])
            f.write(big[50_000:])
        # Before publication nobody can read it.
        with pytest.raises(GnnflowError, match="manifest.json is missing"):
            open_published(output)
        published = staging.publish(counts={"nodes": 3}, metadata={"schema": "v1"})

    manifest_uri = output.join(MANIFEST_NAME)
    assert written[-1] == str(manifest_uri)
    assert len(written) == 4
    generation = published.manifest.generation
    assert generation.startswith("gen-")
    assert all(w.startswith(str(output.join(generation))) for w in written[:-1])

    raw = json.loads(read_text(manifest_uri))
    stats = json.dumps({"mean": 1.5}, indent=2, sort_keys=True).encode()
    expected = {
        "edges/part-0.bin": {"size": len(big), "crc32c": _crc(big)},
        "nodes/part-0.bin": {"size": 10, "crc32c": _crc(b"node bytes")},
        "stats.json": {"size": len(stats), "crc32c": _crc(stats)},
    }
    assert raw["files"] == expected
    assert raw["step"] == "preprocess"
    assert raw["generation"] == generation
    assert raw["counts"] == {"nodes": 3}
    assert raw["metadata"] == {"schema": "v1"}
    assert raw["format_version"] == 1
    # Every listed file is there, with exactly the listed size and checksum.
    for name, entry in expected.items():
        data = read_bytes(output.join(generation, name))
        assert len(data) == entry["size"]
        assert _crc(data) == entry["crc32c"]
    assert _names(list_files(output), output) == sorted([MANIFEST_NAME] + [f"{generation}/{name}" for name in expected])


def test_open_published_reads_through_the_manifest(root: Uri) -> None:
    output = root.join("serialized")
    with staged_output(output, "serialize") as staging:
        staging.write_bytes("shards/s-0.tfrecord", b"zero")
        staging.write_bytes("shards/s-1.tfrecord", b"one")
        staging.write_json("graph_metadata.json", {"nodes": 2})
        staging.publish(counts={"shards": 2})

    published = open_published(str(output), step="serialize")
    assert published.root == output
    assert published.manifest.counts == {"shards": 2}
    assert published.read_bytes("shards/s-1.tfrecord") == b"one"
    assert published.read_json("graph_metadata.json") == {"nodes": 2}
    assert published.files_under("shards") == ["shards/s-0.tfrecord", "shards/s-1.tfrecord"]
    assert published.uri("shards/s-0.tfrecord") == output.join(published.manifest.generation, "shards/s-0.tfrecord")
    assert published.manifest.files["shards/s-0.tfrecord"].crc32c == _crc(b"zero")
    with pytest.raises(GnnflowError, match="no file 'shards/s-9.tfrecord'"):
        published.uri("shards/s-9.tfrecord")

    with pytest.raises(GnnflowError) as info:
        open_published(output, step="train")
    assert "'serialize'" in str(info.value)
    assert "'train'" in str(info.value)
    assert str(output) in str(info.value)


def test_open_published_without_manifest(root: Uri) -> None:
    output = root.join("half")
    write_bytes(output.join("gen-x/data.bin"), b"orphan")
    for uri in (output, root.join("never-written")):
        with pytest.raises(GnnflowError) as info:
            open_published(uri)
        assert "manifest.json is missing" in str(info.value)
        assert str(uri) in str(info.value)


def test_invalid_manifest_is_named(root: Uri) -> None:
    output = root.join("corrupt")
    write_text(output.join(MANIFEST_NAME), '{"step": "x"')
    with pytest.raises(GnnflowError, match="not a valid gnnflow manifest") as info:
        open_published(output)
    assert str(output.join(MANIFEST_NAME)) in str(info.value)


def test_failure_inside_staging_leaves_nothing(root: Uri) -> None:
    output = root.join("out")
    with pytest.raises(RuntimeError, match="step failed"):
        with staged_output(output, "partition") as staging:
            staging.write_bytes("p0.bin", b"partial")
            with staging.open_write("p1.bin") as f:
                f.write(b"partial too")
            raise RuntimeError("step failed")
    assert list_files(output) == []
    assert not exists(output.join(MANIFEST_NAME))
    # Ending the block without publishing is treated the same way.
    with staged_output(output, "partition") as staging:
        staging.write_bytes("p0.bin", b"forgotten")
    assert list_files(output) == []


def _publish(output: Uri, payloads: dict[str, bytes], step: str = "train") -> str:
    with staged_output(output, step) as staging:
        for name, data in payloads.items():
            staging.write_bytes(name, data)
        return staging.publish().manifest.generation


def test_failed_rerun_keeps_the_previous_output(root: Uri) -> None:
    output = root.join("model")
    first = _publish(output, {"model.safetensors": b"v1 weights", "metrics.json": b"{}"})
    before = _names(list_files(output), output)
    manifest_before = read_text(output.join(MANIFEST_NAME))

    with pytest.raises(RuntimeError, match="crashed"):
        with staged_output(output, "train") as staging:
            staging.write_bytes("model.safetensors", b"v2 half-written")
            assert staging.generation != first
            raise RuntimeError("crashed")

    assert _names(list_files(output), output) == before
    assert read_text(output.join(MANIFEST_NAME)) == manifest_before
    published = open_published(output, step="train")
    assert published.manifest.generation == first
    assert published.read_bytes("model.safetensors") == b"v1 weights"
    assert published.read_bytes("metrics.json") == b"{}"


def test_successful_rerun_replaces_the_output(root: Uri) -> None:
    output = root.join("model")
    first = _publish(output, {"model.safetensors": b"v1 weights", "old-only.txt": b"gone soon"})
    second = _publish(output, {"model.safetensors": b"v2 weights"})
    assert second != first
    published = open_published(output)
    assert published.manifest.generation == second
    assert list(published.manifest.files) == ["model.safetensors"]
    assert published.read_bytes("model.safetensors") == b"v2 weights"
    assert _names(list_files(output), output) == [f"{second}/model.safetensors", MANIFEST_NAME]
    assert not exists(output.join(first, "model.safetensors"))
    assert not exists(output.join(first, "old-only.txt"))
