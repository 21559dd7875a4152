"""int8's per-column affine quantization, fitted from each column's value range.

A column with values in ``[low, high]`` is stored as ``q = round(x / scale + zero_point)``,
clipped to ``[-128, 127]``, and read back as ``(q - zero_point) * scale``, with
``scale = (high - low) / 255`` and ``zero_point = -128 - low / scale``: ``low`` is stored as -128,
``high`` as 127, and any value in between comes back within ``scale / 2``. ``zero_point`` is a
real number (not rounded to an integer), so both ends of the range are exact.

The ranges are those of the *transformed* feature values (what the model reads), fitted in
preprocess and kept in its fitted state: an inference-only run that reuses a model's state
reuses its quantization too, and values outside the fitted range are clipped, never wrapped.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, get_args

import numpy as np

from components.errors import GnnflowError

StorageType = Literal["float32", "float16", "bfloat16", "int8"]
STORAGE_TYPES: tuple[str, ...] = get_args(StorageType)
INT8_LOW, INT8_HIGH = -128, 127
_LEVELS = INT8_HIGH - INT8_LOW  # 255 steps between the lowest and the highest code


@dataclass(frozen=True)
class Int8Quantization:
    """Per-column ``scale`` (> 0) and ``zero_point`` (the real-valued code of 0), each (d,)."""

    scale: tuple[float, ...]
    zero_point: tuple[float, ...]

    def to_json(self) -> dict[str, list[float]]:
        return {"scale": list(self.scale), "zero_point": list(self.zero_point)}

    @staticmethod
    def from_json(raw: dict, width: int, source: str) -> Int8Quantization:
        try:
            scale, zero_point = [float(v) for v in raw["scale"]], [float(v) for v in raw["zero_point"]]
        except (KeyError, TypeError, ValueError) as exc:
            raise GnnflowError(f"{source}: feature_quantization is not {{scale: [...], zero_point: [...]}} ({exc})") from None
        if len(scale) != width or len(zero_point) != width:
            raise GnnflowError(
                f"{source}: feature_quantization has {len(scale)} scales and {len(zero_point)} zero points for {width} features"
            )
        if not all(np.isfinite(scale)) or min(scale, default=1.0) <= 0 or not all(np.isfinite(zero_point)):
            raise GnnflowError(f"{source}: feature_quantization needs finite positive scales and finite zero points")
        return Int8Quantization(tuple(scale), tuple(zero_point))


def fit_int8(low: np.ndarray, high: np.ndarray) -> Int8Quantization:
    """The quantization of columns whose values lie in ``[low, high]`` (each (d,) float).

    A constant column (``low == high``) gets scale 1 and stores its one value exactly; a column
    with no values (an empty type: ``low`` > ``high`` or not finite) is taken as the range [0, 0].
    """
    low, high = np.asarray(low, dtype=np.float64), np.asarray(high, dtype=np.float64)
    empty = ~(np.isfinite(low) & np.isfinite(high) & (low <= high))
    low, high = np.where(empty, 0.0, low), np.where(empty, 0.0, high)
    scale = (high - low) / _LEVELS
    scale = np.where((scale > 0) & np.isfinite(scale), scale, 1.0)
    zero_point = INT8_LOW - low / scale
    return Int8Quantization(tuple(scale.tolist()), tuple(zero_point.tolist()))


def storage_fields(storage: str, ranges: tuple[np.ndarray, np.ndarray] | None, width: int, what: str) -> dict:
    """The schema fields of a node or edge type stored as ``storage``, with ``width`` features
    whose transformed values lie in ``ranges`` ((low, high), each (width,); None: unknown).

    ``what`` names the config key in errors (``graph.nodes['paper'].feature_storage``).
    """
    if storage not in STORAGE_TYPES:
        raise GnnflowError(f"{what}: {storage!r} is not one of {list(STORAGE_TYPES)}")
    if storage != "int8" or width == 0:
        return {"feature_storage": storage if width else "float32", "feature_quantization": None}
    if ranges is None:
        raise GnnflowError(
            f"{what}: int8 needs the value range of every feature column, which this fitted state (made by an older "
            "gnnflow) does not record: refit the transforms, or store these features as float32, float16 or bfloat16"
        )
    return {"feature_storage": storage, "feature_quantization": fit_int8(*ranges).to_json()}
