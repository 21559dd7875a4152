"""Tensors of a safetensors file as read-only ``np.memmap`` views, and ``.npy`` files built once.

A safetensors file is an 8-byte little-endian header length, a JSON header (per tensor: dtype,
shape, data_offsets relative to the end of the header) and the raw little-endian data. Mapping
a tensor maps exactly its byte range: pages are read when touched, and they count towards the
page cache, not towards the process's anonymous memory.
"""

from __future__ import annotations

import json
import os
import struct
from collections.abc import Callable

import numpy as np

from components.errors import GnnflowError
from components.partition.output import header_entries

_DTYPES = {
    "F64": np.float64,
    "F32": np.float32,
    "F16": np.float16,
    "BF16": np.uint16,  # numpy has no bfloat16: its raw bits (components.feature_storage decodes them)
    "I64": np.int64,
    "I32": np.int32,
    "I16": np.int16,
    "I8": np.int8,
    "U8": np.uint8,
    "BOOL": np.bool_,
}


def map_safetensors(path: str) -> dict[str, np.ndarray]:
    """Every tensor of the file at ``path``, name → read-only memmap (an empty tensor: an empty array)."""
    with open(path, "rb") as handle:
        head = handle.read(8)
        if len(head) != 8:
            raise GnnflowError(f"{path} is not a safetensors file: it is shorter than its 8-byte header length")
        (length,) = struct.unpack("<Q", head)
        try:
            header = json.loads(handle.read(length))
        except ValueError as exc:
            raise GnnflowError(f"{path} is not a safetensors file: its header is not JSON ({exc})") from None
    base = 8 + length
    tensors: dict[str, np.ndarray] = {}
    for name, (dtype_name, shape, start, end) in header_entries(header, path).items():
        dtype = _DTYPES[dtype_name]
        if end == start:
            tensors[name] = np.zeros(shape, dtype=dtype)
        else:
            tensors[name] = np.memmap(path, dtype=dtype, mode="r", offset=base + start, shape=shape)
    return tensors


def built_npy(path: str, build: Callable[[], np.ndarray]) -> np.ndarray:
    """The array saved at ``path``, memory-mapped; built (and saved atomically) the first time."""
    if not os.path.exists(path):
        array = build()
        partial = f"{path}.partial.npy"
        np.save(partial, np.ascontiguousarray(array))
        del array
        os.replace(partial, path)
    return np.load(path, mmap_mode="r")
