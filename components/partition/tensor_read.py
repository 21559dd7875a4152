"""Safetensors files read straight into the tensors that keep them, checked as they stream.

``safetensors.torch.load`` needs the whole file as bytes and then copies every tensor out of
them: twice a file's size for a moment, and a third copy when GLT later moves a tensor into
shared memory. Here the header is parsed by hand and each tensor's bytes are read, a chunk at a
time, into a tensor allocated where it will stay (ordinary or shared memory), or into one row of
a 2-D tensor only; the bytes of what is not wanted are hashed and dropped. The stream is the
published output's checked stream (:meth:`~components.storage.PublishedOutput.open_read`),
which hashes every chunk and raises the manifest's damaged-file error before the last one is
handed over, so no tensor of a damaged file is ever returned, and no second copy of the file
is needed to check it.
"""

from __future__ import annotations

import json
import math
import struct
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Protocol

import torch

from components.errors import GnnflowError
from components.runtime.shared_tensors import empty_tensor
from components.storage import DamagedFile

CHUNK_BYTES = 16 * 2**20  # what a read hands over at once: the only transient buffer
_HEADER_LIMIT = 100 * 2**20  # safetensors' own limit on the JSON header


class Stream(Protocol):
    """A binary stream in file order (a published output's checked stream)."""

    def read(self, size: int = -1, /) -> bytes: ...

    def readinto(self, buffer: memoryview, /) -> int | None: ...


DTYPES = {
    "F64": torch.float64,
    "F32": torch.float32,
    "F16": torch.float16,
    "BF16": torch.bfloat16,
    "I64": torch.int64,
    "I32": torch.int32,
    "I16": torch.int16,
    "I8": torch.int8,
    "U8": torch.uint8,
    "BOOL": torch.bool,
}


@dataclass(frozen=True)
class Slot:
    """Where one tensor's bytes lie in a safetensors file's data section."""

    dtype: torch.dtype
    shape: tuple[int, ...]
    start: int
    end: int

    def row_bytes(self) -> int:
        """Bytes of one row (first dimension) of a tensor with at least one dimension."""
        return math.prod(self.shape[1:]) * self.dtype.itemsize


@dataclass(frozen=True)
class Want:
    """How a wanted tensor is kept: in shared memory or not, whole or one row of its first
    dimension (``row``: a 2-D ``edge_index``'s destinations, without its sources)."""

    shared: bool = False
    row: int | None = None


WHOLE = Want()
SHARED = Want(shared=True)


def header_entries(header: dict, source: str) -> dict[str, tuple[str, tuple[int, ...], int, int]]:
    """Each tensor a parsed safetensors header describes: (dtype name, shape, start, end) of its
    bytes in the data section, checked to fill exactly that range (every reader of partition
    files, the memory-mapping one of serving included, parses headers here)."""
    entries = {}
    for name, entry in header.items():
        if name == "__metadata__":
            continue
        dtype = DTYPES.get(entry["dtype"])
        if dtype is None:
            raise GnnflowError(f"{source}: tensor {name!r} has dtype {entry['dtype']}, which gnnflow does not read")
        shape = tuple(int(d) for d in entry["shape"])
        start, end = (int(x) for x in entry["data_offsets"])
        if end - start != math.prod(shape) * dtype.itemsize:
            raise GnnflowError(f"{source}: tensor {name!r} of shape {list(shape)} does not fill its {end - start} bytes")
        entries[name] = (entry["dtype"], shape, start, end)
    return entries


def _parse_header(raw: bytes, source: str) -> dict[str, Slot]:
    """The tensors a header describes, checked to tile the data section (no overlaps or holes)."""
    slots = {
        name: Slot(DTYPES[dtype], shape, start, end) for name, (dtype, shape, start, end) in header_entries(json.loads(raw), source).items()
    }
    position = 0
    for name, slot in sorted(slots.items(), key=lambda item: item[1].start):
        if slot.start != position:
            raise GnnflowError(f"{source}: tensor {name!r} starts at byte {slot.start} of the data, expected {position}")
        position = slot.end
    return slots


def read_header(stream: Stream, source: str) -> tuple[dict[str, Slot], int]:
    """The tensors of the file ``stream`` is at the start of, and the data section's size as the
    header implies it. A header that cannot be parsed is reported after the rest of the stream
    has been read through its check: a damaged file gets the damaged-file error, not this one."""
    try:
        (length,) = struct.unpack("<Q", _read_exactly(stream, 8, source))
        if length > _HEADER_LIMIT:
            raise ValueError(f"a header of {length} bytes")
        slots = _parse_header(_read_exactly(stream, length, source), source)
    except DamagedFile:
        raise
    except (ValueError, KeyError, TypeError, AttributeError, struct.error) as exc:
        _drain(stream)
        raise GnnflowError(f"{source} is not a safetensors file gnnflow can read ({exc}): re-run partition") from exc
    except GnnflowError:
        _drain(stream)
        raise
    return slots, max((s.end for s in slots.values()), default=0)


def read_tensors(stream: Stream, source: str, want: Mapping[str, Want | None] | None = None) -> dict[str, torch.Tensor]:
    """The tensors of a safetensors file, as :func:`read_data` keeps them."""
    slots, _ = read_header(stream, source)
    return read_data(stream, source, slots, want or {})


def read_data(
    stream: Stream, source: str, slots: Mapping[str, Slot], want: Mapping[str, Want | None], default: Want | None = WHOLE
) -> dict[str, torch.Tensor]:
    """The data section after :func:`read_header`: each tensor kept as ``want`` says (None: its
    bytes are read only to be checked; a name ``want`` lacks: as ``default`` says), then the
    stream to its end: a checked stream raises there when the file is damaged."""
    out: dict[str, torch.Tensor] = {}
    position = 0
    for name, slot in sorted(slots.items(), key=lambda item: item[1].start):
        how = want.get(name, default)
        if how is None:
            continue
        if how.row is None:
            tensor = empty_tensor(slot.shape, slot.dtype, shared=how.shared)
            begin = slot.start
        else:
            if len(slot.shape) < 1 or not 0 <= how.row < slot.shape[0]:
                raise GnnflowError(f"{source}: tensor {name!r} of shape {list(slot.shape)} has no row {how.row}")
            tensor = empty_tensor(slot.shape[1:], slot.dtype, shared=how.shared)
            begin = slot.start + how.row * slot.row_bytes()
        _skip(stream, begin - position, source)
        _read_into(stream, tensor, source)
        position = begin + tensor.nbytes
        out[name] = tensor
    _drain(stream)
    return out


def _bytes_of(tensor: torch.Tensor) -> memoryview:
    """A writable byte view of a contiguous tensor's memory (any dtype, bfloat16 and bool too)."""
    return memoryview(tensor.reshape(-1).view(torch.uint8).numpy()).cast("B")


def _read_into(stream: Stream, tensor: torch.Tensor, source: str) -> None:
    if tensor.nbytes == 0:
        return
    view = _bytes_of(tensor)
    done = 0
    while done < len(view):
        got = stream.readinto(view[done : done + CHUNK_BYTES])
        if not got:
            raise GnnflowError(f"{source} ends inside its tensor data (after {done} of {len(view)} bytes): re-run partition")
        done += got


def _skip(stream: Stream, count: int, source: str) -> None:
    """Reads ``count`` bytes only for the stream's check."""
    while count > 0:
        got = stream.read(min(count, CHUNK_BYTES))
        if not got:
            raise GnnflowError(f"{source} ends inside its tensor data: re-run partition")
        count -= len(got)


def _drain(stream: Stream) -> None:
    """Reads the rest, so that a checked stream reaches its verdict."""
    while stream.read(CHUNK_BYTES):
        pass


def _read_exactly(stream: Stream, count: int, source: str) -> bytes:
    data = stream.read(count)
    if len(data) != count:
        raise ValueError(f"it ends after {len(data)} of {count} header bytes")
    return data
