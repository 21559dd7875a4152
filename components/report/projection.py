"""A 2-D principal-component projection of embeddings, with numpy's SVD alone."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Projection:
    """coordinates: (m, 2) positions; explained: the share of the sample's variance along each axis."""

    coordinates: np.ndarray
    explained: tuple[float, float]


def pca_2d(embeddings: np.ndarray) -> Projection:
    """(m, hidden) → the first two principal components of the centred rows.

    Each axis's sign is fixed (its largest loading is positive) so the same embeddings always
    give the same picture. Fewer than two dimensions of variance leave the missing axes at 0.
    """
    x = np.asarray(embeddings, dtype=np.float64)
    m = len(x)
    coordinates = np.zeros((m, 2))
    if m == 0 or x.ndim != 2 or x.shape[1] == 0:
        return Projection(coordinates, (0.0, 0.0))
    centred = x - x.mean(axis=0)
    _, singular, components = np.linalg.svd(centred, full_matrices=False)
    k = min(2, len(singular))
    axes = components[:k]
    signs = np.sign(axes[np.arange(k), np.abs(axes).argmax(axis=1)])
    axes = axes * np.where(signs == 0, 1.0, signs)[:, None]
    coordinates[:, :k] = centred @ axes.T
    variance = singular**2
    total = float(variance.sum())
    shares = [float(v / total) if total > 0 else 0.0 for v in variance[:k]] + [0.0] * (2 - k)
    return Projection(coordinates, (shares[0], shares[1]))
