"""GLT distributed loaders for one worker: node seeds or edge seeds, collocated or in subprocesses."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from components.config import TrainingSpec
from components.launcher import WorkerContext
from components.partition.dataset import edge_type_tuple
from components.train import glt_compat


@dataclass(frozen=True)
class SamplingSetup:
    """How this worker's loaders sample: direction, fan-outs, and where sampling runs."""

    ctx: WorkerContext
    training: TrainingSpec
    edge_dir: str  # "out" when partitions hold edges by source, else "in"

    def worker_options(self, loader_index: int):
        import graphlearn_torch as glt

        if self.training.sampling == "collocated":
            return glt.distributed.CollocatedDistSamplingWorkerOptions(
                master_addr=self.ctx.master_addr, master_port=self.ctx.rpc_port, rpc_timeout=180
            )
        # Each multiprocess loader's sampling subprocesses form their own RPC group: one port
        # per loader, offset from the worker group's ports so every rank derives the same one.
        return glt.distributed.MpDistSamplingWorkerOptions(
            num_workers=self.training.sampling_workers,
            worker_concurrency=1,
            master_addr=self.ctx.master_addr,
            master_port=self.ctx.rpc_port + 1 + loader_index,
            channel_size="256MB",
            pin_memory=False,
            rpc_timeout=180,
        )


def node_loader(setup: SamplingSetup, dataset, seeds: torch.Tensor | tuple[str, torch.Tensor], *, batch_size: int,
                shuffle: bool, loader_index: int, fan_outs: list[int] | None = None):
    """Mini-batches of the sampled neighbourhoods of ``seeds`` (global ids owned by this worker)."""
    import graphlearn_torch as glt

    glt_compat.install()

    return glt.distributed.DistNeighborLoader(
        dataset, fan_outs or setup.training.fan_outs, seeds, batch_size=batch_size, shuffle=shuffle,
        collect_features=True, edge_dir=setup.edge_dir, random_seed=setup.training.seed + setup.ctx.rank,
        worker_options=setup.worker_options(loader_index),
    )


def link_loader(setup: SamplingSetup, dataset, edge_type: str | None, pairs: torch.Tensor, *, shuffle: bool, loader_index: int):
    """Mini-batches of positive ``pairs`` (2, m) plus sampled negative pairs, labelled 1 / 0."""
    import graphlearn_torch as glt

    glt_compat.install()

    seeds = (edge_type_tuple(edge_type), pairs) if edge_type else pairs
    return glt.distributed.DistLinkNeighborLoader(
        dataset, setup.training.fan_outs, batch_size=setup.training.batch_size, edge_label_index=seeds,
        neg_sampling=glt.sampler.NegativeSampling("binary", setup.training.negative_ratio), shuffle=shuffle,
        collect_features=True, edge_dir=setup.edge_dir, random_seed=setup.training.seed + setup.ctx.rank,
        worker_options=setup.worker_options(loader_index),
    )
