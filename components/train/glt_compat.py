"""A fix for GLT 0.2.4's distributed sampler, applied in each process before it samples.

``DistNeighborSampler._sample_one_hop`` answers an empty set of sources with a bare tensor
instead of a ``NeighborOutput``, and the caller then fails on ``output.nbr``. Sources run out
whenever a hop finds no node the batch has not seen yet: a batch that already holds its whole
neighbourhood (every batch of a one-partition graph smaller than the batch size, or seeds whose
neighbours are all seeds too). The caller already stops at a hop with no neighbours, so an empty
``NeighborOutput`` is the answer it expects.
"""

from __future__ import annotations

import torch

_INSTALLED = False


def install() -> None:
    """Idempotent; sampling subprocesses that GLT spawns itself (multiprocess mode) are not covered."""
    global _INSTALLED
    if _INSTALLED:
        return
    from graphlearn_torch.distributed.dist_neighbor_sampler import DistNeighborSampler
    from graphlearn_torch.sampler import NeighborOutput

    sample_one_hop = DistNeighborSampler._sample_one_hop

    async def sample_one_hop_or_nothing(self, srcs: torch.Tensor, num_nbr: int, etype):  # noqa: ANN001, ANN202
        if srcs.numel() == 0:
            empty = torch.empty(0, dtype=torch.int64)
            return NeighborOutput(nbr=empty, nbr_num=empty, edge=empty if self.with_edge else None)
        return await sample_one_hop(self, srcs, num_nbr, etype)

    DistNeighborSampler._sample_one_hop = sample_one_hop_or_nothing
    _INSTALLED = True
