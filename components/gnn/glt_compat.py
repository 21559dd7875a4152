"""Fixes for GLT 0.2.4's distributed sampling, applied in each process before it samples.

1. ``DistNeighborSampler._sample_one_hop`` answers an empty set of sources with a bare tensor
   instead of a ``NeighborOutput``, and the caller then fails on ``output.nbr``. Sources run out
   whenever a hop finds no node the batch has not seen yet: a batch that already holds its whole
   neighbourhood (every batch of a one-partition graph smaller than the batch size, or seeds
   whose neighbours are all seeds too). The caller already stops at a hop with no neighbours, so
   an empty ``NeighborOutput`` is the answer it expects. Multiprocess loaders run their samplers
   in subprocesses that GLT spawns itself; those get the fix when they unpickle their worker
   options (see ``_options_with_fixes``).
2. A multiprocess loader starts its sampling subprocesses behind a ``multiprocessing.Barrier``
   that GLT drops as soon as the trainer passes it. Dropping it frees the barrier's shared
   counters, and the next shared value the trainer allocates (the next loader's) reuses their
   memory: a subprocess that had not yet woken then reads "not released", waits forever, and
   the trainer waits for its batches. ``start_barriers_kept`` and ``keep_with`` keep each such
   barrier as long as its loader.
3. Link sampling over an edge type within one node type of a heterogeneous graph (paper cites
   paper beside paper has_word word) passes its output through ``format_hetero_sampler_output``,
   which sorts each type's node list (``unique()``) without renumbering the sampled edges or
   the labelled pairs that point into it: every batch's subgraph and positives then name the
   wrong nodes (ROC-AUC stays at 0.5). The replacement keeps the sampler's order (seeds first)
   and, should a list hold a node twice, keeps its first place and renumbers the edges.
4. A multiprocess loader's shared-memory channel holds ``num_workers * worker_concurrency``
   messages; with one subprocess and concurrency 1 that is one message, and the channel never
   delivers. This one needs no patch: ``sampling.py`` sets ``channel_capacity`` itself
   (``CHANNEL_BATCHES_PER_SUBPROCESS``).
5. GLT's CPU sampler draws neighbours with replacement, with no option to turn it off:
   ``distinct_sampling`` replaces the one-hop draw, local and served over RPC, with a seeded
   draw without replacement (``training.replace: false``). Sampling subprocesses learn the
   choice from their worker options (``REPLACE_OPTION``).
6. Homogeneous node sampling fails on a batch whose seeds have no neighbour at all (see
   ``_seeds_only_when_no_neighbours``).
7. A multiprocess loader spawns each sampling subprocess as a fresh interpreter, which imports
   torch, PyG and GLT again: a worker with three loaders of two subprocesses spent 44 s starting
   them before its first batch of a 2-second run (the demo test graph, 2 workers, 2 cores).
   ``sampling_context`` gives GLT a fork server of the worker's own instead, which imports them
   once; each subprocess is forked from it and gets its arguments pickled as under spawn.
8. Feature lookups gather rows with a slow kernel and stitch local and remote rows even when
   all are local (``feature_lookup``).

Fixes 1, 3, 5, 6, 7 and 8 replace private functions of GLT, so :func:`install` refuses any GLT release
but the one they were written against.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch

from components.gnn import distinct_sampling, feature_lookup
from components.runtime.rendezvous import ignore_rpc_backend_warning

_INSTALLED = False
GLT_VERSION = "0.2.4"  # the release whose private functions the fixes replace
REPLACE_OPTION = "gnnflow_replace"  # worker-options attribute: training.replace for a sampling subprocess


def check_version(installed: str | None = None) -> None:
    """An error naming both versions when the installed GLT is not the one the fixes fit."""
    from importlib.metadata import PackageNotFoundError, version

    from components.errors import GnnflowError

    if installed is None:
        try:
            installed = version("graphlearn-torch")
        except PackageNotFoundError:
            installed = "none"
    if installed != GLT_VERSION:
        raise GnnflowError(
            f"graphlearn-torch {installed} is installed, but gnnflow's GLT fixes (components/gnn/glt_compat.py) "
            f"replace private functions of {GLT_VERSION}: install graphlearn-torch=={GLT_VERSION} (requirements/lock.txt)"
        )


def install() -> None:
    """Idempotent: patches this process's GLT (fixes 1, 3 and 5) and how it hands worker options to the
    sampling subprocesses it spawns, so that they patch theirs."""
    global _INSTALLED
    if _INSTALLED:
        return
    check_version()
    from multiprocessing.reduction import ForkingPickler

    from graphlearn_torch.distributed import MpDistSamplingWorkerOptions
    from graphlearn_torch.distributed.dist_neighbor_sampler import DistNeighborSampler
    from graphlearn_torch.sampler import NeighborOutput

    sample_one_hop = DistNeighborSampler._sample_one_hop

    async def sample_one_hop_or_nothing(self, srcs: torch.Tensor, num_nbr: int, etype):  # noqa: ANN001, ANN202
        if srcs.numel() == 0:
            empty = torch.empty(0, dtype=torch.int64, device=srcs.device)  # on the sampler's device (CPU or GPU)
            return NeighborOutput(nbr=empty, nbr_num=empty, edge=empty if self.with_edge else None)
        return await sample_one_hop(self, srcs, num_nbr, etype)

    DistNeighborSampler._sample_one_hop = sample_one_hop_or_nothing
    DistNeighborSampler._sample_from_nodes = _seeds_only_when_no_neighbours(DistNeighborSampler._sample_from_nodes)
    import graphlearn_torch.distributed.dist_neighbor_sampler as dist_sampler_module
    import graphlearn_torch.sampler.neighbor_sampler as sampler_module

    dist_sampler_module.format_hetero_sampler_output = format_in_sampled_order
    sampler_module.format_hetero_sampler_output = format_in_sampled_order
    distinct_sampling.install()  # fix 5, around fix 1's _sample_one_hop
    feature_lookup.install()  # fix 8
    ForkingPickler.register(MpDistSamplingWorkerOptions, lambda options: (_options_with_fixes, (options.__dict__,)))
    import graphlearn_torch.distributed.dist_sampling_producer as producer_module

    producer_module.mp = _SamplingMultiprocessing(producer_module.mp)  # fix 7
    _INSTALLED = True


# What the sampling fork server imports once (fix 7): what a sampling subprocess runs on.
SAMPLING_PRELOAD = ("torch", "torch_geometric", "graphlearn_torch", "components.gnn.glt_compat")


def sampling_context():  # noqa: ANN201  # a multiprocessing context
    """The context GLT starts sampling subprocesses from (fix 7): a fork server of this process's,
    which imports ``SAMPLING_PRELOAD`` before it forks any of them."""
    import torch.multiprocessing as mp

    context = mp.get_context("forkserver")
    context.set_forkserver_preload(list(SAMPLING_PRELOAD))
    return context


class _SamplingMultiprocessing:
    """GLT's producer module's ``torch.multiprocessing``, whose 'spawn' context is :func:`sampling_context`."""

    def __init__(self, wrapped) -> None:  # noqa: ANN001
        self._wrapped = wrapped

    def get_context(self, method: str | None = None):  # noqa: ANN201
        return sampling_context() if method == "spawn" else self._wrapped.get_context(method)

    def __getattr__(self, name: str):  # noqa: ANN204
        return getattr(self._wrapped, name)


def _seeds_only_when_no_neighbours(glt_sample_from_nodes):  # noqa: ANN001, ANN202
    """Fix 6: GLT's homogeneous node sampling stops at the first hop without neighbours, then
    concatenates the edges of the hops before it: none when no seed of the batch has a
    neighbour (a batch of isolated nodes), and ``torch.cat`` fails on the empty list. Such a
    batch is its seeds alone, with no edges."""
    from graphlearn_torch.sampler import SamplerOutput

    async def sample_from_nodes(self, inputs):  # noqa: ANN001, ANN202
        try:
            return await glt_sample_from_nodes(self, inputs)
        except RuntimeError as error:
            if "expected a non-empty list of Tensors" not in str(error) or self.dist_graph.data_cls == "hetero":
                raise
        seeds = self.sampler.create_inducer(self.max_input_size).init_node(inputs.node.to(self.device))
        empty = torch.empty(0, dtype=torch.int64, device=seeds.device)
        return SamplerOutput(
            node=seeds,
            row=empty,
            col=empty,
            edge=empty if self.with_edge else None,
            batch=seeds,
            num_sampled_nodes=[seeds.size(0)],
            num_sampled_edges=[],
            metadata={},
        )

    return sample_from_nodes


def format_in_sampled_order(sample, edge_dir: str = "out"):
    """Fix 3: GLT's ``format_hetero_sampler_output`` without reordering the node lists that the
    sample's edges (``row``/``col``, positions in ``node``) and labelled pairs index into."""
    from graphlearn_torch.typing import reverse_edge_type

    for node_type, nodes in sample.node.items():
        unique, inverse = nodes.unique(return_inverse=True)
        if len(unique) == len(nodes):
            continue
        positions = torch.arange(len(nodes), device=nodes.device)
        first = torch.full((len(unique),), len(nodes), dtype=torch.int64, device=nodes.device).scatter_reduce(0, inverse, positions, "amin")
        order = torch.argsort(first)
        place = torch.empty_like(order)
        place[order] = torch.arange(len(order), device=nodes.device)
        renumber = place[inverse]  # old position → position in the de-duplicated list
        sample.node[node_type] = unique[order]
        for edge_type in list(sample.row):
            if edge_type[0] == node_type:
                sample.row[edge_type] = renumber[sample.row[edge_type]]
            if edge_type[-1] == node_type:
                sample.col[edge_type] = renumber[sample.col[edge_type]]
    if sample.edge_types is not None and edge_dir == "out":
        sample.edge_types = [reverse_edge_type(e) if e[0] != e[-1] else e for e in sample.edge_types]
    return sample


def _options_with_fixes(state: dict):
    """Unpickles worker options in a GLT sampling subprocess, installing the fixes first and
    setting its draw (fix 5): the subprocess unpickles its arguments before it builds its sampler
    and before it starts RPC, whose start-up warning of torch's it silences."""
    install()
    ignore_rpc_backend_warning()
    distinct_sampling.set_replacement(bool(state.get(REPLACE_OPTION, False)))
    distinct_sampling.use_batch_keys()
    from graphlearn_torch.distributed import MpDistSamplingWorkerOptions

    options = MpDistSamplingWorkerOptions.__new__(MpDistSamplingWorkerOptions)
    options.__dict__.update(state)
    return options


@contextlib.contextmanager
def start_barriers_kept() -> Iterator[list]:
    """While GLT builds a loader, every barrier it makes from its sampling context is put in the
    yielded list (fix 2); keep the list as long as the loader (``keep_with``)."""
    spawn = sampling_context()  # the process-wide context object GLT's producer asks for (fix 7)
    make = spawn.Barrier
    kept: list = []

    def barrier(*args, **kwargs):
        made = make(*args, **kwargs)
        kept.append(made)
        return made

    spawn.Barrier = barrier  # restored in the finally below
    try:
        yield kept
    finally:
        del spawn.Barrier  # back to the class's method


def keep_with(loader, kept: list):
    """``loader``, holding ``kept`` for its lifetime; dropping the shut-down loader frees them
    (and their semaphores) cleanly, before a worker's hard exit could leave them to the tracker."""
    loader.gnnflow_start_barriers = kept
    return loader
