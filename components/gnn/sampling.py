"""GLT distributed loaders for one worker: node seeds or edge seeds, collocated or in subprocesses."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from components.config import GnnflowConfig, TrainingSpec
from components.gnn import distinct_sampling, glt_compat
from components.gnn.build import forward_edge_name, uses_edge_features
from components.gnn.device import CPU_PLACEMENT, Placement
from components.gnn.glt_dataset import edge_type_tuple
from components.gnn.model import EdgeType
from components.gnn.shared_memory import CHANNEL_BYTES
from components.runtime import watchdog
from components.runtime.launcher import WorkerContext
from components.schema import GraphSchema, stored_edge_types

# GLT serves remote sampling requests on its RPC threads, and its samplers draw from one random
# engine per thread (seeded from training.seed). With several threads, which thread serves which
# request, and so which numbers a batch gets, depends on timing; with one, the same config and
# world size sample the same neighbours every run. On the benchmark graph one thread costs no
# measurable speed (benchmarks/RESULTS.md).
RPC_THREADS = 1
CHANNEL_BATCHES_PER_SUBPROCESS = 4


@dataclass(frozen=True)
class SamplingSetup:
    """How this worker's loaders sample: direction, fan-outs, and where sampling runs."""

    ctx: WorkerContext
    training: TrainingSpec
    edge_dir: str  # "out" when partitions hold edges by source, else "in"
    fan_outs: list[int] | dict[EdgeType, list[int]]  # per hop; per stored edge type on heterogeneous graphs
    with_edge: bool = False  # batches carry edge ids and edge features
    placement: Placement = CPU_PLACEMENT  # where sampling runs and batches arrive
    sampling_workers: int = 1  # multiprocess: GLT sampling subprocesses per loader

    @staticmethod
    def of(
        ctx: WorkerContext,
        config: GnnflowConfig,
        schema: GraphSchema,
        edge_dir: str,
        placement: Placement = CPU_PLACEMENT,
        sampling_workers: int = 1,
    ) -> SamplingSetup:
        """The setup for ``schema``'s graph: ``training.fan_outs`` resolved per stored edge type;
        ``sampling_workers``: subprocesses per loader with multiprocess sampling (the thread plan's)."""
        if schema.is_heterogeneous:
            fan_outs: list[int] | dict[EdgeType, list[int]] = {
                edge_type_tuple(name): config.fan_outs_of(forward_edge_name(name)) for name in stored_edge_types(schema)
            }
        else:
            fan_outs = config.fan_outs_of(next(iter(schema.message_edge_types)))
        return SamplingSetup(ctx, config.training, edge_dir, fan_outs, uses_edge_features(schema, config), placement, sampling_workers)

    def worker_options(self):
        """GLT's options for one loader; collective in multiprocess mode (every rank calls it)."""
        import graphlearn_torch as glt

        if self.training.sampling == "collocated":
            return glt.distributed.CollocatedDistSamplingWorkerOptions(
                master_addr=self.ctx.master_addr,
                master_port=self.ctx.rpc_port,
                num_rpc_threads=RPC_THREADS,
                rpc_timeout=self.ctx.timeouts.rpc_s,
            )
        # One batch in flight per subprocess and one RPC thread keep the random draws in a fixed
        # order (see RPC_THREADS); with one subprocess, batches then arrive in a fixed order too.
        options = glt.distributed.MpDistSamplingWorkerOptions(
            num_workers=self.sampling_workers,
            worker_devices=self.placement.sampling_devices(self.sampling_workers),
            worker_concurrency=1,
            master_addr=self.ctx.master_addr,
            master_port=self._port_chosen_by_rank_zero(),
            channel_size=CHANNEL_BYTES,
            pin_memory=self.placement.on_cuda,  # page-locked channel: faster copies to the GPU
            num_rpc_threads=RPC_THREADS,
            rpc_timeout=self.ctx.timeouts.rpc_s,
        )
        # GLT sizes the channel at num_workers * worker_concurrency messages, but its
        # shared-memory queue never delivers with a capacity of 1 (producer and consumer both
        # wait); room for a few finished batches per subprocess also lets sampling run ahead.
        options.channel_capacity = CHANNEL_BATCHES_PER_SUBPROCESS * self.sampling_workers
        setattr(options, glt_compat.REPLACE_OPTION, self.training.replace)  # the subprocesses build the samplers
        return options

    def _port_chosen_by_rank_zero(self) -> int:
        """Each multiprocess loader's sampling subprocesses form an RPC group of their own,
        whose rendezvous runs in rank 0's first subprocess: rank 0 picks a port free on its
        machine now, and every rank gets the same one."""
        port = [0]
        if self.ctx.rank == 0:
            with socket.socket() as sock:
                sock.bind(("", 0))
                port[0] = sock.getsockname()[1]
        dist.broadcast_object_list(port, src=0)
        return int(port[0])


def node_loader(
    setup: SamplingSetup,
    dataset,
    seeds: torch.Tensor | tuple[str, torch.Tensor],
    *,
    batch_size: int,
    shuffle: bool,
    fan_outs: list[int] | dict[EdgeType, list[int]] | None = None,
):
    """Mini-batches of the sampled neighbourhoods of ``seeds`` (global ids owned by this worker)."""
    import graphlearn_torch as glt

    glt_compat.install()

    # Building a loader is collective, and in multiprocess mode starts sampling processes that join an RPC group of their own.
    with watchdog.phase("rendezvous"), glt_compat.start_barriers_kept() as kept, distinct_sampling.replacement(setup.training.replace):
        loader = glt.distributed.DistNeighborLoader(
            dataset,
            fan_outs or setup.fan_outs,
            seeds,
            batch_size=batch_size,
            shuffle=shuffle,
            with_edge=setup.with_edge,
            collect_features=True,
            edge_dir=setup.edge_dir,
            random_seed=setup.training.seed + setup.ctx.rank,
            to_device=setup.placement.device,
            worker_options=setup.worker_options(),
        )
    return glt_compat.keep_with(loader, kept)


def link_loader(
    setup: SamplingSetup,
    dataset,
    edge_type: str | None,
    pairs: torch.Tensor,
    labels: torch.Tensor,
    *,
    shuffle: bool,
    random_negatives: bool,
):
    """Mini-batches of labelled ``pairs`` (2, m) (``labels`` (m,): 1 positive, 0 given negative),
    plus, with ``random_negatives``, ``training.negative_ratio`` random pairs per pair labelled 0."""
    import graphlearn_torch as glt

    glt_compat.install()

    seeds = (edge_type_tuple(edge_type), pairs) if edge_type else pairs
    negatives = glt.sampler.NegativeSampling("binary", setup.training.negative_ratio) if random_negatives else None
    # Building a loader is collective, and in multiprocess mode starts sampling processes that join an RPC group of their own.
    with watchdog.phase("rendezvous"), glt_compat.start_barriers_kept() as kept, distinct_sampling.replacement(setup.training.replace):
        loader = glt.distributed.DistLinkNeighborLoader(
            dataset,
            setup.fan_outs,
            batch_size=setup.training.batch_size,
            edge_label_index=seeds,
            edge_label=labels,
            with_edge=setup.with_edge,
            neg_sampling=negatives,
            shuffle=shuffle,
            collect_features=True,
            edge_dir=setup.edge_dir,
            random_seed=setup.training.seed + setup.ctx.rank,
            to_device=setup.placement.device,
            worker_options=setup.worker_options(),
        )
    return glt_compat.keep_with(loader, kept)


def resumed_iterator(loader, skip: int) -> Iterator[Any]:
    """An epoch of ``loader`` (a GLT ``DistLoader``) without its first ``skip`` batches, which are
    neither sampled nor read: the same seed order as a whole epoch from the same random state,
    so a resumed epoch trains the batches the interrupted one had left. With several sampling
    subprocesses, which of them delivers a batch first is a race: there the skipped batches
    are the first ``skip`` of the order, not necessarily the ones the interrupted run trained."""
    if skip <= 0:
        iter(loader)
    elif loader._is_collocated_worker:
        iter(loader)
        for _ in range(skip):  # indices only: the sampler is not called
            loader._collocated_producer._index_iter._next_data()
    else:
        producer = loader._mp_producer
        whole_order = producer._get_seeds_indexes
        producer._get_seeds_indexes = lambda: _without_first(whole_order(), skip * loader.batch_size, loader.batch_size)
        try:
            iter(loader)
        finally:
            del producer._get_seeds_indexes
    loader._num_recv = max(skip, 0)
    return _next_until_done(loader)


def _without_first(per_worker: list[torch.Tensor], dropped: int, batch_size: int) -> list[torch.Tensor]:
    """GLT's per-subprocess seed indices (consecutive slices of the epoch's order) without the
    order's first ``dropped``, the rest dealt again in whole batches, the last one taking the tail."""
    rest = torch.cat(per_worker)[dropped:]
    batches = -(-len(rest) // batch_size)
    workers = len(per_worker)
    counts = [batches // workers + (1 if w < batches % workers else 0) for w in range(workers)]
    bounds = [0]
    for count in counts:
        bounds.append(min(len(rest), bounds[-1] + count * batch_size))
    bounds[-1] = len(rest)
    return [rest[bounds[w] : bounds[w + 1]].clone().share_memory_() for w in range(workers)]


def _next_until_done(loader) -> Iterator[Any]:
    """The loader's batches without calling ``iter`` again (a GLT loader's ``__iter__`` restarts the epoch)."""
    while True:
        try:
            yield next(loader)
        except StopIteration:
            return


class RemoteCounter:
    """Counts the nodes of sampled batches and those owned by other partitions (whose features
    were fetched over RPC): the locality a partitioning method buys, per epoch."""

    def __init__(self, node_counts: dict[str, list[int]], rank: int, sampled: int = 0, remote: int = 0) -> None:
        from components.partition.output import range_ends

        self.ends = {t: range_ends(c) for t, c in node_counts.items()}
        self.rank = rank
        self.sampled, self.remote = sampled, remote  # so far (a resumed epoch starts from its checkpoint's)

    def add(self, batch) -> None:
        """Counts one GLT batch (a PyG Data or HeteroData of partition ids)."""
        if hasattr(batch, "node_types"):
            pairs = [(t, batch[t].node) for t in batch.node_types if "node" in batch[t]]
        else:
            pairs = [(next(iter(self.ends)), batch.node)]
        for node_type, ids in pairs:
            self.sampled += len(ids)
            self.remote += int((torch.searchsorted(self.ends[node_type], ids.cpu(), right=True) != self.rank).sum())

    def fraction(self) -> float:
        """Remote share of every worker's sampled nodes so far (collective)."""
        totals = torch.tensor([self.sampled, self.remote], dtype=torch.int64)
        if dist.is_initialized():
            dist.all_reduce(totals)
        return float(totals[1]) / max(int(totals[0]), 1)
