"""Encoding float32 feature rows into their stored type, and decoding stored rows back.

Partition encodes each decoded shard as it reads it (so no worker holds a float32 table it
does not keep); GLT holds and sends the stored rows; the model decodes a batch's rows just
before its first layer; exact inference, full-graph training and serving decode the same rows
with the same code, so every path reads the same numbers.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Protocol

import numpy as np
import torch

from components.feature_storage.quantization import INT8_HIGH, INT8_LOW, STORAGE_TYPES, Int8Quantization

log = logging.getLogger("gnnflow.features")

_DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16, "int8": torch.int8}
_FLOAT16_MAX = float(torch.finfo(torch.float16).max)


class StoredType(Protocol):
    """What a node or edge type of the graph schema says about its stored features."""

    @property
    def feature_dim(self) -> int: ...

    @property
    def feature_storage(self) -> str: ...

    @property
    def feature_quantization(self) -> dict | None: ...


@dataclass(frozen=True)
class FeatureCodec:
    """How one node or edge type's feature rows are stored (``int8`` carries its quantization)."""

    storage: str = "float32"
    quantization: Int8Quantization | None = None

    @property
    def dtype(self) -> torch.dtype:
        return _DTYPES[self.storage]

    @property
    def value_bytes(self) -> int:
        """Bytes of one stored feature value."""
        return self.dtype.itemsize

    def encode(self, x: torch.Tensor) -> tuple[torch.Tensor, int]:
        """(n, d) float rows → ((n, d) rows of :attr:`dtype`, values clipped).

        A value is clipped when the stored type cannot come within half a step of it: outside
        an int8 column's fitted range by more than ``scale / 2``, or beyond float16's largest
        finite number. Clipped values take the nearest stored value; nothing wraps around.
        """
        if self.storage == "float32":
            return x.to(torch.float32), 0
        if self.storage == "bfloat16":
            return x.to(torch.bfloat16), 0
        if self.storage == "float16":
            over = x.abs() > _FLOAT16_MAX
            clipped = int(over.sum())
            return (x.clamp(-_FLOAT16_MAX, _FLOAT16_MAX) if clipped else x).to(torch.float16), clipped
        scale, zero_point = self._params(x.device)
        t = x.to(torch.float32) / scale + zero_point
        clipped = int(((t < INT8_LOW - 0.5) | (t > INT8_HIGH + 0.5)).sum())
        return t.round_().clamp_(INT8_LOW, INT8_HIGH).to(torch.int8), clipped

    def decode(self, stored: torch.Tensor) -> torch.Tensor:
        """(n, d) stored rows → (n, d) float32 (a no-op on float32 rows)."""
        if self.storage != "int8":
            return stored.to(torch.float32)
        if stored.dtype != torch.int8:
            raise TypeError(f"int8 features decoded from a {stored.dtype} tensor")
        scale, zero_point = self._params(stored.device)
        return (stored.to(torch.float32) - zero_point) * scale

    def round_trip(self, x: torch.Tensor) -> torch.Tensor:
        """(n, d) float rows as a reader of the stored rows sees them: decode(encode(x))."""
        return self.decode(self.encode(x)[0])

    def decode_array(self, stored: np.ndarray) -> np.ndarray:
        """(n, d) stored rows as numpy (bfloat16 as its raw uint16 bits) → (n, d) float32."""
        rows = torch.from_numpy(np.ascontiguousarray(stored))
        if self.storage == "bfloat16" and rows.dtype != torch.bfloat16:
            rows = rows.view(torch.bfloat16)
        return self.decode(rows).numpy()

    def _params(self, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        assert self.quantization is not None, "an int8 codec carries its quantization"
        cached = _PARAMS.get((id(self), device))
        if cached is None:
            scale = torch.tensor(self.quantization.scale, dtype=torch.float32, device=device)
            zero_point = torch.tensor(self.quantization.zero_point, dtype=torch.float32, device=device)
            cached = _PARAMS[(id(self), device)] = (self, scale, zero_point)
        return cached[1], cached[2]


# (codec id, device) → (the codec, kept alive so its id is not reused; scale; zero point)
_PARAMS: dict[tuple[int, torch.device], tuple[FeatureCodec, torch.Tensor, torch.Tensor]] = {}
FLOAT32 = FeatureCodec()


def codec_of(stored: StoredType, source: str = "graph schema") -> FeatureCodec:
    """The codec of a schema node or edge type (a featureless type, or one from an older
    schema without the fields, is float32). ``source`` names the schema in errors."""
    storage = stored.feature_storage
    if storage not in STORAGE_TYPES:
        from components.errors import GnnflowError

        raise GnnflowError(f"{source}: feature_storage {storage!r} is not one of {list(STORAGE_TYPES)}")
    if storage == "float32" or stored.feature_dim == 0:
        return FLOAT32
    if storage != "int8":
        return FeatureCodec(storage)
    return FeatureCodec("int8", Int8Quantization.from_json(stored.feature_quantization or {}, stored.feature_dim, source))


def log_clipped(clipped: int, what: str) -> None:
    """Tells the user how many feature values their stored type could not hold."""
    if clipped:
        log.warning(
            "%s: %d feature value(s) outside the stored type's range were clipped to its nearest value "
            "(int8: the range fitted in preprocess; reusing a model's fitted state keeps its range)",
            what,
            clipped,
        )
