"""What is read is what was written (issue 36 §4): a file with one byte flipped (same size) fails
the step that reads it, naming the file and the checksums, and nothing is published downstream;
a damaged checkpoint is skipped for the previous good one, said in the log, or refused by name;
an unreadable record of failed attempts never turns the retry guard off.

Every damaged input is a copy of a session fixture's output (tests/small_graphs.py), made in
tmp_path before it is damaged."""

from __future__ import annotations

import json
import logging
import re
import shutil
from pathlib import Path

import pytest
import torch

from components import storage
from components.errors import GnnflowError
from components.partition.output import read_partition
from components.partition.step import partition
from components.runtime.launcher import WorkerFailed
from components.serialize.step import serialize
from components.train import attempts, checkpoint
from components.train.step import train
from tests.small_graphs import with_updates

# ------------------------------------------------------------------------------- helpers


def _copy(fixture_output: storage.Uri, name: str, tmp_path: Path) -> Path:
    """A copy of one of the session's published outputs, safe to damage."""
    copy = tmp_path / name
    shutil.copytree(str(fixture_output), copy)
    return copy


def _fixture_outputs(one_sided_validation: tuple) -> dict[str, storage.Uri]:
    """The session fixture's preprocess, serialize and partition outputs (siblings of its partitions)."""
    _, partitions, _ = one_sided_validation
    parent = partitions.parent
    return {"pre": parent.join("pre"), "tfr": parent.join("tfr"), "parts": partitions}


def _flip_one_byte(path: Path, at: float = 0.6) -> None:
    """Inverts one byte well inside the file: same size, other content."""
    data = bytearray(path.read_bytes())
    data[int(len(data) * at)] ^= 0xFF
    path.write_bytes(bytes(data))


def _file_in(output: Path, relative_path: str) -> Path:
    (found,) = output.glob(f"gen-*/{relative_path}")
    return found


def _damage_message(relative_path: str) -> str:
    """What the error says about a flipped file: its URI, and the checksum found vs recorded."""
    found_vs_recorded = r"is damaged: its CRC32C is [0-9a-f]{8}, its manifest \S+manifest\.json records [0-9a-f]{8}"
    return rf"gen-[^/]+/{re.escape(relative_path)} {found_vs_recorded}"


# --------------------------------------------------------------- published outputs, read


def test_a_flipped_byte_in_any_published_file_is_refused_by_name_on_both_backends(root: storage.Uri) -> None:
    data = bytes(range(256)) * 4096  # 1 MiB
    with storage.staged_output(root, "demo") as staging:
        staging.write_bytes("a/data.bin", data)
        published = staging.publish()
    assert published.read_bytes("a/data.bin") == data
    with published.open_read("a/data.bin") as stream:
        assert b"".join(iter(lambda: stream.read(100_000), b"")) == data

    flipped = bytearray(data)
    flipped[123_456] ^= 0x01
    storage.write_bytes(published.uri("a/data.bin"), bytes(flipped))
    recorded = published.manifest.files["a/data.bin"].crc32c
    uri = re.escape(str(published.uri("a/data.bin")))
    expected = rf"{uri} is damaged: its CRC32C is [0-9a-f]{{8}}, .* records {recorded} .*re-run step 'demo'"
    with pytest.raises(storage.DamagedFile, match=expected):
        published.read_bytes("a/data.bin")
    chunks: list[bytes] = []
    with pytest.raises(storage.DamagedFile, match=expected), published.open_read("a/data.bin") as stream:
        while chunk := stream.read(100_000):
            chunks.append(chunk)
    assert sum(map(len, chunks)) < len(data), "the last chunk is withheld: a consumer never finishes on damaged bytes"

    storage.write_bytes(published.uri("a/data.bin"), data[:-1])
    with pytest.raises(storage.DamagedFile, match=rf"data\.bin is damaged: it has {len(data) - 1} bytes, .* records {len(data)} bytes"):
        published.read_bytes("a/data.bin")
    with (
        pytest.raises(storage.DamagedFile, match=r"data\.bin is damaged: it has only \d+ bytes"),
        published.open_read("a/data.bin") as stream,
    ):
        stream.read()


def test_serialize_refuses_a_flipped_preprocessed_part_and_publishes_nothing(one_sided_validation, tmp_path) -> None:
    raw, *_ = one_sided_validation
    config = with_updates(raw)
    pre = _copy(_fixture_outputs(one_sided_validation)["pre"], "pre", tmp_path)
    _flip_one_byte(_file_in(pre, "nodes/paper/part-00000.parquet"))

    with pytest.raises(storage.DamagedFile, match=_damage_message("nodes/paper/part-00000.parquet") + ".*re-run step 'preprocess'"):
        serialize(config, pre, tmp_path / "tfr")
    with pytest.raises(GnnflowError, match="is not a published output"):
        storage.open_published(tmp_path / "tfr")
    assert list((tmp_path / "tfr").rglob("*.tfrecord")) == []

    intact = serialize(config, _fixture_outputs(one_sided_validation)["pre"], tmp_path / "tfr")
    assert intact.manifest.counts["nodes.paper"] == 400


def test_serialize_from_gcs_refuses_a_flipped_part_naming_its_gs_uri(one_sided_validation, gcs_bucket, tmp_path) -> None:
    raw, *_ = one_sided_validation
    pre, tfr = storage.parse_uri(f"gs://{gcs_bucket}/pre"), storage.parse_uri(f"gs://{gcs_bucket}/tfr")
    storage.copy_tree(_fixture_outputs(one_sided_validation)["pre"], pre)
    published = storage.open_published(pre)
    target = published.uri("edges/paper__cites__paper/part-00000.parquet")
    local = tmp_path / "part.parquet"
    storage.download_file(target, local)
    _flip_one_byte(local)
    storage.upload_file(local, target)  # the object now has the flipped byte, and a checksum of its own to match

    with pytest.raises(storage.DamagedFile, match=rf"{re.escape(str(target))} is damaged: its CRC32C is"):
        serialize(with_updates(raw), pre, tfr)
    assert storage.list_files(tfr) == []


@pytest.mark.multiworker
def test_partition_refuses_a_flipped_tfrecord_shard_and_publishes_nothing(one_sided_validation, tmp_path) -> None:
    raw, *_ = one_sided_validation
    config = with_updates(raw)
    tfr = _copy(_fixture_outputs(one_sided_validation)["tfr"], "tfr", tmp_path)
    (shard,) = (p for p in (tmp_path / "tfr").glob("gen-*/edges/*/shard-00000-*.tfrecord"))
    relative = shard.relative_to(next(tfr.glob("gen-*"))).as_posix()
    _flip_one_byte(shard)

    with pytest.raises(WorkerFailed, match=_damage_message(relative) + ".*re-run step 'serialize'"):
        partition(tfr, tmp_path / "parts", config.partition, world_size=1)
    assert not (tmp_path / "parts" / "manifest.json").exists()
    assert list((tmp_path / "parts").rglob("*.safetensors")) == []


@pytest.mark.multiworker
def test_train_refuses_a_flipped_partition_file_and_the_intact_copy_reads(one_sided_validation, tmp_path) -> None:
    raw, partitions, _ = one_sided_validation
    parts = _copy(partitions, "parts", tmp_path)
    features = _file_in(parts, "part-00001/nodes/paper.safetensors")
    _flip_one_byte(features)  # inside the tensor data: safetensors alone would load it without a word

    with pytest.raises(WorkerFailed, match=r"rank 1.*" + _damage_message("part-00001/nodes/paper.safetensors")):
        train(with_updates(raw, training={"epochs": 1}), parts, tmp_path / "model")
    with pytest.raises(GnnflowError, match="is not a published output"):
        storage.open_published(tmp_path / "model", step="train")

    damaged = storage.open_published(parts)
    assert read_partition(damaged, 0).nodes["paper"]["node_id"].numel() > 0  # the other partition is intact
    original = read_partition(storage.open_published(partitions), 1)
    shutil.copyfile(_file_in(Path(str(partitions)), "part-00001/nodes/paper.safetensors"), features)
    restored = read_partition(storage.open_published(parts), 1)
    assert torch.equal(restored.nodes["paper"]["features"], original.nodes["paper"]["features"])


# ------------------------------------------------------------------------- checkpoints


def _state(epoch: int, tag: str = "") -> checkpoint.TrainingState:
    return checkpoint.TrainingState("fp", next_epoch=epoch, model={"w": torch.full((64,), float(epoch))}, embeddings_tag=tag)


def _truncate(uri: storage.Uri) -> None:
    data = storage.read_bytes(uri)
    storage.write_bytes(uri, data[: len(data) // 2])


def test_a_truncated_checkpoint_is_skipped_for_the_previous_one_said_in_the_log(root: storage.Uri, caplog) -> None:
    checkpoint.save(_state(1), root)
    checkpoint.save(_state(2), root)
    record = json.loads(storage.read_text(root.join(checkpoint.RECORD_FILE)))
    assert record["size"] == storage.size(root.join(checkpoint.CHECKPOINT_FILE)) and record["position"] == "the end of epoch 2"
    assert checkpoint.load(root, "fp").next_epoch == 2  # type: ignore[union-attr]

    _truncate(root.join(checkpoint.CHECKPOINT_FILE))
    with caplog.at_level(logging.WARNING, logger="gnnflow.train"):
        state = checkpoint.load(root, "fp")
    assert state is not None and state.next_epoch == 1 and torch.equal(state.model["w"], torch.full((64,), 1.0))
    current, previous = root.join(checkpoint.CHECKPOINT_FILE), root.join(checkpoint.PREVIOUS_FILE)
    assert f"{current} is damaged: it has" in caplog.text
    assert f"resuming from the previous checkpoint, {previous}" in caplog.text
    assert "PytorchStreamReader" not in caplog.text

    caplog.clear()
    assert checkpoint.load(root, "fp", announce=False) is not None and caplog.text == ""  # said once, by rank 0


@pytest.mark.multiworker
def test_train_resumes_from_the_previous_checkpoint_when_the_last_is_truncated(
    one_sided_validation, one_sided_model, tmp_path, capfd
) -> None:
    raw, partitions, _ = one_sided_validation
    assert raw["training"]["epochs"] == 5 and raw["training"]["early_stopping_patience"] is None  # as one_sided_model trained
    model = tmp_path / "model"
    shutil.copytree(one_sided_model, model)
    current = model / checkpoint.CHECKPOINT_FILE
    current.write_bytes(current.read_bytes()[:1000])  # what the issue saw: PytorchStreamReader failed reading zip archive
    capfd.readouterr()

    published = train(with_updates(raw, training={"epochs": 6}), partitions, model)
    log = capfd.readouterr().err
    assert f"{current} is damaged: it has 1000 bytes" in log, log[-3000:]
    assert f"resuming from the previous checkpoint, {model / checkpoint.PREVIOUS_FILE}" in log
    assert "resuming from the checkpoint of epoch 3" in log and "PytorchStreamReader" not in log
    history = [json.loads(line) for line in published.read_bytes("metrics.jsonl").decode().splitlines()]
    assert [line["epoch"] for line in history] == [0, 1, 2, 3, 4, 5]  # epoch 4 trained again, from the end of epoch 3


def test_a_checkpoint_with_no_good_one_before_it_is_refused_by_name(root: storage.Uri) -> None:
    checkpoint.save(_state(1), root)
    current = root.join(checkpoint.CHECKPOINT_FILE)
    data = bytearray(storage.read_bytes(current))
    data[len(data) // 2] ^= 0xFF
    storage.write_bytes(current, bytes(data))  # same size, one byte other
    record, folder = re.escape(str(root.join(checkpoint.RECORD_FILE))), re.escape(str(root.join("_checkpoints")))
    refusal = (
        rf"{re.escape(str(current))} is damaged: its CRC32C is [0-9a-f]{{8}}, its record {record} records .*"
        rf"there is no earlier good checkpoint: restore the file, or delete {folder} to train from the start"
    )
    with pytest.raises(GnnflowError, match=refusal):
        checkpoint.load(root, "fp")


def test_a_truncated_checkpoint_without_a_record_is_refused_by_name_not_by_torch(tmp_path: Path) -> None:
    """A checkpoint written before records (or whose record never got written) is still read safely."""
    output = storage.parse_uri(tmp_path / "model")
    checkpoint.save(_state(3), output)
    storage.delete(output.join(checkpoint.RECORD_FILE))
    assert checkpoint.load(output, "fp").next_epoch == 3  # type: ignore[union-attr]
    _truncate(output.join(checkpoint.CHECKPOINT_FILE))
    with pytest.raises(
        GnnflowError, match=rf"{re.escape(str(output.join(checkpoint.CHECKPOINT_FILE)))} is not a readable checkpoint \(.*\)"
    ):
        checkpoint.load(output, "fp")


def test_the_previous_checkpoint_keeps_its_learnt_embedding_shards(tmp_path: Path) -> None:
    output = storage.parse_uri(tmp_path / "model")
    for tag in ("old", "previous", "current"):
        checkpoint.save_shard(output, tag, 0, {"rows": torch.zeros(2)})
    checkpoint.save(_state(1, tag="previous"), output)
    checkpoint.save(_state(2, tag="current"), output)
    checkpoint.drop_other_shards(output, keep={"current"})
    kept = sorted(
        storage.relative_to(u, output.join(checkpoint.SHARDS_DIR)).split("/")[0]
        for u in storage.list_files(output.join(checkpoint.SHARDS_DIR))
    )
    assert kept == ["current", "previous"]
    shard = checkpoint.shard_uri(output, "previous", 0)
    _truncate(shard)
    with pytest.raises(
        GnnflowError, match=rf"{re.escape(str(shard))} is not a readable checkpoint .*delete .*_checkpoints to train from the start"
    ):
        checkpoint.load_shard(output, "previous", 0)


# ------------------------------------------------------------- the record of failed attempts


@pytest.mark.parametrize("content", ['[{"point": "the start of tr', "{}", "[1, 2]", "\xff\xfe"])
def test_an_unreadable_failure_record_refuses_the_run_by_name(tmp_path: Path, content: str) -> None:
    output = storage.parse_uri(tmp_path / "model")
    storage.write_bytes(output.join(attempts.FAILURES_FILE), content.encode("latin-1"))
    uri = re.escape(str(output.join(attempts.FAILURES_FILE)))
    with pytest.raises(
        GnnflowError, match=rf"{uri}, the record of failed train attempts that stops a retry loop, is unreadable .*delete it to try again"
    ):
        attempts.refuse_a_looping_retry(output)


def test_train_refuses_before_any_worker_when_the_failure_record_is_corrupt(one_sided_validation, tmp_path) -> None:
    raw, partitions, _ = one_sided_validation
    model = tmp_path / "model"
    (model / "_checkpoints").mkdir(parents=True)
    (model / attempts.FAILURES_FILE).write_text('[{"point": "the start of training", "error": "WorkerFailed: ')
    with pytest.raises(GnnflowError, match=r"failures\.json, the record of failed train attempts .* is unreadable"):
        train(with_updates(raw, training={"epochs": 1}), partitions, model)
    assert not (model / "manifest.json").exists()


def test_a_record_that_breaks_during_a_run_is_replaced_by_this_failure_said_in_the_log(tmp_path: Path, caplog) -> None:
    output = storage.parse_uri(tmp_path / "model")
    storage.write_text(output.join(attempts.FAILURES_FILE), "not json")
    with caplog.at_level(logging.ERROR, logger="gnnflow.train"):
        attempts.record_failure(output, "the start of training", RuntimeError("boom"))
    assert f"{output.join(attempts.FAILURES_FILE)} became unreadable during this run" in caplog.text
    assert json.loads(storage.read_text(output.join(attempts.FAILURES_FILE))) == [
        {"point": "the start of training", "error": "RuntimeError: boom"}
    ]
    attempts.record_failure(output, "the start of training", RuntimeError("boom"))
    with pytest.raises(GnnflowError, match="train failed 2 times from the same point"):
        attempts.refuse_a_looping_retry(output)
