"""Decoding `tf.train.Example` records: whole files as strided numpy views where records share a
layout, anything else record by record."""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence

import numpy as np

from components.errors import GnnflowError
from components.tfrecord.framing import _frame


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
Wanted = Mapping[bytes, tuple[str, int]]  # key -> ("i" int64 | "f" float | "b" one bytes value, width: values or bytes)


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
            kind: str = ""
            items: Items = []
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
    if want == "b":
        if any(w != 2 for w, _, _ in items):
            raise _WireError("malformed bytes_list")
        return np.frombuffer(buf, np.uint8, items[0][2] - items[0][1], items[0][1]) if items else np.zeros(0, np.uint8)
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
        raise GnnflowError(f"{source}: record {index}: feature {key.decode()!r} is a {names[kind]}, expected {names[want]}")
    if want == "b" and count != (1 if width else 0):  # a value of no bytes is written as none
        raise GnnflowError(f"{source}: record {index}: feature {key.decode()!r} has {count} bytes values, expected 1")
    if count != width and want != "b":
        raise GnnflowError(f"{source}: record {index}: feature {key.decode()!r} has {count} values, expected {width}")


def _check_bytes(source: str, index: int, key: bytes, width: int, size: int) -> None:
    if size != width:
        raise GnnflowError(f"{source}: record {index}: feature {key.decode()!r} holds {size} bytes, expected {width}")


def _decode_one(buf: bytes, index: int, source: str, wanted: Wanted, out: dict[bytes, np.ndarray]) -> None:
    """General path: any valid Example, map entries in any order, lists packed or not."""
    found = _parse(buf, index, source, wanted)
    for key, (want, width) in wanted.items():
        kind, items = found[key]
        if kind not in ("", want):
            _check(source, index, key, want, width, kind, len(items))  # raises unless empty
        if want == "b":
            _check(source, index, key, want, width, kind, len(items))
        try:
            values = _values(buf, want, items)
        except _WireError as exc:
            raise GnnflowError(f"{source}: record {index} is not a valid tf.train.Example ({exc})") from None
        if want == "b":
            _check_bytes(source, index, key, width, len(values))
        else:
            _check(source, index, key, want, width, kind, len(values))
        out[key][index] = values


def _template(buf: bytes, index: int, source: str, wanted: Wanted) -> list[tuple[bytes, int, int, list[int]]] | None:
    """Payload position of each key in one record: [(key, start, end, varint byte lengths)];
    None when a key's list is not one packed field (the general path then decodes it)."""
    found = _parse(buf, index, source, wanted)
    layout: list[tuple[bytes, int, int, list[int]]] = []
    for key, (want, width) in wanted.items():
        kind, items = found[key]
        if len(items) > 1 or (items and items[0][0] != 2) or kind not in ("", want):
            return None
        s, e = items[0][1:] if items else (0, 0)
        if want == "b":
            _check(source, index, key, want, width, kind, len(items))
            _check_bytes(source, index, key, width, e - s)
            layout.append((key, s, e, []))
            continue
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


def _decode_block(mat: np.ndarray, index: np.ndarray, wanted: Wanted, source: str, out: dict[bytes, np.ndarray]) -> np.ndarray:
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
        for _, s, e, lens in layout:
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
            elif wanted[key][0] == "b":
                out[key][rows] = sub[:, s:e]
            elif lens:
                shifts = np.concatenate([np.arange(0, 7 * ln, 7, dtype=np.uint64) for ln in lens])
                bits = (compact[:, at[s] : at[s] + e - s] & 0x7F).astype(np.uint64) << shifts
                out[key][rows] = np.bitwise_or.reduceat(bits, np.cumsum([0] + lens[:-1]), axis=1).view(np.int64)
        rest = rest[~ok]
    return rest


def _decode_into(records: Sequence[bytes], index: np.ndarray, wanted: Wanted, source: str, out: dict[bytes, np.ndarray]) -> None:
    """Decode records[i] into row index[i] (increasing) of `out`, by blocks of one length where possible."""
    lengths = np.fromiter(map(len, records), np.int64, len(records))
    order = np.argsort(lengths, kind="stable")
    for rows in np.split(order, np.flatnonzero(np.diff(lengths[order])) + 1):
        if len(rows) >= _FAST_MIN:
            mat = np.frombuffer(b"".join([records[i] for i in rows]), np.uint8).reshape(len(rows), lengths[rows[0]])
            rows = rows[_decode_block(mat, index[rows], wanted, source, out)]
        for i in rows:
            _decode_one(records[i], int(index[i]), source, wanted, out)


_OUT_DTYPES = {"i": np.int64, "f": np.float32, "b": np.uint8}


def _outputs(int64_keys: Mapping[str, int], float_keys: Mapping[str, int], bytes_keys: Mapping[str, int], n: int) -> tuple[Wanted, dict]:
    wanted = {k.encode(): ("i", w) for k, w in int64_keys.items()} | {k.encode(): ("f", w) for k, w in float_keys.items()}
    wanted |= {k.encode(): ("b", w) for k, w in bytes_keys.items()}
    return wanted, {k: np.zeros((n, w), _OUT_DTYPES[t]) for k, (t, w) in wanted.items()}


def _result(out: dict[bytes, np.ndarray]) -> dict[str, np.ndarray]:
    return {k.decode(): (v[:, 0] if v.shape[1] == 1 else v) for k, v in out.items()}


def decode_examples(
    records: Sequence[bytes],
    int64_keys: Mapping[str, int],
    float_keys: Mapping[str, int],
    *,
    bytes_keys: Mapping[str, int] | None = None,
    source: str = "records",
) -> dict[str, np.ndarray]:
    """Parse serialized `tf.train.Example`s into arrays.

    Args:
        records: n serialized Examples (e.g. from `iter_records`).
        int64_keys / float_keys: name -> width; every record must hold exactly `width`
            values of that kind under that name (other keys are ignored).
        bytes_keys: name -> bytes; every record must hold exactly one bytes value of that many
            bytes under that name (what `encode_examples` writes for its bytes features).
        source: names the records in error messages.

    Returns:
        name -> int64 array (n,) for width 1 else (n, width) for int64 keys, float32 likewise,
        uint8 (n, bytes) for bytes keys (view them as their stored dtype).

    Raises:
        GnnflowError: naming the record and key on a missing key, wrong width, wrong kind
            or malformed proto; a bytes value of another size than expected (e.g. cut short).
    """
    wanted, out = _outputs(int64_keys, float_keys, bytes_keys or {}, len(records))
    _decode_into(records, np.arange(len(records)), wanted, source, out)
    return _result(out)


def decode_tfrecord_file(
    data: bytes | bytearray | memoryview,
    int64_keys: Mapping[str, int],
    float_keys: Mapping[str, int],
    *,
    bytes_keys: Mapping[str, int] | None = None,
    source: str,
    verify_crc: bool = True,
) -> dict[str, np.ndarray]:
    """Parse a whole TFRecord file's bytes into arrays, in file order: what
    `decode_examples(list(iter_records(...)), ...)` returns, without a bytes object per record.
    Runs of equal-length records (what `encode_examples` writes) decode straight from strided
    views of `data` (copied once unless it is `bytes`); anything else takes the general path.
    Raises GnnflowError as `iter_records` (source, record index, byte offset) and `decode_examples` do.
    """
    raw = data if isinstance(data, bytes) else bytes(data)
    buf = np.frombuffer(raw, np.uint8)
    runs = _frame(raw, buf, source, verify_crc)
    wanted, out = _outputs(int64_keys, float_keys, bytes_keys or {}, sum(count for _, _, count in runs))
    left, first = [], 0  # left: records for the general path, as (data offsets, data length, record numbers)
    for pos, length, count in runs:
        index = np.arange(first, first + count)
        rest = (
            _decode_block(
                buf[pos : pos + count * (length + 16)].reshape(count, length + 16)[:, 12 : 12 + length], index, wanted, source, out
            )
            if count >= _FAST_MIN
            else index - first
        )
        if len(rest):
            left.append((pos + 12 + rest * (length + 16), length, index[rest]))
        first += count
    if left:
        records = [raw[p : p + length] for starts, length, _ in left for p in starts.tolist()]
        _decode_into(records, np.concatenate([index for _, _, index in left]), wanted, source, out)
    return _result(out)
