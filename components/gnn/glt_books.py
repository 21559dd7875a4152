"""The range partition books as GLT ``PartitionBook``s (imported only where GLT is).

GLT 0.2.4's own ``RangePartitionBook`` refuses empty ranges, which a partition legitimately has
for a small node type spread over many workers; this one allows them.
"""

from __future__ import annotations

import torch
from graphlearn_torch.partition import PartitionBook
from graphlearn_torch.partition.partition_book import OffsetId2Index


class RangeBook(PartitionBook):
    """Owner of id ``i``: the partition whose range ``[ends[p-1], ends[p])`` holds it."""

    def __init__(self, ends: torch.Tensor, partition_idx: int) -> None:
        self.ends = ends.to(torch.int64)
        self.partition_idx = partition_idx
        self._offset = int(self.ends[partition_idx - 1]) if partition_idx else 0

    def __getitem__(self, ids: torch.Tensor) -> torch.Tensor:
        return torch.searchsorted(self.ends, ids, right=True)

    @property
    def device(self) -> torch.device:
        return self.ends.device

    @property
    def offset(self) -> int:
        """First id of this partition."""
        return self._offset

    @property
    def id2index(self) -> OffsetId2Index:
        """Row in this partition's tensors of one of its own ids."""
        return OffsetId2Index(self._offset)


class LocalBook(PartitionBook):
    """A feature book for a worker that holds a type's whole table: every id is answered here."""

    def __init__(self, partition_idx: int) -> None:
        self.partition_idx = partition_idx

    def __getitem__(self, ids: torch.Tensor) -> torch.Tensor:
        return torch.full(ids.shape, self.partition_idx, dtype=torch.int64, device=ids.device)

    @property
    def device(self) -> torch.device:
        return torch.device("cpu")
