"""Feature rows written in their stored type (one bytes_list value per record) and lean edge
records: serialize's encoder, our decoder and TensorFlow agree, bit for bit."""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
import torch

from components.errors import GnnflowError
from components.feature_storage.codec import FeatureCodec
from components.feature_storage.quantization import fit_int8
from components.partition.loading import _stored_rows
from components.schema import NO_SPLIT
from components.serialize.records import RecordLayout, encode_batch
from components.tfrecord import decode_examples, decode_tfrecord_file, encode_examples, iter_records

tf = pytest.importorskip("tensorflow")

DIM = 6
NODE_INTS = ["node_id", "label", "split"]


def _codec(storage: str) -> FeatureCodec:
    if storage != "int8":
        return FeatureCodec(storage)
    return FeatureCodec("int8", fit_int8(np.full(DIM, -2.0), np.full(DIM, 3.0)))


def _rows(n: int, seed: int = 0) -> np.ndarray:
    x = np.random.default_rng(seed).normal(0, 2, (n, DIM)).astype(np.float32)
    x[: min(n, 2), 0] = [1e6, -7e4][: min(n, 2)]  # beyond int8's fitted range and float16's largest value
    return x


def _node_batch(x: np.ndarray, first_id: int = 0) -> pa.RecordBatch:
    n = len(x)
    ids = np.arange(first_id, first_id + n, dtype=np.int64) * 37  # varints of 1 and 2 bytes: several record layouts
    features = pa.FixedSizeListArray.from_arrays(pa.array(x.ravel()), DIM)
    return pa.record_batch([pa.array(ids), pa.array(np.arange(n) % 5), pa.array((np.arange(n) % 3).astype(np.int8)), features],
                           names=[*NODE_INTS, "features"])  # fmt: skip


def _expected(codec: FeatureCodec, x: np.ndarray) -> tuple[torch.Tensor, int]:
    return codec.encode(torch.from_numpy(x))


def _bits(t: torch.Tensor) -> np.ndarray:
    return (t.view(torch.int16) if t.dtype == torch.bfloat16 else t).numpy().view(np.uint8)


@pytest.mark.parametrize("storage", ["int8", "float16", "bfloat16"])
@pytest.mark.parametrize("n", [5, 300])  # general path and strided fast path
def test_stored_rows_round_trip_bit_identical(storage: str, n: int) -> None:
    codec, x = _codec(storage), _rows(n)
    data, clipped = encode_batch(_node_batch(x), RecordLayout(NODE_INTS, DIM, codec), 0, "nodes/paper")
    want, want_clipped = _expected(codec, x)
    assert clipped == want_clipped and (clipped > 0) == (storage != "bfloat16")
    width = DIM * codec.value_bytes
    got = decode_tfrecord_file(data, dict.fromkeys(NODE_INTS, 1), {}, bytes_keys={"features": width}, source="s")
    order = np.argsort(got["node_id"])  # records come grouped by varint lengths
    assert got["features"].dtype == np.uint8 and got["features"].shape == (n, width)
    np.testing.assert_array_equal(got["features"][order], _bits(want).reshape(n, width))
    stored = _stored_rows(got["features"][order], n, DIM, codec)  # what partition holds
    assert stored.dtype == codec.dtype and torch.equal(stored.view(torch.uint8), want.view(torch.uint8))
    records = list(iter_records(io.BytesIO(data), source="s"))
    by_record = decode_examples(records, dict.fromkeys(NODE_INTS, 1), {}, bytes_keys={"features": width})
    np.testing.assert_array_equal(by_record["features"], got["features"])


@pytest.mark.parametrize("storage,tf_type", [("int8", tf.int8), ("float16", tf.float16), ("bfloat16", tf.bfloat16)])
def test_tensorflow_reads_stored_rows(tmp_path: Path, storage: str, tf_type) -> None:
    codec, x = _codec(storage), _rows(200)
    path = tmp_path / "shard.tfrecord"
    path.write_bytes(encode_batch(_node_batch(x), RecordLayout(NODE_INTS, DIM, codec), 0, "nodes/paper")[0])
    spec = {"node_id": tf.io.FixedLenFeature([], tf.int64), "features": tf.io.FixedLenFeature([], tf.string)}
    parsed = [tf.io.parse_example(b, spec) for b in tf.data.TFRecordDataset(str(path)).batch(64)]
    ids = np.concatenate([p["node_id"].numpy() for p in parsed])
    rows = tf.concat([tf.io.decode_raw(p["features"], tf_type) for p in parsed], axis=0)
    bits = tf.bitcast(rows, tf.int16) if storage == "bfloat16" else rows
    want = _expected(codec, x)[0]
    want_bits = (want.view(torch.int16) if storage == "bfloat16" else want).numpy()
    np.testing.assert_array_equal(bits.numpy()[np.argsort(ids)], want_bits)


def test_bytes_records_are_protobufs_deterministic_serialization() -> None:
    raw = np.random.default_rng(1).integers(-128, 128, (40, 300)).astype(np.int8)  # 300 bytes: 2-byte length varints
    ids = np.arange(40)
    ours = list(iter_records(io.BytesIO(encode_examples({"id": ids}, {}, {"x": raw})), source="mem"))
    for i, record in enumerate(ours):
        feature = {
            "id": tf.train.Feature(int64_list=tf.train.Int64List(value=[i])),
            "x": tf.train.Feature(bytes_list=tf.train.BytesList(value=[raw[i].tobytes()])),
        }
        assert record == tf.train.Example(features=tf.train.Features(feature=feature)).SerializeToString(deterministic=True)


@pytest.mark.parametrize("first", [3, 40])  # the bad record after a short run (general path) or a long one (fast path)
def test_short_bytes_value_names_file_and_record(first: int) -> None:
    good = encode_examples({"id": np.arange(first)}, {}, {"f": np.ones((first, 5), np.int8)})
    short = encode_examples({"id": np.array([first])}, {}, {"f": np.ones((1, 4), np.int8)})
    data = good + short + good
    with pytest.raises(GnnflowError, match=rf"gs://b/shard-2\.tfrecord: record {first}: feature 'f' holds 4 bytes, expected 5"):
        decode_tfrecord_file(data, {"id": 1}, {}, bytes_keys={"f": 5}, source="gs://b/shard-2.tfrecord")
    with pytest.raises(GnnflowError, match=r"record 0: feature 'f' holds 5 bytes, expected 6"):
        decode_tfrecord_file(good, {"id": 1}, {}, bytes_keys={"f": 6}, source="s")


@pytest.mark.parametrize("n", [3, 40])
def test_bytes_value_of_the_wrong_kind_or_count_is_named(n: int) -> None:
    floats = list(iter_records(io.BytesIO(encode_examples({"id": np.arange(n)}, {"f": np.ones((n, 2))})), source="m"))
    with pytest.raises(GnnflowError, match="shard-5: record 0: feature 'f' is a float_list, expected bytes_list"):
        decode_examples(floats, {}, {}, bytes_keys={"f": 8}, source="shard-5")
    two = tf.train.Example(
        features=tf.train.Features(feature={"f": tf.train.Feature(bytes_list=tf.train.BytesList(value=[b"ab", b"cd"]))})
    ).SerializeToString()
    with pytest.raises(GnnflowError, match="record 0: feature 'f' has 2 bytes values, expected 1"):
        decode_examples([two] * n, {}, {}, bytes_keys={"f": 2}, source="shard-5")
    with pytest.raises(GnnflowError, match="record 0: missing feature 'g'"):
        decode_examples(floats, {"id": 1}, {}, bytes_keys={"g": 2}, source="shard-5")


def _edge_batch(n: int, split: np.ndarray, features: int = 0) -> pa.RecordBatch:
    columns = [pa.array(np.arange(n) * 3), pa.array(np.arange(n) * 5)]
    names = ["src", "dst"]
    if features:
        columns.append(pa.FixedSizeListArray.from_arrays(pa.array(np.ones(n * features, np.float32)), features))
        names.append("features")
    return pa.record_batch([*columns, pa.array(split)], names=[*names, "split"])


def test_edge_records_leave_out_empty_features_and_a_constant_split() -> None:
    n = 1000
    batch = _edge_batch(n, np.full(n, NO_SPLIT, np.int8))
    lean = RecordLayout(["edge_id", "src", "dst"], 0, constants={"split": NO_SPLIT})
    assert lean.record_format == {"int64": {"edge_id": 1, "src": 1, "dst": 1}, "float": {}, "constant": {"split": NO_SPLIT}}
    data, _ = encode_batch(batch, lean, 0, "edges/a__b__c")
    ints = {"edge_id": np.arange(n), "src": np.arange(n) * 3, "dst": np.arange(n) * 5, "split": np.full(n, NO_SPLIT)}
    every_key = encode_examples(ints, {"features": np.zeros((n, 0))})  # what serialize wrote before
    # An empty features list was 16 bytes a record, split = -1 (a 10-byte varint) 25.
    assert len(every_key) - len(data) == 41 * n
    got = decode_tfrecord_file(data, lean.record_format["int64"], {}, source="s")
    assert got["edge_id"].tolist() == list(range(n)) and got["dst"].tolist() == (np.arange(n) * 5).tolist()
    # A split value where the schema says there is none is a bug upstream: refused, named.
    split = np.full(n, NO_SPLIT, np.int8)
    split[7] = 0
    with pytest.raises(GnnflowError, match=r"edges/a__b__c: row 107, column 'split': 0 where the schema implies -1"):
        encode_batch(_edge_batch(n, split), lean, 100, "edges/a__b__c")
