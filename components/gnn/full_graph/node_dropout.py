"""Dropout for full-graph passes whose masks depend on node ids, not on which worker holds a node:
1 and N workers drop the same units, so a full-graph run's result does not depend on its world size."""

from __future__ import annotations

import torch
import torch.nn.functional as F

_MIX1, _MIX2, _GOLDEN = 0xBF58476D1CE4E5B9 - (1 << 64), 0x94D049BB133111EB - (1 << 64), 0x9E3779B97F4A7C15 - (1 << 64)
_FMIX1, _FMIX2 = 0x85EBCA6B - (1 << 32), 0xC2B2AE35 - (1 << 32)  # murmur3's 32-bit finaliser, as int32
_BITS = 24  # a unit is kept when the low 24 bits of its hash reach p * 2^24


def _shift(z: torch.Tensor, bits: int) -> torch.Tensor:
    """Logical right shift of ``z`` (torch shifts signed integers arithmetically)."""
    return (z >> bits) & ((1 << (z.element_size() * 8 - bits)) - 1)


def _as_int64(value: int) -> int:
    value %= 1 << 64
    return value - (1 << 64) if value >= 1 << 63 else value


def _splitmix32(z: torch.Tensor) -> torch.Tensor:
    """int64 ``z`` → int32: the high half of splitmix64's output (wrapping as uint64 arithmetic does)."""
    z = (z ^ _shift(z, 30)) * _MIX1
    z = (z ^ _shift(z, 27)) * _MIX2
    z = z ^ _shift(z, 31)
    return (z >> 32).to(torch.int32)


def _hashes(ids: torch.Tensor, width: int, key: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(n,) int32 hashes of nodes ``ids`` and (width,) of the columns, salted with ``key``."""
    salt = _as_int64(key * _GOLDEN)
    rows = _splitmix32(ids.to(torch.int64) * 2 + salt)
    columns = _splitmix32(torch.arange(width, dtype=torch.int64) * 2 + 1 + salt)
    return rows, columns


def _kept(z: torch.Tensor, p: float) -> torch.Tensor:
    """bool of the same shape: murmur3's finaliser of the int32 sums ``z`` (overwritten), kept when
    its low 24 bits reach p * 2^24. In place with one scratch tensor: each extra pass over a
    (nodes, columns) int32 tensor cost as much as the arithmetic."""
    scratch = torch.empty_like(z)
    for bits, factor in ((16, _FMIX1), (13, _FMIX2), (16, None)):
        torch.bitwise_right_shift(z, bits, out=scratch)
        scratch &= (1 << (32 - bits)) - 1  # a logical shift: torch shifts int32 arithmetically
        z ^= scratch
        if factor is not None:
            z *= factor
    z &= (1 << _BITS) - 1
    return z >= round(p * (1 << _BITS))


def node_keep(ids: torch.Tensor, width: int, key: int, p: float) -> torch.Tensor:
    """(n, width) bool: which units of nodes ``ids`` dropout with rate ``p`` keeps, a pure function
    of (key, node id, column).

    Each node id and each column is hashed once (splitmix64, n + width values); every unit is then
    murmur3's 32-bit finaliser of its row's and column's hashes added. Hashing every unit with
    splitmix64 in int64 took most of a full-graph epoch on wide inputs (CiteSeer's 3,703 columns);
    the finaliser on int32 is about a quarter of that, with the same keep rate and no correlation
    between rows or columns (tests/test_node_dropout.py).
    """
    rows, columns = _hashes(ids, width, key)
    return _kept(rows.unsqueeze(1) + columns, p)  # int32, wrapping


def node_keep_at(ids: torch.Tensor, rows: torch.Tensor, cols: torch.Tensor, width: int, key: int, p: float) -> torch.Tensor:
    """(e,) bool: :func:`node_keep`'s ``[rows, cols]`` entries alone, for sparse inputs (only the
    units holding a non-zero need a mask: CiteSeer's features are 0.9% non-zero)."""
    row_hash, column_hash = _hashes(ids, width, key)
    return _kept(row_hash[rows] + column_hash[cols], p)


def dropout_key(key: int, layer: int) -> int:
    """The key of layer ``layer``'s masks in a pass drawn with ``key``."""
    return key * 1_000_003 + layer


def node_dropout(h: torch.Tensor, ids: torch.Tensor, p: float, training: bool, key: int | None, layer: int) -> torch.Tensor:
    """(n, d) rows of nodes ``ids`` with dropout ``p`` when ``training``: masks drawn from ``key``
    and ``layer`` per node id, or, without a key, from torch's generator."""
    if not training or p == 0:
        return h
    if key is None:
        return F.dropout(h, p, training=True)
    keep = node_keep(ids, h.shape[1], dropout_key(key, layer), p)
    return h * (keep.to(h.dtype) * (1 / (1 - p)))
