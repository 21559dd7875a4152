"""Range partition books: partition ``p`` owns the contiguous id range ``[offset_p, offset_p + n_p)``
of every node type (and of every stored edge type), so a node's owner is a binary search over
P range ends, never an O(N) array on every worker.

Partitioning renumbers: a node's *partition id* is its owner's offset plus its rank among the
owner's nodes ordered by *source id* (the id preprocess gave it). :class:`IdDirectory` turns
source ids into partition ids across workers, each worker holding 1/P of the pairs.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from components.runtime.collectives import exchange, request

_DIRECTORY_SALT = 0x5EED_D1EC


def range_ends(counts: Sequence[int]) -> torch.Tensor:
    """(P,) int64 exclusive end of each partition's range, from its count."""
    return torch.cumsum(torch.tensor(list(counts), dtype=torch.int64), 0)


def range_offset(counts: Sequence[int], index: int) -> int:
    """First id of partition ``index``."""
    return int(sum(counts[:index]))


def range_owner(ids: torch.Tensor, ends: torch.Tensor) -> torch.Tensor:
    """(k,) int64 partition of each id in ``ids`` (k,), given the range ends (P,)."""
    return torch.searchsorted(ends, ids.to(torch.int64), right=True)


def hash_owner(ids: torch.Tensor, num_partitions: int, seed: int) -> torch.Tensor:
    """(k,) int64 partition of each id by a seeded splitmix64 hash: a pure function of the id."""
    with np.errstate(over="ignore"):
        z = ids.numpy().astype(np.uint64) + np.uint64((seed * 0x9E3779B97F4A7C15 + 1) % 2**64)
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        z = z ^ (z >> np.uint64(31))
    return torch.from_numpy((z % np.uint64(num_partitions)).astype(np.int64))


class IdDirectory:
    """A distributed map from source id to partition id for one node type.

    Worker ``w`` keeps the pairs whose source id hashes to ``w`` (sorted by source id), so each
    holds about 1/P of them; :meth:`lookup` asks the right worker for each id. Both are
    collective: every worker calls them, with its own ids.
    """

    def __init__(self, source_ids: torch.Tensor, partition_ids: torch.Tensor, world_size: int) -> None:
        self.world_size = world_size
        held = exchange({"source": source_ids, "partition": partition_ids}, self._home(source_ids), world_size)
        order = torch.argsort(held["source"])
        self._source, self._partition = held["source"][order], held["partition"][order]

    def _home(self, ids: torch.Tensor) -> torch.Tensor:
        return hash_owner(ids, self.world_size, _DIRECTORY_SALT)

    def _answer(self, asked: torch.Tensor) -> torch.Tensor:
        if not len(self._source):
            return torch.full((len(asked),), -1, dtype=torch.int64)
        at = torch.searchsorted(self._source, asked).clamp(max=len(self._source) - 1)
        return torch.where(self._source[at] == asked, self._partition[at], torch.full_like(asked, -1))

    def lookup(self, source_ids: torch.Tensor) -> torch.Tensor:
        """(k,) partition ids of ``source_ids`` (k,); -1 where an id is no node (no worker raises
        alone: a peer would be left waiting in the collective)."""
        return request(source_ids.to(torch.int64), self._home(source_ids), self.world_size, self._answer)
