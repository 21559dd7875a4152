"""Dropout for full-graph passes whose masks depend on node ids, not on which worker holds a node:
1 and N workers drop the same units, so a full-graph run's result does not depend on its world size."""

from __future__ import annotations

import torch
import torch.nn.functional as F

_MIX1, _MIX2, _GOLDEN = 0xBF58476D1CE4E5B9 - (1 << 64), 0x94D049BB133111EB - (1 << 64), 0x9E3779B97F4A7C15 - (1 << 64)


def _shift(z: torch.Tensor, bits: int) -> torch.Tensor:
    """Logical right shift of int64 ``z`` (torch shifts signed integers arithmetically)."""
    return (z >> bits) & ((1 << (64 - bits)) - 1)


def node_uniform(ids: torch.Tensor, width: int, key: int) -> torch.Tensor:
    """(n, width) float32 uniforms in [0, 1), a pure function of (key, node id, column): splitmix64
    of the element's position in the whole graph, wrapping as uint64 arithmetic does."""
    salt = (key * _GOLDEN) % (1 << 64)
    salt = salt - (1 << 64) if salt >= 1 << 63 else salt  # as the int64 torch holds
    z = ids.to(torch.int64).unsqueeze(1) * width + torch.arange(width, dtype=torch.int64) + salt
    z = (z ^ _shift(z, 30)) * _MIX1
    z = (z ^ _shift(z, 27)) * _MIX2
    z = z ^ _shift(z, 31)
    return _shift(z, 40).to(torch.float32) / float(1 << 24)


def node_dropout(h: torch.Tensor, ids: torch.Tensor, p: float, training: bool, key: int | None, layer: int) -> torch.Tensor:
    """(n, d) rows of nodes ``ids`` with dropout ``p`` when ``training``: masks drawn from ``key``
    and ``layer`` per node id, or, without a key, from torch's generator."""
    if not training or p == 0:
        return h
    if key is None:
        return F.dropout(h, p, training=True)
    keep = node_uniform(ids, h.shape[1], key * 1_000_003 + layer) >= p
    return h * keep / (1 - p)
