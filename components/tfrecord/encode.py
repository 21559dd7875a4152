"""Encoding `tf.train.Example` wire bytes for whole columns at once, with numpy, and writing them."""

from __future__ import annotations

import struct
from collections.abc import Mapping
from typing import BinaryIO

import google_crc32c
import numpy as np

from components.errors import GnnflowError
from components.tfrecord.framing import _MASK_DELTA, _U64, _VARINT_STEPS, _masked_crc, _varint


def _as_columns(
    int64_features: Mapping[str, np.ndarray], float_features: Mapping[str, np.ndarray], bytes_features: Mapping[str, np.ndarray]
) -> tuple[int, dict[bytes, np.ndarray], dict[bytes, np.ndarray], dict[bytes, np.ndarray]]:
    """Validate inputs; ints become (n, k) uint64 bit patterns, floats (n, 4d) uint8 of float32 LE,
    bytes (n, w) uint8 of each row's values, little-endian."""
    ints: dict[bytes, np.ndarray] = {}
    floats: dict[bytes, np.ndarray] = {}
    raw: dict[bytes, np.ndarray] = {}
    rows: dict[str, int] = {}
    kinds: dict[str, str] = {}
    for kind, features in (("int64", int64_features), ("float", float_features), ("bytes", bytes_features)):
        for name, arr in features.items():
            a = np.asarray(arr)
            if a.ndim not in (1, 2) or not np.issubdtype(a.dtype, np.integer if kind == "int64" else np.number):
                raise GnnflowError(f"{kind} feature {name!r}: need a numeric array of shape (n,) or (n, k), got {a.dtype} {a.shape}")
            if name in kinds:
                raise GnnflowError(f"feature {name!r} is given both as {kinds[name]} and as {kind}")
            rows[name], kinds[name] = len(a), kind
            a = a.reshape(len(a), a.shape[1] if a.ndim == 2 else 1)
            if kind == "float":
                f32 = np.ascontiguousarray(a, dtype="<f4")
                floats[name.encode()] = f32.view(np.uint8).reshape(len(a), 4 * a.shape[1])
                continue
            if kind == "bytes":
                stored = np.ascontiguousarray(a, dtype=a.dtype.newbyteorder("<"))
                raw[name.encode()] = stored.view(np.uint8).reshape(len(a), stored.itemsize * a.shape[1])
                continue
            if a.dtype == np.uint64 and a.size and int(a.max()) >= 1 << 63:
                raise GnnflowError(f"int64 feature {name!r}: value {int(a.max())} does not fit in int64")
            # Two's complement bits: a negative value is a 10-byte varint, as protobuf writes it.
            ints[name.encode()] = a.astype(np.int64, copy=False).view(np.uint64)
    if len(set(rows.values())) != 1:
        raise GnnflowError(f"features must have one common number of rows (at least one feature): {rows}")
    return next(iter(rows.values())), ints, floats, raw


def _entry_header(key: bytes, list_tag: int, payload_len: int) -> bytes:
    """Bytes of one map entry up to (not including) its packed payload."""
    inner = b"\x0a" + _varint(payload_len) if payload_len else b""
    feature = bytes([list_tag]) + _varint(len(inner) + payload_len) + inner
    feature_len = len(feature) + payload_len
    body = b"\x0a" + _varint(len(key)) + key + b"\x12" + _varint(feature_len) + feature
    return b"\x0a" + _varint(len(body) + payload_len) + body


def _varint_block(values: np.ndarray, nbytes: int) -> np.ndarray:
    """(m,) uint64 values that all need `nbytes` varint bytes -> their (m, nbytes) uint8 varints."""
    block = ((values[:, None] >> (np.arange(nbytes, dtype=np.uint64) * _U64(7))) & _U64(0x7F)).astype(np.uint8)
    block[:, :-1] |= 0x80
    return block


def _width(seg: bytes | np.ndarray | tuple[np.ndarray, np.ndarray | slice]) -> int:
    return len(seg) if isinstance(seg, bytes) else seg.shape[1] if isinstance(seg, np.ndarray) else seg[0].shape[1]


def encode_examples(
    int64_features: Mapping[str, np.ndarray],
    float_features: Mapping[str, np.ndarray],
    bytes_features: Mapping[str, np.ndarray] | None = None,
) -> bytes:
    """Serialize n `tf.train.Example`s and frame them as TFRecords, concatenated.

    Args:
        int64_features: name -> int array of shape (n,) or (n, k); each record gets an
            int64_list of the row's k values.
        float_features: name -> float array of shape (n, d) (or (n,) for d = 1), stored as
            float32; d may be 0 (an empty float_list).
        bytes_features: name -> numeric array of shape (n, d) (or (n,)); each record gets a
            bytes_list of one value: the row's d values as little-endian bytes (an int8 row of d
            values is d bytes, a float16 row 2d).

    Returns:
        The bytes of n framed records, ready to append to a .tfrecord file.

    Record order: records are grouped by the byte lengths of their int64 varints (records in
    one group share a byte layout, so a whole group is built as one uint8 matrix). The output
    lists group after group, keeping input order within each group; it is the input order
    whenever every record has the same varint lengths. Each record carries its own values
    (ids included), so readers must not rely on position.
    """
    n, ints, floats, raw = _as_columns(int64_features, float_features, bytes_features or {})
    if n == 0:
        return b""
    int_keys = list(ints)
    # Per-record signature: byte length of every int64 varint, (n, total int columns) in 1..10.
    lengths = [np.searchsorted(_VARINT_STEPS, ints[k], side="right").astype(np.uint8) + 1 for k in int_keys]
    sig = np.concatenate(lengths, axis=1) if lengths else np.ones((n, 0), np.uint8)
    if sig.shape[1] <= 18:
        # Lengths are 1..10, so a base-10 number of (length - 1) digits is an exact int64 key.
        code = (sig.astype(np.int64) - 1) @ (10 ** np.arange(sig.shape[1], dtype=np.int64))
        _, first, inverse = np.unique(code, return_index=True, return_inverse=True)
    else:
        _, first, inverse = np.unique(sig, axis=0, return_index=True, return_inverse=True)
    inverse = inverse.reshape(-1)
    order = np.argsort(inverse, kind="stable")
    bounds = np.concatenate([[0], np.cumsum(np.bincount(inverse))])

    key_order = sorted([(k, "i") for k in ints] + [(k, "f") for k in floats] + [(k, "b") for k in raw])
    col_start = dict(zip(int_keys, np.cumsum([0] + [ints[k].shape[1] for k in int_keys]).tolist()))
    # Plan every group first so all of them are built in place in one output buffer. A segment
    # is constant bytes, a ready (m, w) uint8 block, or (float or bytes source, rows) gathered at fill time.
    plans: list[tuple[int, int, list]] = []
    for g, row0 in enumerate(first):
        group_rows = order[bounds[g] : bounds[g + 1]]
        rows: np.ndarray | slice = slice(None) if len(group_rows) == n else group_rows  # one group: no gathered copies
        segs: list = []
        for key, kind in key_order:
            if kind == "i":
                lens = sig[row0, col_start[key] : col_start[key] + ints[key].shape[1]].tolist()
                segs.append(_entry_header(key, 0x1A, sum(lens)))
                segs.extend(_varint_block(ints[key][rows, j], ln) for j, ln in enumerate(lens))
            else:
                source = floats[key] if kind == "f" else raw[key]
                segs += [_entry_header(key, 0x12 if kind == "f" else 0x0A, source.shape[1]), (source, rows)]
        data_len = sum(map(_width, segs))
        segs.insert(0, b"\x0a" + _varint(data_len))
        data_len += len(segs[0])
        length = struct.pack("<Q", data_len)
        segs.insert(0, length + struct.pack("<I", _masked_crc(length)))
        plans.append((len(group_rows), data_len, segs))

    out = np.empty(sum(m * (data_len + 16) for m, data_len, _ in plans), np.uint8)
    offset = 0
    for m, data_len, segs in plans:
        mat = out[offset : offset + m * (data_len + 16)].reshape(m, data_len + 16)
        offset += mat.size
        col = 0
        for seg in segs:
            width = _width(seg)
            mat[:, col : col + width] = (
                np.frombuffer(seg, np.uint8) if isinstance(seg, bytes) else seg if isinstance(seg, np.ndarray) else seg[0][seg[1]]
            )
            col += width
        crc = np.fromiter(map(google_crc32c.value, map(bytes, mat[:, 12 : 12 + data_len])), np.uint32, m)
        masked = ((crc >> np.uint32(15)) | (crc << np.uint32(17))) + np.uint32(_MASK_DELTA)
        mat[:, -4:] = masked.astype("<u4").view(np.uint8).reshape(m, 4)
    return out.tobytes()


class TFRecordWriter:
    """Appends framed records to a binary stream and counts what it wrote."""

    def __init__(self, stream: BinaryIO) -> None:
        self.stream = stream
        self.records_written = 0
        self.bytes_written = 0

    def write_examples(
        self,
        int64_features: Mapping[str, np.ndarray],
        float_features: Mapping[str, np.ndarray],
        bytes_features: Mapping[str, np.ndarray] | None = None,
    ) -> int:
        """Encode n Examples (shapes and order as in `encode_examples`) and write them; returns n."""
        data = encode_examples(int64_features, float_features, bytes_features)
        n = len(next(iter([*int64_features.values(), *float_features.values(), *(bytes_features or {}).values()])))
        self.write_framed(data, n)
        return n

    def write_framed(self, data: bytes, n_records: int) -> None:
        """Write bytes that already hold `n_records` framed records."""
        self.stream.write(data)
        self.records_written += n_records
        self.bytes_written += len(data)
