"""components.tfrecord against TensorFlow itself: TF reads what we write, we read what TF writes."""

from __future__ import annotations

import io
import struct
from pathlib import Path

import numpy as np
import pytest
from google.protobuf.message import DecodeError

from components.errors import GnnflowError
from components.tfrecord import TFRecordWriter, decode_examples, decode_tfrecord_file, encode_examples, frame_record, iter_records
from components.tfrecord import decode as tfrecord_decode

tf = pytest.importorskip("tensorflow")


def _data(n: int, dim: int, seed: int = 0) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    rng = np.random.default_rng(seed)
    ids = rng.permutation(n).astype(np.int64) + 1  # unique, so rows can be matched by id
    ids[: min(n, 4)] = [2**35 + 7, 2**62 + 3, 0, 2**63 - 1][: min(n, 4)]  # varints of 6, 9, 1 and 9 bytes
    labels = rng.integers(-1, 6, n)  # -1 (unlabeled) is a 10-byte varint
    ints = {"id": ids, "label": labels, "split": rng.integers(0, 3, n), "pair": np.stack([ids, -ids], axis=1)}
    floats = {"feat": rng.standard_normal((n, dim)).astype(np.float32), "none": np.zeros((n, 0), np.float32)}
    return ints, floats


def _tf_example(ints: dict[str, np.ndarray], floats: dict[str, np.ndarray], i: int) -> tf.train.Example:
    feature = {k: tf.train.Feature(int64_list=tf.train.Int64List(value=np.atleast_1d(v[i]).tolist())) for k, v in ints.items()}
    feature.update({k: tf.train.Feature(float_list=tf.train.FloatList(value=v[i].tolist())) for k, v in floats.items()})
    return tf.train.Example(features=tf.train.Features(feature=feature))


def _tf_parse(path: Path, ints: dict[str, np.ndarray], floats: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    spec = {k: tf.io.FixedLenFeature(v.shape[1:], tf.int64) for k, v in ints.items()}
    spec.update({k: tf.io.FixedLenFeature(v.shape[1:], tf.float32) for k, v in floats.items()})
    batches = [tf.io.parse_example(b, spec) for b in tf.data.TFRecordDataset(str(path)).batch(4096)]
    return {k: np.concatenate([b[k].numpy() for b in batches]) for k in spec}


def _assert_same_rows(got: dict[str, np.ndarray], ints: dict[str, np.ndarray], floats: dict[str, np.ndarray]) -> None:
    """Records may come back grouped differently: match rows by id, then compare exactly."""
    order, want_order = np.argsort(got["id"]), np.argsort(ints["id"])
    for k, v in {**ints, **floats}.items():
        assert got[k].dtype == v.dtype and got[k].shape == v.shape, k
        np.testing.assert_array_equal(got[k][order], v[want_order], err_msg=k)


@pytest.mark.parametrize("n,dim", [(3000, 3), (40, 3703), (500, 0)])
def test_tensorflow_reads_our_records(tmp_path: Path, n: int, dim: int) -> None:
    ints, floats = _data(n, dim)
    path = tmp_path / "ours.tfrecord"
    path.write_bytes(encode_examples(ints, floats))
    _assert_same_rows(_tf_parse(path, ints, floats), ints, floats)


def test_records_are_protobufs_deterministic_serialization() -> None:
    ints, floats = _data(300, 5)
    ours = list(iter_records(io.BytesIO(encode_examples(ints, floats)), source="mem"))
    examples = [_tf_example(ints, floats, i) for i in range(300)]
    assert sorted(ours) == sorted(e.SerializeToString(deterministic=True) for e in examples)


def test_order_is_kept_within_a_group() -> None:
    ids = np.random.default_rng(2).permutation(300)  # 1- and 2-byte varints: two groups
    records = list(iter_records(io.BytesIO(encode_examples({"id": ids}, {})), source="mem"))
    got = decode_examples(records, {"id": 1}, {})["id"]
    for group in (ids < 128, ids >= 128):
        np.testing.assert_array_equal(got[np.isin(got, ids[group])], ids[group])


def test_we_read_tensorflows_records(tmp_path: Path) -> None:
    ints, floats = _data(2000, 7, seed=1)
    path = tmp_path / "tf.tfrecord"
    with tf.io.TFRecordWriter(str(path)) as writer:
        for i in range(2000):
            example = _tf_example(ints, floats, i)
            example.features.feature["name"].bytes_list.value.append(b"node-%d" % i)  # a key we do not ask for
            writer.write(example.SerializeToString())  # map order as protobuf hashes it
    with path.open("rb") as stream:
        records = list(iter_records(stream, source=str(path)))
    got = decode_examples(records, {"id": 1, "label": 1, "split": 1, "pair": 2}, {"feat": 7, "none": 0})
    for k, v in {**ints, **floats}.items():
        np.testing.assert_array_equal(got[k], v, err_msg=k)


def _varint(v: int) -> bytes:
    v &= 2**64 - 1
    out = b""
    while v >= 0x80:
        out, v = out + bytes([v & 0x7F | 0x80]), v >> 7
    return out + bytes([v])


def _ld(field: int, payload: bytes) -> bytes:
    return _varint(field << 3 | 2) + _varint(len(payload)) + payload


def _entry(key: str, feature: bytes) -> bytes:
    return _ld(1, _ld(1, key.encode()) + _ld(2, feature))


def test_general_parser_agrees_with_protobuf_on_unusual_encodings() -> None:
    """Valid encodings protobuf accepts (TF's fast parser rejects some): unpacked and split lists,
    a repeated key (last wins), a oneof switched kind, unknown fields, two Features messages."""
    records = []
    for i in range(40):
        unpacked_ids = _ld(3, _varint(1 << 3 | 0) + _varint(i) + _varint(1 << 3 | 0) + _varint(-i))
        feat = _ld(2, _ld(1, struct.pack("<f", i / 3))) + _ld(2, _varint(1 << 3 | 5) + struct.pack("<f", -i))
        label = _ld(2, _ld(1, struct.pack("<f", 1.0))) + _ld(3, _ld(1, _varint(i % 3 - 1)))  # float, then int wins
        body = (
            _entry("x", b"")
            + _entry("label", _ld(3, _ld(1, _varint(7))))
            + _entry("feat", feat)
            + _varint(9 << 3 | 0)
            + _varint(5)
            + _entry("label", label)
        )
        records.append(_ld(1, body) + _ld(1, _entry("id", unpacked_ids)) + _varint(15 << 3 | 5) + b"abcd")
    got = decode_examples(records, {"id": 2, "label": 1}, {"feat": 2})
    for i, record in enumerate(records):
        feature = tf.train.Example.FromString(record).features.feature
        assert got["id"][i].tolist() == list(feature["id"].int64_list.value) == [i, -i]
        assert got["label"][i] == feature["label"].int64_list.value[0] == i % 3 - 1
        assert got["feat"][i].tolist() == list(feature["feat"].float_list.value)


def test_fast_path_with_layouts_of_equal_length() -> None:
    """Pairs (200+i, i) and (i, 200+i) make records of identical length and identical
    structural bytes; only the varint continuation bits tell their layouts apart."""
    i = np.arange(50)
    pairs = np.r_[np.stack([200 + i, i], axis=1), np.stack([i, 200 + i], axis=1)]
    records = list(iter_records(io.BytesIO(encode_examples({"pair": pairs}, {})), source="mem"))
    assert len({len(r) for r in records}) == 1
    got = decode_examples(records, {"pair": 2}, {})["pair"]
    assert sorted(map(tuple, got.tolist())) == sorted(map(tuple, pairs.tolist()))


def test_writer_counts_and_empty_input() -> None:
    stream = io.BytesIO()
    writer = TFRecordWriter(stream)
    assert writer.write_examples({"id": np.arange(10)}, {"f": np.ones((10, 2))}) == 10
    writer.write_framed(encode_examples({"id": np.arange(5)}, {"f": np.ones((5, 2))}), 5)
    assert writer.records_written == 15 and writer.bytes_written == len(stream.getvalue())
    assert len(list(iter_records(io.BytesIO(stream.getvalue()), source="mem"))) == 15
    assert encode_examples({"id": np.zeros(0, np.int64)}, {}) == b""
    assert decode_examples([], {"id": 1}, {"f": 3})["f"].shape == (0, 3)


def test_bad_input_to_encoder() -> None:
    with pytest.raises(GnnflowError, match="rows"):
        encode_examples({"id": np.arange(3)}, {"f": np.ones((4, 2))})
    with pytest.raises(GnnflowError, match="'id'"):
        encode_examples({"id": np.ones(3)}, {})
    with pytest.raises(GnnflowError, match="both"):
        encode_examples({"x": np.arange(3)}, {"x": np.ones((3, 1))})


def _read_stream(data: bytes, source: str, verify_crc: bool = True) -> int:
    return len(list(iter_records(io.BytesIO(data), source=source, verify_crc=verify_crc)))


def _read_file(data: bytes, source: str, verify_crc: bool = True) -> int:
    return len(decode_tfrecord_file(data, {"id": 1}, {"f": 4}, source=source, verify_crc=verify_crc)["id"])


@pytest.mark.parametrize("read", [_read_stream, _read_file])
@pytest.mark.parametrize("damage", ["data", "length", "length_crc", "truncate_data", "truncate_header"])
@pytest.mark.parametrize("at", [0, 5, 77, 99])  # where a run of equal headers is cut, and inside its blocks
def test_corrupt_or_truncated_file_names_the_source(damage: str, at: int, read) -> None:
    data = bytearray(encode_examples({"id": np.arange(100)}, {"f": np.ones((100, 4))}))
    size = len(data) // 100
    if damage == "data":  # a float's low mantissa bit: still a valid Example
        data[data.index(np.float32(1).tobytes(), at * size)] ^= 1
    elif damage == "length":
        data[at * size + 1] ^= 1
    elif damage == "length_crc":
        data[at * size + 9] ^= 1
    else:
        data = data[: at * size + (30 if damage == "truncate_data" else 6)]
    with pytest.raises(GnnflowError, match=rf"gs://b/shard-7\.tfrecord: .*record {at} \(byte offset {at * size}\)"):
        read(bytes(data), "gs://b/shard-7.tfrecord")
    if damage == "data":  # without verification, the damaged record comes through
        assert read(bytes(data), "x", verify_crc=False) == 100


@pytest.mark.parametrize("n", [3, 40])  # general path and fast path
def test_decoder_names_missing_key_wrong_width_and_wrong_kind(n: int) -> None:
    records = list(iter_records(io.BytesIO(encode_examples({"id": np.arange(n)}, {"f": np.ones((n, 4))})), source="mem"))
    with pytest.raises(GnnflowError, match="shard-3: record 0: missing feature 'label'"):
        decode_examples(records, {"id": 1, "label": 1}, {}, source="shard-3")
    with pytest.raises(GnnflowError, match="'f' has 4 values, expected 5"):
        decode_examples(records, {}, {"f": 5})
    with pytest.raises(GnnflowError, match="'id' is a int64_list, expected float_list"):
        decode_examples(records, {}, {"id": 1})
    with pytest.raises(GnnflowError, match="record 0 is not a valid tf.train.Example"):
        decode_examples([b"\x0a\x05\x0a"] + records, {"id": 1}, {})


def test_damaged_records_decode_as_protobuf_says_or_raise_gnnflow_error() -> None:
    """Bit flips: whatever protobuf accepts with the right keys we decode equally; the rest is a GnnflowError."""
    rng = np.random.default_rng(3)
    n = 32
    ints = {"id": rng.integers(-(2**40), 2**40, n), "p": rng.integers(-5, 300, (n, 3))}
    records = list(iter_records(io.BytesIO(encode_examples(ints, {"f": rng.standard_normal((n, 2))})), source="m"))
    agreed = 0
    for _ in range(3000):
        damaged = bytearray(records[rng.integers(n)])
        damaged[rng.integers(len(damaged))] ^= 1 << int(rng.integers(8))
        try:
            ours = decode_examples([bytes(damaged)], {"id": 1, "p": 3}, {"f": 2})
        except GnnflowError:
            ours = None
        try:
            feature = tf.train.Example.FromString(bytes(damaged)).features.feature
            kinds = [feature[k].WhichOneof("kind") if k in feature else None for k in ("id", "p", "f")]
            want = (list(feature["id"].int64_list.value), list(feature["p"].int64_list.value), list(feature["f"].float_list.value))
            valid = kinds == ["int64_list", "int64_list", "float_list"] and [len(v) for v in want] == [1, 3, 2]
        except DecodeError:
            valid = False
        assert (ours is not None) == valid, bytes(damaged)
        if valid:
            agreed += 1
            assert ours["id"].tolist() == want[0] and ours["p"][0].tolist() == want[1]
            np.testing.assert_array_equal(ours["f"][0], np.float32(want[2]))
    assert agreed > 100


# ----------------------------------------------------------------------------- decode_tfrecord_file


def _file_of_runs(runs: list[tuple[int, int]], dim: int = 3) -> tuple[bytes, dict[str, np.ndarray]]:
    """A file of consecutive runs: (records, varint bytes of their ids), ids unique; and the values in file order."""
    rng = np.random.default_rng(len(runs))
    chunks, ints, feats, next_id = [], [], [], {}
    for count, nbytes in runs:
        lo = 0 if nbytes == 1 else 1 << (7 * (nbytes - 1))
        start = next_id.setdefault(nbytes, lo)
        ids = np.arange(start, start + count, dtype=np.int64)
        next_id[nbytes] = start + count
        f = rng.standard_normal((count, dim)).astype(np.float32)
        chunks.append(encode_examples({"id": ids}, {"f": f}))
        ints.append(ids)
        feats.append(f)
    return b"".join(chunks), {"id": np.concatenate(ints), "f": np.concatenate(feats).reshape(-1, dim)}


@pytest.mark.parametrize(
    "runs",
    [
        [(1000, 2)],
        [(1, 1), (2, 2), (63, 1), (64, 2), (65, 1), (66, 2), (200, 3), (1000, 2), (15, 1), (16, 2), (17, 1)],
        [(1, 1), (1, 2)] * 40 + [(129, 3), (1, 1), (3000, 2), (1, 3)],
    ],
)
def test_file_decoder_agrees_with_record_decoder_in_file_order(runs: list[tuple[int, int]]) -> None:
    data, want = _file_of_runs(runs)
    got = decode_tfrecord_file(data, {"id": 1}, {"f": 3}, source="mem")
    for k, v in want.items():
        assert got[k].dtype == v.dtype and got[k].shape == v.shape, k
        np.testing.assert_array_equal(got[k], v, err_msg=k)
    records = list(iter_records(io.BytesIO(data), source="mem"))
    for k, v in decode_examples(records, {"id": 1}, {"f": 3}).items():
        np.testing.assert_array_equal(got[k], v, err_msg=k)
    for buffer in (bytearray(data), memoryview(data)):
        np.testing.assert_array_equal(decode_tfrecord_file(buffer, {"id": 1}, {"f": 3}, source="mem")["id"], want["id"])


def test_file_decoder_on_grouped_records_from_the_encoder(tmp_path: Path) -> None:
    """Several encode_examples calls, each grouped by varint lengths (negative labels: 10-byte varints)."""
    ints, floats = _data(5000, 16, seed=4)
    data = b"".join(
        encode_examples({k: v[lo : lo + 700] for k, v in ints.items()}, {k: v[lo : lo + 700] for k, v in floats.items()})
        for lo in range(0, 5000, 700)
    )
    got = decode_tfrecord_file(data, {"id": 1, "label": 1, "split": 1, "pair": 2}, {"feat": 16, "none": 0}, source="mem")
    _assert_same_rows(got, ints, floats)
    path = tmp_path / "ours.tfrecord"
    path.write_bytes(data)
    tf_rows = _tf_parse(path, ints, floats)
    for k in tf_rows:  # TF reads the file in the same order
        np.testing.assert_array_equal(got[k], tf_rows[k], err_msg=k)


@pytest.mark.parametrize("extra_key", [False, True])
def test_file_decoder_reads_tensorflows_files(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, extra_key: bool) -> None:
    """TF's writer, protobuf's map order. Ids of one varint length make equal-length runs, so
    TF's layout takes the block path; a varying bytes key sends records to the general path."""
    ints, floats = _data(3000, 7, seed=5)
    ints["id"] = np.arange(3000) + 2**20  # all 3-byte varints
    ints["label"] = np.abs(ints["label"])
    ints["pair"] = np.stack([ints["id"], ints["id"] * 2], axis=1)
    path = tmp_path / "tf.tfrecord"
    with tf.io.TFRecordWriter(str(path)) as writer:
        for i in range(3000):
            example = _tf_example(ints, floats, i)
            if extra_key:
                example.features.feature["name"].bytes_list.value.append(b"node-%d" % (i * 37 % 1000))
            writer.write(example.SerializeToString())
    general, decode_one = [], tfrecord_decode._decode_one

    def counting(buf: bytes, index: int, *args: object) -> None:
        general.append(index)
        decode_one(buf, index, *args)

    monkeypatch.setattr(tfrecord_decode, "_decode_one", counting)
    got = decode_tfrecord_file(path.read_bytes(), {"id": 1, "label": 1, "split": 1, "pair": 2}, {"feat": 7, "none": 0}, source=str(path))
    for k, v in {**ints, **floats}.items():
        np.testing.assert_array_equal(got[k], v, err_msg=k)
    assert (len(general) > 0) == extra_key


def test_file_decoder_on_unusual_encodings_and_empty_files() -> None:
    records = []
    for i in range(40):  # unpacked ids and a repeated key (last wins): only the general path reads these
        ids = _ld(3, _varint(1 << 3 | 0) + _varint(i) + _varint(1 << 3 | 0) + _varint(-i))
        label = _entry("label", _ld(3, _ld(1, _varint(7)))) + _entry("label", _ld(3, _ld(1, _varint(i % 3))))
        records.append(_ld(1, _entry("id", ids) + label))
    data = b"".join(map(frame_record, records))
    got = decode_tfrecord_file(data, {"id": 2, "label": 1}, {}, source="mem")
    assert got["id"].tolist() == [[i, -i] for i in range(40)] and got["label"].tolist() == [i % 3 for i in range(40)]
    empty = decode_tfrecord_file(b"", {"id": 1, "pair": 2}, {"f": 3}, source="mem")
    assert empty["id"].shape == (0,) and empty["pair"].shape == (0, 2) and empty["f"].shape == (0, 3)
    assert empty["f"].dtype == np.float32 and empty["id"].dtype == np.int64


@pytest.mark.parametrize("first", [3, 40])  # the bad records follow a short run (general path) or a long one
def test_file_decoder_names_the_file_record_of_a_bad_record(first: int) -> None:
    good = encode_examples({"id": np.arange(first)}, {"f": np.ones((first, 4))})
    bad = encode_examples({"id": np.arange(50)}, {"f": np.ones((50, 5))})
    with pytest.raises(GnnflowError, match=rf"shard-3: record {first}: feature 'f' has 5 values, expected 4"):
        decode_tfrecord_file(good + bad, {"id": 1}, {"f": 4}, source="shard-3")
    with pytest.raises(GnnflowError, match=r"shard-3: record \d+: missing feature 'label'"):
        decode_tfrecord_file(good + bad, {"id": 1, "label": 1}, {}, source="shard-3")
    with pytest.raises(GnnflowError, match=rf"record {first} is not a valid tf.train.Example"):
        decode_tfrecord_file(good + frame_record(b"\x0a\x05\x0a") + good, {"id": 1}, {"f": 4}, source="shard-3")


def test_file_decoder_agrees_with_protobuf_on_mixed_files() -> None:
    """Random files of runs from our encoder (several layouts, some of equal length), TF's
    serializer and unusual encodings, in any order: every record decodes as protobuf says."""
    rng = np.random.default_rng(7)
    for _ in range(8):
        chunks = []
        for _ in range(int(rng.integers(1, 12))):
            n, kind = int(rng.integers(1, 200)), rng.integers(4)
            ints = {"id": rng.integers(-(2**40), 2**40, n) * (rng.random(n) < 0.5), "p": rng.integers(-3, 300, (n, 2))}
            floats = {"f": rng.standard_normal((n, 3)).astype(np.float32)}
            if kind == 0:
                chunks.append(encode_examples(ints, floats))
            elif kind == 1:  # equal lengths, different varint boundaries
                i = rng.integers(0, 100, n)
                ints["p"] = np.where((rng.random(n) < 0.5)[:, None], np.stack([200 + i, i], 1), np.stack([i, 200 + i], 1))
                ints["id"] = np.full(n, 5)
                chunks.append(encode_examples(ints, floats))
            else:
                examples = [_tf_example(ints, floats, j) for j in range(n)]
                if kind == 3:  # a key we do not ask for, of varying content
                    for example in examples:
                        example.features.feature["name"].bytes_list.value.append(b"x" * int(rng.integers(3)))
                chunks.append(b"".join(frame_record(e.SerializeToString()) for e in examples))
        data = b"".join(chunks)
        got = decode_tfrecord_file(data, {"id": 1, "p": 2}, {"f": 3}, source="mem")
        records = list(iter_records(io.BytesIO(data), source="mem"))
        assert len(got["id"]) == len(records)
        for j, record in enumerate(records):
            feature = tf.train.Example.FromString(record).features.feature
            assert got["id"][j] == feature["id"].int64_list.value[0]
            assert got["p"][j].tolist() == list(feature["p"].int64_list.value)
            assert got["f"][j].tolist() == list(np.float32(feature["f"].float_list.value))
