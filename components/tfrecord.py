"""TFRecord files of `tf.train.Example` protos, written and read without TensorFlow.

Importing TensorFlow costs seconds and hundreds of MB, and a per-row Python loop over
`tf.train.Example` is the slowest part of serialization, so this module builds the proto
wire bytes with numpy and frames them itself. The files are ordinary TFRecords: TF's
`TFRecordDataset` + `parse_example` read them, and the reader here reads TF's files.
`decode_tfrecord_file` reads a whole file at once: runs of equal-length records (as written
here) decode as strided numpy views of the file's bytes; anything else record by record.

Wire layout written for every record (keys sorted by name, as protobuf's deterministic
serialization does)::

    Example    = 0x0a len(Features) Features
    Features   = { 0x0a len(entry) entry }                     one entry per key
    entry      = 0x0a len(key) key 0x12 len(Feature) Feature
    Feature    = 0x1a len(list) Int64List | 0x12 len(list) FloatList
    *List      = 0x0a len(payload) payload                     omitted when empty
    payload    = varints (int64, two's complement) | float32 little-endian

TFRecord framing: uint64 LE length, masked crc32c of those 8 bytes (uint32 LE), data,
masked crc32c of data (uint32 LE).
"""

from __future__ import annotations

import struct
from collections.abc import Iterator, Mapping, Sequence
from typing import BinaryIO

import google_crc32c
import numpy as np

from components.errors import GnnflowError

__all__ = ["TFRecordWriter", "decode_examples", "decode_tfrecord_file", "encode_examples", "frame_record", "iter_records"]

_MASK_DELTA = 0xA282EAD8
_U64 = np.uint64
# u >= _VARINT_STEPS[i] means u needs more than i + 1 varint bytes.
_VARINT_STEPS = np.array([1 << (7 * i) for i in range(1, 10)], dtype=np.uint64)


def _masked_crc(data: bytes) -> int:
    crc = google_crc32c.value(data)
    return ((((crc >> 15) | (crc << 17)) & 0xFFFFFFFF) + _MASK_DELTA) & 0xFFFFFFFF


def _varint(value: int) -> bytes:
    out = bytearray()
    while value >= 0x80:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def frame_record(data: bytes) -> bytes:
    """One record's TFRecord framing around `data` (len(data) + 16 bytes)."""
    header = struct.pack("<Q", len(data))
    return header + struct.pack("<I", _masked_crc(header)) + data + struct.pack("<I", _masked_crc(data))


# ----------------------------------------------------------------------------- encoding


def _as_columns(int64_features: Mapping[str, np.ndarray], float_features: Mapping[str, np.ndarray]
                ) -> tuple[int, dict[bytes, np.ndarray], dict[bytes, np.ndarray]]:
    """Validate inputs; ints become (n, k) uint64 bit patterns, floats (n, 4d) uint8 of float32 LE."""
    ints: dict[bytes, np.ndarray] = {}
    floats: dict[bytes, np.ndarray] = {}
    rows: dict[str, int] = {}
    for is_int, features in ((True, int64_features), (False, float_features)):
        for name, arr in features.items():
            a = np.asarray(arr)
            if a.ndim not in (1, 2) or not np.issubdtype(a.dtype, np.integer if is_int else np.number):
                raise GnnflowError(f"{'int64' if is_int else 'float'} feature {name!r}: need a numeric array of "
                                   f"shape (n,) or (n, k), got {a.dtype} {a.shape}")
            if name in rows:
                raise GnnflowError(f"feature {name!r} is given both as int64 and as float")
            rows[name] = len(a)
            a = a.reshape(len(a), a.shape[1] if a.ndim == 2 else 1)
            if not is_int:
                f32 = np.ascontiguousarray(a, dtype="<f4")
                floats[name.encode()] = f32.view(np.uint8).reshape(len(a), 4 * a.shape[1])
                continue
            if a.dtype == np.uint64 and a.size and int(a.max()) >= 1 << 63:
                raise GnnflowError(f"int64 feature {name!r}: value {int(a.max())} does not fit in int64")
            # Two's complement bits: a negative value is a 10-byte varint, as protobuf writes it.
            ints[name.encode()] = a.astype(np.int64, copy=False).view(np.uint64)
    if len(set(rows.values())) != 1:
        raise GnnflowError(f"features must have one common number of rows (at least one feature): {rows}")
    return next(iter(rows.values())), ints, floats


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


def encode_examples(int64_features: Mapping[str, np.ndarray], float_features: Mapping[str, np.ndarray]) -> bytes:
    """Serialize n `tf.train.Example`s and frame them as TFRecords, concatenated.

    Args:
        int64_features: name -> int array of shape (n,) or (n, k); each record gets an
            int64_list of the row's k values.
        float_features: name -> float array of shape (n, d) (or (n,) for d = 1), stored as
            float32; d may be 0 (an empty float_list).

    Returns:
        The bytes of n framed records, ready to append to a .tfrecord file.

    Record order: records are grouped by the byte lengths of their int64 varints (records in
    one group share a byte layout, so a whole group is built as one uint8 matrix). The output
    lists group after group, keeping input order within each group; it is the input order
    whenever every record has the same varint lengths. Each record carries its own values
    (ids included), so readers must not rely on position.
    """
    n, ints, floats = _as_columns(int64_features, float_features)
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

    key_order = sorted([(k, "i") for k in ints] + [(k, "f") for k in floats])
    col_start = dict(zip(int_keys, np.cumsum([0] + [ints[k].shape[1] for k in int_keys]).tolist()))
    # Plan every group first so all of them are built in place in one output buffer. A segment
    # is constant bytes, a ready (m, w) uint8 block, or (float source, rows) gathered at fill time.
    plans: list[tuple[int, int, list]] = []
    for g, row0 in enumerate(first):
        rows = order[bounds[g]:bounds[g + 1]]
        rows = slice(None) if len(rows) == n else rows  # one group: no gathered copies
        segs: list = []
        for key, kind in key_order:
            if kind == "i":
                lens = sig[row0, col_start[key]:col_start[key] + ints[key].shape[1]].tolist()
                segs.append(_entry_header(key, 0x1A, sum(lens)))
                segs.extend(_varint_block(ints[key][rows, j], ln) for j, ln in enumerate(lens))
            else:
                segs += [_entry_header(key, 0x12, floats[key].shape[1]), (floats[key], rows)]
        data_len = sum(map(_width, segs))
        segs.insert(0, b"\x0a" + _varint(data_len))
        data_len += len(segs[0])
        length = struct.pack("<Q", data_len)
        segs.insert(0, length + struct.pack("<I", _masked_crc(length)))
        plans.append((n if isinstance(rows, slice) else len(rows), data_len, segs))

    out = np.empty(sum(m * (data_len + 16) for m, data_len, _ in plans), np.uint8)
    offset = 0
    for m, data_len, segs in plans:
        mat = out[offset:offset + m * (data_len + 16)].reshape(m, data_len + 16)
        offset += mat.size
        col = 0
        for seg in segs:
            width = _width(seg)
            mat[:, col:col + width] = (np.frombuffer(seg, np.uint8) if isinstance(seg, bytes)
                                       else seg if isinstance(seg, np.ndarray) else seg[0][seg[1]])
            col += width
        crc = np.fromiter(map(google_crc32c.value, map(bytes, mat[:, 12:12 + data_len])), np.uint32, m)
        masked = ((crc >> np.uint32(15)) | (crc << np.uint32(17))) + np.uint32(_MASK_DELTA)
        mat[:, -4:] = masked.astype("<u4").view(np.uint8).reshape(m, 4)
    return out.tobytes()


class TFRecordWriter:
    """Appends framed records to a binary stream and counts what it wrote."""

    def __init__(self, stream: BinaryIO) -> None:
        self.stream = stream
        self.records_written = 0
        self.bytes_written = 0

    def write_examples(self, int64_features: Mapping[str, np.ndarray],
                       float_features: Mapping[str, np.ndarray]) -> int:
        """Encode n Examples (shapes and order as in `encode_examples`) and write them; returns n."""
        data = encode_examples(int64_features, float_features)
        n = len(next(iter([*int64_features.values(), *float_features.values()])))
        self.write_framed(data, n)
        return n

    def write_framed(self, data: bytes, n_records: int) -> None:
        """Write bytes that already hold `n_records` framed records."""
        self.stream.write(data)
        self.records_written += n_records
        self.bytes_written += len(data)


# ----------------------------------------------------------------------------- reading


def _frame(raw: bytes, buf: np.ndarray, source: str, verify_crc: bool) -> list[tuple[int, int, int]]:
    """A whole file's records as runs of equal length: [(byte offset, data length, records)]. A run
    is a stretch of byte-identical 12-byte headers (length and its crc), found with numpy a block at
    a time, so its length crc is computed once; data crcs are checked record by record."""
    runs: list[tuple[int, int, int]] = []
    pos, index, size = 0, 0, len(raw)
    while pos < size:
        if size - pos < 12:
            raise GnnflowError(f"{source}: truncated TFRecord header at record {index} (byte offset {pos})")
        (length,) = struct.unpack_from("<Q", raw, pos)
        if verify_crc and struct.unpack_from("<I", raw, pos + 8)[0] != _masked_crc(raw[pos:pos + 8]):
            raise GnnflowError(f"{source}: corrupt length crc at record {index} (byte offset {pos})")
        stride, count, step = length + 16, 1, 64
        most = (size - pos) // stride  # complete records left if all had this length
        if not most:
            raise GnnflowError(f"{source}: truncated TFRecord at record {index} (byte offset {pos}): "
                               f"{length + 4} bytes of data and crc expected, {size - pos - 12} present")
        while count < most and raw[pos + count * stride:pos + count * stride + 12] == raw[pos:pos + 12]:
            end = min(most, count + step)
            block = buf[pos + count * stride:pos + end * stride].reshape(end - count, stride)[:, :12]
            differ = np.flatnonzero((block != buf[pos:pos + 12]).any(axis=1))
            count, step = (count + int(differ[0])) if differ.size else end, step * 2
        stop = pos + count * stride
        if verify_crc:
            data = map(raw.__getitem__, map(slice, range(pos + 12, stop, stride), range(pos + 12 + length, stop, stride)))
            crc = np.fromiter(map(google_crc32c.value, data), np.uint32, count)
            masked = ((crc >> np.uint32(15)) | (crc << np.uint32(17))) + np.uint32(_MASK_DELTA)
            if (bad := np.flatnonzero(masked != buf[pos:stop].reshape(count, stride)[:, -4:].view("<u4")[:, 0])).size:
                raise GnnflowError(f"{source}: corrupt data crc at record {index + int(bad[0])} "
                                   f"(byte offset {pos + int(bad[0]) * stride})")
        runs.append((pos, length, count))
        pos, index = stop, index + count
    return runs


def iter_records(stream: BinaryIO, *, source: str, verify_crc: bool = True) -> Iterator[bytes]:
    """Yield the data of each TFRecord in `stream` (read whole, its framing checked before the
    first record comes out); `source` names it in error messages.

    Raises:
        GnnflowError: on a truncated record or (with verify_crc) a crc mismatch, naming
            the source, record index and byte offset.
    """
    raw = bytes(stream.read() or b"")
    for pos, length, count in _frame(raw, np.frombuffer(raw, np.uint8), source, verify_crc):
        yield from (raw[p:p + length] for p in range(pos + 12, pos + count * (length + 16), length + 16))


class _WireError(Exception):
    pass


def _read_varint(buf: bytes, pos: int, end: int) -> tuple[int, int]:
    result, shift = 0, 0
    while True:
        if pos >= end:
            raise _WireError("truncated varint")
        b = buf[pos]
        result |= (b & 0x7F) << shift
        pos, shift = pos + 1, shift + 7
        if b < 0x80:
            return result & 0xFFFFFFFFFFFFFFFF, pos
        if shift >= 70:
            raise _WireError("varint longer than 10 bytes")


def _fields(buf: bytes, start: int, end: int) -> Iterator[tuple[int, int, int, int]]:
    """Yield (field number, wire type, value start, value end | varint value) of one message."""
    pos = start
    while pos < end:
        tag, pos = _read_varint(buf, pos, end)
        field, wire = tag >> 3, tag & 7
        if field == 0 or tag > 0xFFFFFFFF:
            raise _WireError(f"invalid tag {tag}")
        if wire == 0:
            value, pos = _read_varint(buf, pos, end)
            yield field, wire, pos, value
            continue
        if wire == 2:
            size, pos = _read_varint(buf, pos, end)
        elif wire in (1, 5):
            size = 8 if wire == 1 else 4
        else:
            raise _WireError(f"unsupported wire type {wire}")
        if pos + size > end:
            raise _WireError("field runs past its message")
        yield field, wire, pos, pos + size
        pos += size


Items = list[tuple[int, int, int]]  # (wire type, start, end | varint value) of a list's field 1
Wanted = Mapping[bytes, tuple[str, int]]  # key -> ("i" int64 | "f" float, width)


def _parse(buf: bytes, index: int, source: str, wanted: Wanted) -> dict[bytes, tuple[str, Items]]:
    """Locate the wanted keys in one serialized Example: key -> (kind "i"/"f"/"b"/"" unset, items).

    Follows protobuf merge rules: the last map entry of a key wins; within a Feature the last
    oneof kind wins and repeated lists of that kind concatenate.
    """
    found: dict[bytes, tuple[int, int]] = {}
    out: dict[bytes, tuple[str, Items]] = {}
    try:
        for features in (f for f in _fields(buf, 0, len(buf)) if f[:2] == (1, 2)):
            for entry in (f for f in _fields(buf, *features[2:]) if f[:2] == (1, 2)):
                key, value = b"", (0, 0)
                for f3, w3, s3, e3 in _fields(buf, *entry[2:]):
                    if w3 == 2 and f3 in (1, 2):
                        key, value = (buf[s3:e3], value) if f3 == 1 else (key, (s3, e3))
                if key in wanted:
                    found[key] = value
        for key, (s, e) in found.items():
            kind, items = "", []
            for f, w, s2, e2 in _fields(buf, s, e):
                if f in (1, 2, 3) and w == 2:
                    if "bfi"[f - 1] != kind:
                        kind, items = "bfi"[f - 1], []
                    items += [(w3, s3, e3) for f3, w3, s3, e3 in _fields(buf, s2, e2) if f3 == 1]
            out[key] = (kind, items)
    except _WireError as exc:
        raise GnnflowError(f"{source}: record {index} is not a valid tf.train.Example ({exc})") from None
    for key in wanted:
        if key not in out:
            raise GnnflowError(f"{source}: record {index}: missing feature {key.decode()!r}")
    return out


def _values(buf: bytes, want: str, items: Items) -> list[int] | np.ndarray:
    if want == "f":
        if any(w not in (2, 5) or (e - s) % 4 for w, s, e in items):
            raise _WireError("malformed float_list")
        return np.concatenate([np.frombuffer(buf, "<f4", (e - s) // 4, s) for _, s, e in items] + [np.zeros(0, "<f4")])
    values: list[int] = []
    for w, s, e in items:
        if w not in (0, 2):
            raise _WireError("malformed int64_list")
        pos = s if w == 2 else e
        while w == 2 and pos < e:
            v, pos = _read_varint(buf, pos, e)
            values.append(v)
        if w == 0:
            values.append(e)
        elif pos != e:
            raise _WireError("packed int64_list runs past its field")
    return [v - (1 << 64) if v >= 1 << 63 else v for v in values]


def _check(source: str, index: int, key: bytes, want: str, width: int, kind: str, count: int) -> None:
    names = {"i": "int64_list", "f": "float_list", "b": "bytes_list"}
    if kind not in ("", want) and count:
        raise GnnflowError(f"{source}: record {index}: feature {key.decode()!r} is a {names[kind]}, "
                           f"expected {names[want]}")
    if count != width:
        raise GnnflowError(f"{source}: record {index}: feature {key.decode()!r} has {count} values, expected {width}")


def _decode_one(buf: bytes, index: int, source: str, wanted: Wanted, out: dict[bytes, np.ndarray]) -> None:
    """General path: any valid Example, map entries in any order, lists packed or not."""
    found = _parse(buf, index, source, wanted)
    for key, (want, width) in wanted.items():
        kind, items = found[key]
        if kind not in ("", want):
            _check(source, index, key, want, width, kind, len(items))  # raises unless empty
        try:
            values = _values(buf, want, items)
        except _WireError as exc:
            raise GnnflowError(f"{source}: record {index} is not a valid tf.train.Example ({exc})") from None
        _check(source, index, key, want, width, kind, len(values))
        out[key][index] = values


def _template(buf: bytes, index: int, source: str, wanted: Wanted) -> list[tuple[bytes, int, int, list[int]]] | None:
    """Payload position of each key in one record: [(key, start, end, varint byte lengths)];
    None when a key's list is not one packed field (the general path then decodes it)."""
    found = _parse(buf, index, source, wanted)
    layout = []
    for key, (want, width) in wanted.items():
        kind, items = found[key]
        if len(items) > 1 or (items and items[0][0] != 2) or kind not in ("", want):
            return None
        s, e = items[0][1:] if items else (0, 0)
        if want == "f":
            lens, count, bad = [], (e - s) // 4, (e - s) % 4 != 0
        else:
            ends = [p + 1 for p in range(s, e) if buf[p] < 0x80]
            lens = [b - a for a, b in zip([s] + ends, ends)]
            count, bad = len(lens), (ends[-1] if ends else s) != e or max(lens, default=1) > 10
        if bad:
            return None  # malformed: the general path reports it
        _check(source, index, key, want, width, kind, count)
        layout.append((key, s, e, lens))
    return layout


_FAST_MIN = 16  # below this many same-length records, matching a template costs more than parsing


def _decode_block(mat: np.ndarray, index: np.ndarray, wanted: Wanted, source: str, out: dict[bytes, np.ndarray]
                  ) -> np.ndarray:
    """Decode the rows of `mat` ((m, length) uint8, one record per row, maybe a strided view of a
    file) into rows index[i] (increasing) of `out`; returns the positions of the rows left over.
    Records of one length written by the same code mostly share a byte layout: parse one, check
    the others differ only in payload bytes, and slice all their values at once (up to 4 layouts)."""
    rest = np.arange(len(mat))
    for _ in range(4):
        layout = _template(mat[rest[0]].tobytes(), int(index[rest[0]]), source, wanted) if len(rest) >= _FAST_MIN else None
        if layout is None:
            break
        sub = mat if len(rest) == len(mat) else mat[rest]
        # Per byte, what must match the template: all bits (structure), the continuation bit (int
        # payload), nothing (floats); compared bytes are gathered in one compact, cache-sized matrix.
        care = np.full(mat.shape[1], 0xFF, np.uint8)
        for key, s, e, lens in layout:
            care[s:e] = 0x80 if lens else 0
        kept = np.pad(care != 0, 1).astype(np.int8)
        spans = np.flatnonzero(np.diff(kept)).reshape(-1, 2)  # runs [a, b) of compared bytes
        cols = np.concatenate([np.arange(a, b) for a, b in spans])
        compact = np.concatenate([sub[:, a:b] for a, b in spans], axis=1)
        ok = ~((compact ^ sub[0, cols]) & care[cols]).any(axis=1)
        hit, sub, compact = (rest, sub, compact) if ok.all() else (rest[ok], sub[ok], compact[ok])
        rows = index[hit]
        rows = slice(int(rows[0]), int(rows[-1]) + 1) if rows[-1] - rows[0] == len(rows) - 1 else rows
        at = np.cumsum(kept[1:-1]) - 1  # column of compact holding each compared byte
        for key, s, e, lens in layout:
            if wanted[key][0] == "f":
                out[key][rows] = sub[:, s:e].view("<f4")  # the last axis is contiguous: a view, one copy
            elif lens:
                shifts = np.concatenate([np.arange(0, 7 * ln, 7, dtype=np.uint64) for ln in lens])
                bits = (compact[:, at[s]:at[s] + e - s] & 0x7F).astype(np.uint64) << shifts
                out[key][rows] = np.bitwise_or.reduceat(bits, np.cumsum([0] + lens[:-1]), axis=1).view(np.int64)
        rest = rest[~ok]
    return rest


def _decode_into(records: Sequence[bytes], index: np.ndarray, wanted: Wanted, source: str,
                 out: dict[bytes, np.ndarray]) -> None:
    """Decode records[i] into row index[i] (increasing) of `out`, by blocks of one length where possible."""
    lengths = np.fromiter(map(len, records), np.int64, len(records))
    order = np.argsort(lengths, kind="stable")
    for rows in np.split(order, np.flatnonzero(np.diff(lengths[order])) + 1):
        if len(rows) >= _FAST_MIN:
            mat = np.frombuffer(b"".join([records[i] for i in rows]), np.uint8).reshape(len(rows), lengths[rows[0]])
            rows = rows[_decode_block(mat, index[rows], wanted, source, out)]
        for i in rows:
            _decode_one(records[i], int(index[i]), source, wanted, out)


def _outputs(int64_keys: Mapping[str, int], float_keys: Mapping[str, int], n: int) -> tuple[Wanted, dict]:
    wanted = {k.encode(): ("i", w) for k, w in int64_keys.items()} | {k.encode(): ("f", w) for k, w in float_keys.items()}
    return wanted, {k: np.zeros((n, w), np.int64 if t == "i" else np.float32) for k, (t, w) in wanted.items()}


def _result(out: dict[bytes, np.ndarray]) -> dict[str, np.ndarray]:
    return {k.decode(): (v[:, 0] if v.shape[1] == 1 else v) for k, v in out.items()}


def decode_examples(records: Sequence[bytes], int64_keys: Mapping[str, int], float_keys: Mapping[str, int],
                    *, source: str = "records") -> dict[str, np.ndarray]:
    """Parse serialized `tf.train.Example`s into arrays.

    Args:
        records: n serialized Examples (e.g. from `iter_records`).
        int64_keys / float_keys: name -> width; every record must hold exactly `width`
            values of that kind under that name (other keys are ignored).
        source: names the records in error messages.

    Returns:
        name -> int64 array (n,) for width 1 else (n, width) for int64 keys, float32 likewise.

    Raises:
        GnnflowError: naming the record and key on a missing key, wrong width, wrong kind
            or malformed proto.
    """
    wanted, out = _outputs(int64_keys, float_keys, len(records))
    _decode_into(records, np.arange(len(records)), wanted, source, out)
    return _result(out)


def decode_tfrecord_file(data: bytes | bytearray | memoryview, int64_keys: Mapping[str, int],
                         float_keys: Mapping[str, int], *, source: str, verify_crc: bool = True) -> dict[str, np.ndarray]:
    """Parse a whole TFRecord file's bytes into arrays, in file order: what
    `decode_examples(list(iter_records(...)), ...)` returns, without a bytes object per record.
    Runs of equal-length records (what `encode_examples` writes) decode straight from strided
    views of `data` (copied once unless it is `bytes`); anything else takes the general path.
    Raises GnnflowError as `iter_records` (source, record index, byte offset) and `decode_examples` do.
    """
    raw = data if isinstance(data, bytes) else bytes(data)
    buf = np.frombuffer(raw, np.uint8)
    runs = _frame(raw, buf, source, verify_crc)
    wanted, out = _outputs(int64_keys, float_keys, sum(count for _, _, count in runs))
    left, first = [], 0  # left: records for the general path, as (data offsets, data length, record numbers)
    for pos, length, count in runs:
        index = np.arange(first, first + count)
        rest = (_decode_block(buf[pos:pos + count * (length + 16)].reshape(count, length + 16)[:, 12:12 + length],
                              index, wanted, source, out) if count >= _FAST_MIN else index - first)
        if len(rest):
            left.append((pos + 12 + rest * (length + 16), length, index[rest]))
        first += count
    if left:
        records = [raw[p:p + length] for starts, length, _ in left for p in starts.tolist()]
        _decode_into(records, np.concatenate([index for _, _, index in left]), wanted, source, out)
    return _result(out)
