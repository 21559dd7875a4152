"""Columns that a compressed storage type cannot hold: why ``feature_storage`` defaults to float32.

    .venv/bin/python benchmarks/feature_storage_columns.py

Two planted single-column problems (20,000 rows, 80% train / 20% validation): the class is in

* ``heavy_tail``: a log-normal count (class 1's median 1.8x class 0's) with five outliers at 1e5,
  as raw counts passed through unscaled;
* ``year``: the years 2000-2024 passed through, the class being "2013 or later".

Each column is stored with each type (FeatureCodec round trip; int8 fitted on the column's
min/max as preprocess fits it), and the best threshold on the training rows is scored on the
validation rows. int8 spreads 256 levels over min..max, so a few outliers leave the bulk of a
heavy-tailed column in one or two levels; bfloat16 keeps 8 significant bits, so neighbouring
years share a value. float32 holds both.
"""

from __future__ import annotations

import pathlib
import sys

import numpy as np
import torch

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

from components.feature_storage.codec import FeatureCodec  # noqa: E402
from components.feature_storage.quantization import Int8Quantization  # noqa: E402

ROWS = 20_000


def planted_columns(seed: int = 0) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    rng = np.random.default_rng(seed)
    label = rng.integers(0, 2, ROWS)
    counts = rng.lognormal(mean=np.where(label == 1, 0.6, 0.0), sigma=1.0)
    counts[rng.choice(ROWS, 5, replace=False)] = 1e5
    year = 2000 + rng.integers(0, 25, ROWS)
    return {"heavy_tail": (counts, label), "year": (year.astype(np.float64), (year >= 2013).astype(np.int64))}


def threshold_accuracy(values: np.ndarray, labels: np.ndarray) -> float:
    """Validation accuracy of the best ``value >= t`` rule on the training rows."""
    train = np.arange(len(values)) < 0.8 * len(values)
    candidates = np.unique(values[train])
    if len(candidates) > 400:
        candidates = np.quantile(values[train], np.linspace(0.01, 0.99, 199))
    best = max(candidates, key=lambda t: float(((values[train] >= t) == labels[train]).mean()))
    return float(((values[~train] >= best) == labels[~train]).mean())


def stored(values: np.ndarray, storage: str) -> np.ndarray:
    column = torch.tensor(values, dtype=torch.float32)[:, None]
    if storage != "int8":
        return FeatureCodec(storage).round_trip(column)[:, 0].double().numpy()
    low, high = float(column.min()), float(column.max())
    scale = (high - low) / 255
    codec = FeatureCodec("int8", Int8Quantization(scale=(scale,), zero_point=(-128 - low / scale,)))
    return codec.round_trip(column)[:, 0].double().numpy()


def main() -> None:
    print("| column | float32 | float16 | bfloat16 | int8 |")
    print("|---|---:|---:|---:|---:|")
    for name, (values, labels) in planted_columns().items():
        scores = [threshold_accuracy(stored(values, s), labels) for s in ("float32", "float16", "bfloat16", "int8")]
        print(f"| {name} | " + " | ".join(f"{a:.3f}" for a in scores) + " |")


if __name__ == "__main__":
    main()
