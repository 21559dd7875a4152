"""TFRecord framing: uint64 LE length, masked crc32c of those 8 bytes (uint32 LE), data,
masked crc32c of data (uint32 LE); and the varints the Example wire format uses."""

from __future__ import annotations

import struct
from collections.abc import Iterator
from typing import BinaryIO

import google_crc32c
import numpy as np

from components.errors import GnnflowError

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
        if verify_crc and struct.unpack_from("<I", raw, pos + 8)[0] != _masked_crc(raw[pos : pos + 8]):
            raise GnnflowError(f"{source}: corrupt length crc at record {index} (byte offset {pos})")
        stride, count, step = length + 16, 1, 64
        most = (size - pos) // stride  # complete records left if all had this length
        if not most:
            raise GnnflowError(
                f"{source}: truncated TFRecord at record {index} (byte offset {pos}): "
                f"{length + 4} bytes of data and crc expected, {size - pos - 12} present"
            )
        while count < most and raw[pos + count * stride : pos + count * stride + 12] == raw[pos : pos + 12]:
            end = min(most, count + step)
            block = buf[pos + count * stride : pos + end * stride].reshape(end - count, stride)[:, :12]
            differ = np.flatnonzero((block != buf[pos : pos + 12]).any(axis=1))
            count, step = (count + int(differ[0])) if differ.size else end, step * 2
        stop = pos + count * stride
        if verify_crc:
            data = map(raw.__getitem__, map(slice, range(pos + 12, stop, stride), range(pos + 12 + length, stop, stride)))
            crc = np.fromiter(map(google_crc32c.value, data), np.uint32, count)
            masked = ((crc >> np.uint32(15)) | (crc << np.uint32(17))) + np.uint32(_MASK_DELTA)
            if (bad := np.flatnonzero(masked != buf[pos:stop].reshape(count, stride)[:, -4:].view("<u4")[:, 0])).size:
                raise GnnflowError(f"{source}: corrupt data crc at record {index + int(bad[0])} (byte offset {pos + int(bad[0]) * stride})")
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
        yield from (raw[p : p + length] for p in range(pos + 12, pos + count * (length + 16), length + 16))
